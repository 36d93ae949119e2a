"""The body of every launched job: prepare the shared caches once, then run (or resume) one cell.

Whatever the launcher (a local worker process, a Ray task, a Slurm array task), a cell runs
``run_cell(job)``, which is idempotent: a finished cell returns at once, a cell with a run folder
resumes from its latest checkpoint into the same tracking run, any other starts its run as a child
of the grid's parent MLflow run. The cell's config was composed once, when the grid was expanded
(``CellSpec.config``); a job only sets where its run is written and logged, and records how it
goes in the cell's status file (``vapo_lab.launch.status``). ``CellJobRunner`` wraps ``run_cell``
as a ``submitit`` checkpointable, so that a preempted Slurm job is requeued and resumes.

A many-rank cell (``trainer.strategy=fsdp`` over more than one rank) is one SPMD run: every rank
runs ``run_cell``; global rank 0 alone writes the status file, and a rank that fails leaves its
error line beside it (``<key>.rank<r>.error``), so that the cell fails with that rank's message.
docs/grids.md has the user's view: resubmission, preemption, many-rank cells.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from vapo_lab.launch.grid import CellSpec
from vapo_lab.launch.liveness import slurm_job_id
from vapo_lab.launch.status import FAILED, FINISHED, RUNNING, read_status, status_path, write_status
from vapo_lab.locks import exclusive

# the config sections the caches a cell prepares are built from (``_prepare_one``): cells equal in
# these share their base model, reward model and pretrained critic
CACHE_SECTIONS = ("model", "task", "critic", "rollout", "reward", "trainer", "algo", "gae")
# the torch.distributed variables a rank reads (vapo_lab.distributed.world.init_world)
TORCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def cell_ranks(config: dict[str, Any]) -> tuple[int, int]:
    """Returns (nodes, ranks per node) of a cell's composed config: (1, 1) for one process
    (trainer.strategy=single), else (trainer.nodes, trainer.nproc_per_node)."""
    t = config.get("trainer", {})
    if t.get("strategy", "single") != "fsdp":
        return 1, 1
    return int(t.get("nodes", 1)), int(t.get("nproc_per_node", 1))


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

    @property
    def ranks(self) -> tuple[int, int]:
        """(nodes, ranks per node) of the cell's run; see ``cell_ranks``."""
        return cell_ranks(self.spec.config)

    @property
    def world_size(self) -> int:
        nodes, per_node = self.ranks
        return nodes * per_node

    def to_json(self) -> str:
        """Returns the job as JSON (for the ranks of a local many-rank cell: ``ranks --cell``)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CellJob:
        d = json.loads(text)
        return cls(**{**d, "spec": CellSpec(**d["spec"])})


def cell_rank() -> int:
    """Returns this process's global rank in its cell's run: ``RANK`` as torchrun or Slurm's tasks
    (``join_slurm_ranks``) set it, 0 for a one-process cell."""
    return int(os.environ.get("RANK") or 0)


def writes_status() -> bool:
    """True in the process that writes its cell's status file: the only process of a one-process
    cell, global rank 0 of a many-rank one (one writer keeps the record whole)."""
    return cell_rank() == 0


def rank_error_path(grid_dir: Path, key: str, rank: int) -> Path:
    """Returns where rank ``rank`` of cell ``key`` leaves the error line it failed with."""
    return status_path(grid_dir, key).with_name(f"{key}.rank{rank}.error")


def first_rank_error(grid_dir: Path, key: str) -> str | None:
    """Returns the error line of the rank of cell ``key`` that failed first (its file written
    first), None when no other rank failed; removes the files it read."""
    files = sorted(
        status_path(grid_dir, key).parent.glob(f"{key}.rank*.error"),
        key=lambda p: p.stat().st_mtime,
    )
    first = files[0].read_text().strip() if files else None
    for f in files:
        f.unlink(missing_ok=True)
    return first or None


def join_slurm_ranks() -> None:
    """Sets this Slurm task's torch.distributed variables (``TORCH_ENV``) from its job's
    environment, as torchrun does: each task of a multi-task job is one rank.

    ``CUDA_VISIBLE_DEVICES`` is left alone: every task sees its node's GPUs and ``init_world``
    picks ``cuda:{LOCAL_RANK}``.
    """
    import submitit

    # sbatch exports the submitting shell's environment: a RANK or MASTER_PORT found there belongs
    # to some other launch (a MASTER_PORT shared by every cell of a node would collide). Without
    # one, submitit derives the port from the job id: the same on every task of the job.
    for name in TORCH_ENV:
        os.environ.pop(name, None)
    submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)


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
    return {
        "grid_id": s.grid_id,
        "cell": s.name,
        "config_hash": s.config_hash,
        "cell_key": s.key,
        "dropped": ",".join(s.drop) or "none",
        **{f"sweep.{k}": v for k, v in s.sweep.items()},
    }


def run_cell(
    job: CellJob,
    save_within: float | None = None,
    deadline: float | None = None,
    overdue: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Runs (or resumes, or skips when finished) one cell; returns its final status record.

    The process that writes the cell's status holds ``status/<key>.lock`` while it runs: a second
    job of the same cell (two submissions from machines that do not share locks) is refused in one
    line naming the first, leaving its status and folder alone.

    ``save_within`` (seconds, a Slurm job's): SIGUSR2 saves a checkpoint at the next safe point
    after a step and stops the run (``vapo_lab.stop``), its status left running for the requeue;
    ``overdue`` is called if no such point came in time. ``deadline`` (``time.time()``): the run
    saves and stops at the first safe point whose next step and save would not fit before it.

    In a many-rank cell every rank calls this (see the module docstring); rank 0 writes the status
    file, the other ranks return ``{"state": "finished", "rank": r}`` when they are done.

    Raises whatever the run raised, after recording it as ``failed`` with the last error line (of
    the rank that failed first).

    Raises:
        Busy: another process runs the cell.
    """
    stops = (save_within, deadline, overdue)
    if not writes_status():
        return _run_cell(job, stops)
    lock = status_path(Path(job.grid_dir), job.spec.key).with_suffix(".lock")
    with exclusive(lock, f"cell {job.spec.key}", "it runs there; nothing was started here"):
        return _run_cell(job, stops)


