"""The body of every launched job: prepare the shared caches once, then run (or resume) one cell.

Whatever the launcher (a local worker process, a Ray task, a Slurm array task), a cell runs
``run_cell(job)``, which is idempotent:

* a cell whose status file says ``finished`` returns at once (resubmitting a grid redoes nothing);
* a cell with a run folder (``run.json``) resumes from its latest checkpoint into the same
  tracking run (``vapo_lab.trainer.run.Run`` with ``resume=``): a requeued Slurm job or a
  resubmitted failed cell continues and ends with the metrics of an uninterrupted run;
* otherwise it starts the run, tagged with the grid id, cell name and config hash, as a child
  of the grid's parent MLflow run.

The status file (``<grid>/status/<key>.json``) records pending / running step k / finished /
failed with the last error line, the host, pid and Slurm job id: ``vapo-lab jobs`` reads it.
``CellJob`` wraps ``run_cell`` as a ``submitit`` checkpointable: on preemption or time limit
Slurm signals the job, submitit requeues it, and the new attempt resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vapo_lab.launch.grid import CellSpec

PENDING, RUNNING, FINISHED, FAILED = "pending", "running", "finished", "failed"


@dataclass
class CellJob:
    """What a launched job needs: the cell, where its grid lives, and how it is tracked."""

    spec: CellSpec
    grid_dir: str  # absolute
    cwd: str  # the submission's working directory (caches under .vapo_cache/ are relative to it)
    experiment: str
    parent_run_id: str | None = None
    tracking: list[str] = field(default_factory=list)  # tracking.* overrides of the submission

    @property
    def run_dir(self) -> Path:
        return Path(self.grid_dir) / "runs" / self.spec.key

    @property
    def status_file(self) -> Path:
        return status_path(Path(self.grid_dir), self.spec.key)


def status_path(grid_dir: Path, key: str) -> Path:
    return grid_dir / "status" / f"{key}.json"


def read_status(grid_dir: Path, key: str) -> dict[str, Any]:
    """Returns a cell's status record ({"state": "pending"} when it never started)."""
    path = status_path(grid_dir, key)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"state": PENDING}


def write_status(grid_dir: Path, key: str, **fields: Any) -> dict[str, Any]:
    """Updates a cell's status record atomically; returns it."""
    record = {**read_status(grid_dir, key), **fields, "updated": time.time()}
    path = status_path(grid_dir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)
    return record


