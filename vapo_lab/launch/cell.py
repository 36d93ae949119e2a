"""The body of every launched job: prepare the shared caches once, then run (or resume) one cell.

Whatever the launcher (a local worker process, a Ray task, a Slurm array task), a cell runs
``run_cell(job)``, which is idempotent:

* a cell whose status file says ``finished`` returns at once (resubmitting a grid redoes nothing);
* a cell with a run folder (``run.json``) resumes from its latest checkpoint into the same
  tracking run (``vapo_lab.trainer.run.Run`` with ``resume=``): a requeued Slurm job or a
  resubmitted failed cell continues and ends with the metrics of an uninterrupted run;
* otherwise it starts the run, tagged with the grid id, cell name and config hash, as a child
  of the grid's parent MLflow run.

Every cell's config was composed once, when the grid was expanded (``CellSpec.config``); a job
only sets where its run is written and logged. Its status file (``vapo_lab.launch.status``)
records how it goes: ``vapo-lab jobs`` reads it. ``CellJobRunner`` wraps ``run_cell`` as a
``submitit`` checkpointable: on preemption or time limit Slurm signals the job, submitit requeues
it, and the new attempt resumes from the last checkpoint.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from vapo_lab.launch.grid import CellSpec
from vapo_lab.launch.liveness import slurm_job_id
from vapo_lab.launch.status import FAILED, FINISHED, RUNNING, read_status, write_status

# the config sections the caches a cell prepares are built from (``_prepare_one``): cells equal in
# these share their base model, reward model and pretrained critic
CACHE_SECTIONS = ("model", "task", "critic", "rollout", "reward", "trainer", "algo", "gae")


@dataclass
class CellJob:
    """What a launched job needs: the cell, where its grid lives, and how it is tracked."""

    spec: CellSpec
    grid_dir: str  # absolute
    cwd: str  # the submission's working directory (caches under .vapo_cache/ are relative to it)
    experiment: str
    parent_run_id: str | None = None

    @property
    def run_dir(self) -> Path:
        return Path(self.grid_dir) / "runs" / self.spec.key


def cell_config(job: CellJob) -> tuple[DictConfig, dict[str, str]]:
    """Returns (a fresh copy of the cell's composed config set to run in its grid's folder and log
    to its grid's experiment, the Hydra group choices it was composed with)."""
    cfg = OmegaConf.create(job.spec.config)
    cfg.output_dir = str(Path(job.grid_dir) / "runs")
    cfg.run_name = job.spec.key
    cfg.tracking.experiment = job.experiment
    return cfg, dict(job.spec.choices)


def cell_tags(job: CellJob) -> dict[str, str]:
    s = job.spec
    return {"grid_id": s.grid_id, "cell": s.name, "config_hash": s.config_hash, "cell_key": s.key,
            "dropped": ",".join(s.drop) or "none",
            **{f"sweep.{k}": v for k, v in s.sweep.items()}}


def run_cell(job: CellJob) -> dict[str, Any]:
    """Runs (or resumes, or skips when finished) one cell; returns its final status record.

    Raises whatever the run raised, after recording it as ``failed`` with the last error line.
    """
    from vapo_lab.launch.signals import sigterm_interrupts
    from vapo_lab.runs.folder import is_run_dir, resume_config
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
    sigterm_interrupts()  # scancel / preemption / `vapo-lab cancel`: stop within a step, marked killed

    def log(text: str) -> None:
        print(f"[{key}] {text}", file=sys.stderr, flush=True)

    try:
        if is_run_dir(job.run_dir):
            cfg, choices = resume_config(job.run_dir)
        else:
            if job.run_dir.is_dir():
                shutil.rmtree(job.run_dir)  # a start that died before its run existed: nothing to keep
            cfg, choices = cell_config(job)
        total = int(cfg.trainer.total_steps)
        run = Run(cfg, choices, progress=None, log=log, tags=cell_tags(job), parent_run_id=job.parent_run_id,
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
    from vapo_lab.trainer.run import Run

    sig = json.dumps({k: job.spec.config[k] for k in CACHE_SECTIONS}, sort_keys=True)
    if sig in done:
        return ""
    done.add(sig)
    cfg, choices = cell_config(job)
    with tempfile.TemporaryDirectory(prefix="vapo-prepare-") as tmp:
        with open_dict(cfg):
            cfg.seed = 0
            cfg.tracking.backend = "none"
            cfg.output_dir = tmp
            cfg.run_name = "prepare"
        t0 = time.perf_counter()
        Run(cfg, choices, progress=None, log=lambda text: print(text, file=sys.stderr))
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