def _run_cell(job: CellJob, stops: tuple[Any, ...]) -> dict[str, Any]:
    """``run_cell``'s run, under its lock in the process that writes the status."""
    from vapo_lab.runs.folder import is_run_dir, resume_config
    from vapo_lab.stop import SAVE_SIGNAL, StopRequested, sigterm_interrupts
    from vapo_lab.trainer.trainer import running

    os.chdir(job.cwd)
    grid_dir, key = Path(job.grid_dir), job.spec.key
    rank, writer = cell_rank(), writes_status()
    status = read_status(grid_dir, key)
    if status.get("state") == FINISHED:
        return status
    if writer:
        # an earlier attempt's
        for stale in status_path(grid_dir, key).parent.glob(f"{key}.rank*.error"):
            stale.unlink(missing_ok=True)
        attempts = int(status.get("attempts", 0)) + 1
        write_status(
            grid_dir,
            key,
            state=RUNNING,
            step=status.get("step", 0),
            attempts=attempts,
            host=socket.gethostname(),
            pid=os.getpid(),
            job_id=slurm_job_id() or status.get("job_id"),
            error=None,
            traceback=None,
            tracking=None,
        )
    # scancel / preemption / `vapo-lab cancel`: stop within a step, marked killed
    sigterm_interrupts(*stops)

    def log(text: str) -> None:
        if writer:  # the ranks of a cell share its log: one copy of each line
            print(f"[{key}] {text}", file=sys.stderr, flush=True)
            if text.startswith("tracking"):  # the submission's console shows it (Submission)
                write_status(grid_dir, key, tracking=text[:400])

    try:
        if is_run_dir(job.run_dir):
            cfg, choices = resume_config(job.run_dir)
        else:
            if writer and job.run_dir.is_dir():
                # a start that died before its run existed: nothing to keep. No other rank can
                # have made the folder yet: rank 0 makes it in Trainer, after every rank joined
                shutil.rmtree(job.run_dir, ignore_errors=True)
            cfg, choices = cell_config(job)
        total = int(cfg.trainer.total_steps)
        command = f"vapo-lab grid cell {key} (grid {job.spec.grid_id})"
        tags = cell_tags(job)
        with running(
            cfg, choices, log=log, tags=tags, parent_run_id=job.parent_run_id, command=command
        ) as trainer:
            if writer:
                where = {"run_id": trainer.run_id, "run_dir": str(trainer.run_dir)}
                write_status(grid_dir, key, **where, step=trainer.step, total=total)

            def on_step(step: int, metrics: dict[str, float]) -> None:
                if writer:
                    write_status(grid_dir, key, step=step)

            result = trainer.train(on_step)
    except StopRequested as e:
        if e.signum != SAVE_SIGNAL:
            _record_failure(job, e, rank, writer)
            raise
        if writer:  # the job is about to be requeued: the cell goes on from where it stopped
            write_status(grid_dir, key, state=RUNNING, error=None, requeued=str(e))
        raise
    except BaseException as e:  # noqa: BLE001 - recorded, then re-raised for the launcher
        _record_failure(job, e, rank, writer)
        raise
    if not writer:
        return {"state": FINISHED, "rank": rank, "step": result.steps}
    return write_status(
        grid_dir,
        key,
        state=FINISHED,
        step=result.steps,
        final_eval=result.final_eval,
        best_eval=result.best_eval,
        base_eval=result.base_eval,
        checkpoint=str(result.checkpoint) if result.checkpoint else None,
    )