def slurm_job_id() -> str | None:
    """Returns this process's Slurm job id (array jobs: <array id>_<task>), None outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def compose_cell(job: CellJob) -> Any:
    """Returns the composed config of a cell (its own overrides + where it runs and logs)."""
    from vapo_lab.config.compose import compose_config

    s = job.spec
    where = [f"output_dir={Path(job.grid_dir) / 'runs'}", f"run_name={s.key}",
             f"tracking.experiment={job.experiment}", *job.tracking]
    return compose_config(algo=s.algo, drop=s.drop, overrides=[*s.overrides, *where])


def cell_tags(job: CellJob) -> dict[str, str]:
    s = job.spec
    return {"grid_id": s.grid_id, "cell": s.name, "config_hash": s.config_hash, "cell_key": s.key,
            "dropped": ",".join(s.drop) or "none",
            **{f"sweep.{k}": v for k, v in s.sweep.items()}}


def run_cell(job: CellJob) -> dict[str, Any]:
    """Runs (or resumes, or skips when finished) one cell; returns its final status record.

    Raises whatever the run raised, after recording it as ``failed`` with the last error line.
    """
    from vapo_lab.runs.folder import resume_config
    from vapo_lab.trainer.run import Run

    os.chdir(job.cwd)
    grid_dir, key = Path(job.grid_dir), job.spec.key
    status = read_status(grid_dir, key)
    if status.get("state") == FINISHED:
        return status
    attempts = int(status.get("attempts", 0)) + 1
    write_status(grid_dir, key, state=RUNNING, step=status.get("step", 0), attempts=attempts,
                 host=socket.gethostname(), pid=os.getpid(), job_id=slurm_job_id() or status.get("job_id"),
                 error=None)
    log_lines: list[str] = []

    def log(text: str) -> None:
        log_lines.append(text)
        print(f"[{key}] {text}", file=sys.stderr, flush=True)

    try:
        if job.run_dir.is_dir() and not (job.run_dir / "run.json").is_file():
            shutil.rmtree(job.run_dir)  # a start that died before its run existed: nothing to keep
        if (job.run_dir / "run.json").is_file():
            cfg, choices = resume_config(job.run_dir)
        else:
            composed = compose_cell(job)
            cfg, choices = composed.cfg, composed.choices
        total = int(cfg.trainer.total_steps)
        run = Run(cfg, choices, progress=False, log=log, tags=cell_tags(job), parent_run_id=job.parent_run_id,
                  command=f"vapo-lab grid cell {key} (grid {job.spec.grid_id})")
        write_status(grid_dir, key, run_id=run.run_id, run_dir=str(run.run_dir), step=run.step, total=total)

        def on_step(step: int, metrics: dict[str, float]) -> None:
            write_status(grid_dir, key, step=step)

        result = run.run(on_step)
    except BaseException as e:  # noqa: BLE001 - recorded, then re-raised for the launcher
        line = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        write_status(grid_dir, key, state=FAILED, error=line[:500],
                     traceback=traceback.format_exc()[-4000:])
        raise
    return write_status(grid_dir, key, state=FINISHED, step=result.steps, final_eval=result.final_eval,
                        best_eval=result.best_eval, base_eval=result.base_eval,
                        checkpoint=str(result.checkpoint) if result.checkpoint else None)


def prepare(jobs: list[CellJob]) -> list[str]:
    """Builds the caches every cell of a grid shares — base model, reward model, pretrained critic —
    once, before the cells start; returns one line per distinct cache set prepared.

    The caches are keyed by config (``vapo_lab.basemodel``, ``vapo_lab.trainer.critic_init``), not by
    seed: a grid's seeds share them, so only one seed of each cell is prepared. Each preparation
    constructs the cell's ``Run`` with tracking off in a throwaway folder, which builds (or
    finds) exactly what the real run will load.
    """
    if not jobs:
        return []
    os.chdir(jobs[0].cwd)
    done: set[str] = set()
    lines: list[str] = []
    for job in jobs:
        try:
            lines.append(_prepare_one(job, done))
        except Exception as e:  # noqa: BLE001 - that cell fails with the same error when it runs
            last = (str(e).strip().splitlines() or [""])[-1]
            lines.append(f"could not prepare {job.spec.key}: {type(e).__name__}: {last}")
        print(lines[-1], file=sys.stderr, flush=True)
    return [ln for ln in lines if ln]


def _prepare_one(job: CellJob, done: set[str]) -> str:
    from omegaconf import open_dict

    from vapo_lab.trainer.run import Run

    composed = compose_cell(job)
    cfg = composed.cfg
    with open_dict(cfg):
        cfg.seed = 0
    sig = json.dumps({k: str(cfg.get(k)) for k in ("model", "task", "critic", "rollout", "reward", "trainer",
                                                   "algo", "value_pretraining", "gae")}, sort_keys=True)
    if sig in done:
        return ""
    done.add(sig)
    with tempfile.TemporaryDirectory(prefix="vapo-prepare-") as tmp:
        with open_dict(cfg):
            cfg.tracking.backend = "none"
            cfg.output_dir = tmp
            cfg.run_name = "prepare"
        t0 = time.perf_counter()
        Run(cfg, composed.choices, progress=False, log=lambda text: print(text, file=sys.stderr))
    return f"prepared {job.spec.name}: {time.perf_counter() - t0:.0f}s"


class CellJobRunner:
    """``run_cell`` as a submitit checkpointable: requeued on preemption / time limit, then resumed.

    A class (not a function) so that ``submitit`` can call ``checkpoint`` when Slurm signals the
    job; the requeued job calls ``__call__`` again with the same ``CellJob``, and ``run_cell``
    picks the run up from its latest checkpoint.
    """

    def __call__(self, job: CellJob) -> dict[str, Any]:
        return run_cell(job)

    def checkpoint(self, job: CellJob) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(CellJobRunner(), job)
