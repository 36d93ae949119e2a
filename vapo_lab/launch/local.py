"""The local launcher (``launcher=local``): cells in fresh processes on this machine.

The prepare job runs first in one process; then the cells, ``launcher.local.workers`` at a time,
each in a fresh process of its own, its output in ``<grid>/logs/<cell key>.log``. The submission
returns when every cell has ended; one failed cell does not stop the others.

A many-rank cell takes one worker, which runs its ranks on this machine with torchrun
(``vapo_lab.launch.ranks --cell``), as ``vapo-lab train`` does. Cells on more than one node
(``trainer.nodes`` > 1) are refused before anything starts: they need ``--launcher slurm``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from vapo_lab.launch.base import LaunchError, Log, Submission, cell_failed, log_folder, logged
from vapo_lab.launch.cell import CellJob, cell_ranks, prepare, run_cell
from vapo_lab.launch.parent import tracking_uri
from vapo_lab.launch.ranks import RankFailed, mark_failed, torchrun_command
from vapo_lab.launch.status import FAILED, FINISHED, read_status, write_status
from vapo_lab.launch.torchrun import LAUNCH_DIR, dead_rank, read_failures

if TYPE_CHECKING:
    from vapo_lab.launch.grid import CellSpec


class LocalLauncher:
    """Runs a grid's cells in worker processes on this machine and waits for them."""

    name = "local"
    detached = False

    def preflight(self, settings: dict[str, Any], specs: list[CellSpec]) -> None:
        workers = int(settings.get("workers", 1))
        if workers < 1:
            raise LaunchError(f"launcher.local.workers={workers}: must be >= 1")
        for s in specs:
            nodes, per_node = cell_ranks(s.config)
            if nodes > 1:
                raise LaunchError(
                    f"cell {s.key} runs on trainer.nodes={nodes} nodes: the local launcher starts "
                    "the ranks of this machine only; "
                    f"use --launcher slurm (it submits {nodes} nodes x {per_node} tasks), "
                    "or set trainer.nodes=1; nothing was submitted"
                )

    def submit(
        self, jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Log
    ) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        grid_dir = Path(jobs[0].grid_dir)
        ctx = multiprocessing.get_context("spawn")
        logs = log_folder(grid_dir)
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            pool.submit(logged, prepare, jobs, logs / "prepare.log").result()
        with ProcessPoolExecutor(
            max_workers=int(settings.get("workers", 1)), mp_context=ctx, max_tasks_per_child=1
        ) as pool:
            futures = {
                pool.submit(
                    logged,
                    run_cell if j.world_size == 1 else run_cell_ranks,
                    j,
                    logs / f"{j.spec.key}.log",
                ): j
                for j in jobs
            }
            for f in as_completed(futures):
                key = futures[f].spec.key
                try:
                    sub.finished(key, f.result(), log)
                except BrokenProcessPool as e:
                    write_status(grid_dir, key, state=FAILED, error=f"worker process died: {e}")
                    sub.failed(key, f"worker process died ({e})", log)
                except Exception as e:  # noqa: BLE001 - one failed cell does not stop the others
                    cell_failed(sub, grid_dir, key, log, e)

    def wait(self, jobs: list[CellJob], sub: Submission, log: Log) -> None:
        """Nothing to wait for: ``submit`` returns when every cell has ended."""

    def dry_run_text(
        self, specs: list[CellSpec], settings: dict[str, Any], grid_dir: Path, grid_id: str
    ) -> str:
        return ""


def run_cell_ranks(job: CellJob) -> dict[str, Any]:
    """Runs a many-rank cell's ranks on this machine with torchrun, each ``run_cell(job)``; returns
    the cell's final status record (``run_cell``'s semantics: a finished cell returns at once).

    Raises:
        RankFailed: a rank failed (the status file's error line: the first failing rank's), or
            torchrun did.
    """
    grid_dir, key = Path(job.grid_dir), job.spec.key
    status = read_status(grid_dir, key)
    if status.get("state") == FINISHED:
        return status
    # the job goes to the ranks as JSON in a folder of our own (mkdtemp: mode 0700), removed after
    with tempfile.TemporaryDirectory(prefix="vapo-cell-") as folder:
        path = Path(folder) / "cell.json"
        path.write_text(job.to_json())
        env = {"OMP_NUM_THREADS": "1", **os.environ, LAUNCH_DIR: folder}
        command = torchrun_command(job.ranks[1], ["--cell", str(path)])
        done = subprocess.run(command, cwd=job.cwd, env=env)
        failures = read_failures(Path(folder))
    status = read_status(grid_dir, key)
    if done.returncode == 0 and status.get("state") == FINISHED:
        return status
    # a rank killed by a signal (kill -9, out of memory): named, and its run marked FAILED, whatever
    # rank 0 said as it lost its peer (or nothing, if it was rank 0)
    dead = dead_rank(failures, set())
    if dead is not None and (dead["rank"] != 0 or status.get("state") != FAILED):
        uri = tracking_uri(OmegaConf.create(job.spec.config))
        started = (
            {
                "run_dir": status["run_dir"],
                "run_id": status["run_id"],
                "uri": uri,
                "spool_dir": job.spec.config["tracking"].get("spool_dir"),
            }
            if status.get("run_dir") and status.get("run_id")
            else None
        )
        with contextlib.suppress(OSError):
            os.chdir(job.cwd)  # a relative spool folder is the submission's
        status = write_status(grid_dir, key, state=FAILED, error=mark_failed(started, dead))
    elif status.get("state") != FAILED:
        status = write_status(
            grid_dir,
            key,
            state=FAILED,
            error=f"torchrun exited with status {done.returncode} (see the cell's log)",
        )
    raise RankFailed(str(status.get("error")))