def _record_failure(job: CellJob, e: BaseException, rank: int, writer: bool) -> None:
    """Records the cell's failure: its status (rank 0) or this rank's error file."""
    grid_dir, key = Path(job.grid_dir), job.spec.key
    line = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    if job.world_size > 1:
        line = f"rank {rank}: {line}"
    if writer:
        # a rank that failed first (its error file written before this rank saw the run break)
        write_status(
            grid_dir,
            key,
            state=FAILED,
            error=(first_rank_error(grid_dir, key) or line)[:500],
            traceback=traceback.format_exc()[-4000:],
        )
    else:
        path = rank_error_path(grid_dir, key, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line[:500] + "\n")


def prepare(jobs: list[CellJob], critic: bool = True) -> list[str]:
    """Builds the caches every cell of a grid shares (base model, reward model, pretrained critic)
    once, before the cells start; returns one line per distinct cache set prepared.

    The caches are keyed by config, not by seed, so one seed of each cell is prepared, on one
    process (``trainer.caches.prepare_caches``). A many-rank cell's critic caches are keyed by its
    rank count and built by its own ranks when it runs; its preparation builds the base model only.
    ``critic=False``: base models only for every cell (Slurm's prepare job, which has a time limit
    and no requeue: the cells build the critic's start, resumable, one build a key).
    """
    if not jobs:
        return []
    os.chdir(jobs[0].cwd)
    done: set[str] = set()
    lines: list[str] = []
    for job in jobs:
        try:
            lines.append(_prepare_one(job, done, critic))
        except Exception as e:  # noqa: BLE001 - that cell fails with the same error when it runs
            last = (str(e).strip().splitlines() or [""])[-1]
            lines.append(f"could not prepare {job.spec.key}: {type(e).__name__}: {last}")
        print(lines[-1], file=sys.stderr, flush=True)
    return [ln for ln in lines if ln]


def _prepare_one(job: CellJob, done: set[str], critic: bool = True) -> str:
    from vapo_lab.config.schema import typed

    sections = {k: job.spec.config[k] for k in CACHE_SECTIONS}
    sig = json.dumps(sections, sort_keys=True)
    if sig in done:
        return ""
    done.add(sig)
    cfg, _ = cell_config(job)
    nodes, per_node = cell_ranks(job.spec.config)
    log = lambda text: print(text, file=sys.stderr)  # noqa: E731
    t0 = time.perf_counter()
    if nodes * per_node > 1 or not critic:
        ranks = nodes * per_node
        if cfg.model.name != "tiny":
            return (
                f"prepared {job.spec.name}: nothing "
                f"(a checkpoint; its {ranks} ranks build the rest)"
            )
        from vapo_lab.basemodel.build import build_base_for

        config = typed(cfg)
        build_base_for(config.model, config.task, None, log=log, threads=config.trainer.threads)
        seconds = time.perf_counter() - t0
        who = (
            f"its {ranks} ranks build the critic caches together"
            if ranks > 1
            else ("the cell builds its critic caches when it runs")
        )
        return f"prepared {job.spec.name}: base model, {seconds:.0f}s ({who})"
    from vapo_lab.trainer.caches import prepare_caches

    with open_dict(cfg):
        cfg.trainer.update({"strategy": "single", "nodes": 1, "nproc_per_node": 1})
        cfg.seed = 0
    prepare_caches(typed(cfg), log)
    return f"prepared {job.spec.name}: {time.perf_counter() - t0:.0f}s"


# a save at Slurm's time-limit signal may take this share of the warning (signal_delay_s); past it
# the job requeues from its last checkpoint, as without the save, leaving the rest for the requeue
SAVE_SHARE = 0.75
# how long a rank waits, after the save, for the requeue to end the job
REQUEUE_WAIT_S = 120.0


class CellJobRunner:
    """``run_cell`` as a submitit checkpointable: requeued on preemption / time limit, then resumed.

    A class, so that ``submitit`` can call ``checkpoint`` when Slurm signals the job; the requeued
    job calls ``__call__`` again and ``run_cell`` resumes from the latest checkpoint. In a
    multi-task job each task is one rank, which ``__call__`` first joins to the others.

    With ``signal_delay_s`` (Slurm's warning before the time limit), the warning (SIGUSR2) stops
    the run at its next safe point after a step, every rank saving a checkpoint there, then rank 0
    asks submitit to requeue: a requeued job always resumes past where the last one started.
    """

    def __init__(self, signal_delay_s: float | None = None) -> None:
        self.signal_delay_s = signal_delay_s

    def __call__(self, job: CellJob) -> dict[str, Any]:
        from vapo_lab.stop import SAVE_SIGNAL, StopRequested

        if job.world_size > 1:
            join_slurm_ranks()
        within = None if self.signal_delay_s is None else SAVE_SHARE * self.signal_delay_s
        # rank 0 alone knows the deadline: the ranks agree on a stop at every safe point
        deadline = job_deadline() if cell_rank() == 0 else None
        if deadline is not None:
            left = deadline - time.time()
            print(
                f"the job's time limit is {left:.0f} s away (squeue)", file=sys.stderr, flush=True
            )
        try:
            return run_cell(job, within, deadline, _requeue_from_thread)
        except StopRequested as stop:
            if stop.signum != SAVE_SIGNAL:
                raise
            _requeue()
            raise

    def checkpoint(self, job: CellJob) -> Any:
        """Returns the same job for submitit to requeue; saves nothing itself.

        submitit calls this on global rank 0 only, so a save here (a collective over the sharded
        model) would hang: the save happens at the run's next safe point (``__call__``), or, where
        this is called without one, the requeued job resumes from the last checkpoint.
        docs/grids.md, "Preemption of a many-rank cell", has the detail.
        """
        import submitit

        return submitit.helpers.DelayedSubmission(CellJobRunner(self.signal_delay_s), job)


def job_deadline() -> float | None:
    """Returns when this Slurm job reaches its time limit (``time.time()``), as ``squeue`` tells
    its time left; None outside a job, or where squeue does not say (no limit)."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    left = slurm_seconds(out.stdout.strip()) if out.returncode == 0 else None
    return None if left is None else time.time() + left


def slurm_seconds(text: str) -> float | None:
    """Returns the seconds of a Slurm duration ("[days-][hours:]minutes:seconds", or a count of
    minutes); None for "UNLIMITED", "NOT_SET" or anything else."""
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    if not (days.isdigit() and all(p.isdigit() for p in parts)) or not 1 <= len(parts) <= 3:
        return None
    if len(parts) == 1:  # minutes alone
        return 86400.0 * int(days) + 60.0 * int(parts[0])
    hms = [0] * (3 - len(parts)) + [int(p) for p in parts]
    return 86400.0 * int(days) + 3600.0 * hms[0] + 60.0 * hms[1] + hms[2]


def _requeue_from_thread() -> None:
    """Slurm's warning found no safe point in time (a step longer than planned): requeue the job
    from its last checkpoint now, from the stop watchdog's thread (the main one may be blocked in
    a collective, where no interrupt reaches it). submitit acts on global rank 0 only."""
    from vapo_lab import stop as stop_module

    handler = stop_module.installed()
    previous = handler.previous_save_handler if handler is not None else None
    if not callable(previous):
        return
    print(
        "Slurm's warning found no safe point in time: requeuing from the last checkpoint",
        file=sys.stderr,
        flush=True,
    )
    try:
        previous(stop_module.SAVE_SIGNAL, None)
    except SystemExit:  # submitit requeued the job and exits: this thread only; Slurm ends the rest
        pass
    except BaseException as e:  # noqa: BLE001 - a failed scontrol: the job ends at its limit
        print(f"requeue from the watchdog: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _requeue() -> None:
    """Calls submitit's SIGUSR2 handler, which the run's replaced: on global rank 0 it pickles
    ``checkpoint``'s resubmission, requeues the job (``scontrol requeue``, which ends every task)
    and exits; other ranks wait for that end (exiting first would end the job step early under
    ``--kill-on-bad-exit``)."""
    from vapo_lab import stop as stop_module

    handler = stop_module.installed()
    previous = handler.previous_save_handler if handler is not None else None
    # the watchdog requeued the job already (the warning found no safe point in time)
    if callable(previous) and not handler.overdue_called:
        previous(stop_module.SAVE_SIGNAL, None)
    time.sleep(REQUEUE_WAIT_S)
