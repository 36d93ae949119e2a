"""The local launcher (``launcher=local``): cells in fresh processes on this machine.

The prepare job runs first in one process; then the cells, ``launcher.local.workers`` at a time,
each in a fresh process of its own, its output in ``<grid>/logs/<cell key>.log``. The submission
returns when every cell has ended; one failed cell does not stop the others.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vapo_lab.launch.base import LaunchError, Log, Submission, cell_failed, log_folder, logged
from vapo_lab.launch.cell import CellJob, prepare, run_cell
from vapo_lab.launch.status import FAILED, write_status


class LocalLauncher:
    """Runs a grid's cells in worker processes on this machine and waits for them."""

    name = "local"
    detached = False

    def preflight(self, settings: dict[str, Any]) -> None:
        workers = int(settings.get("workers", 1))
        if workers < 1:
            raise LaunchError(f"launcher.local.workers={workers}: must be >= 1")

    def submit(self, jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Log) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        grid_dir = Path(jobs[0].grid_dir)
        ctx = multiprocessing.get_context("spawn")
        logs = log_folder(grid_dir)
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            pool.submit(logged, prepare, jobs, logs / "prepare.log").result()
        with ProcessPoolExecutor(max_workers=int(settings.get("workers", 1)), mp_context=ctx,
                                 max_tasks_per_child=1) as pool:
            futures = {pool.submit(logged, run_cell, j, logs / f"{j.spec.key}.log"): j for j in jobs}
            for f in as_completed(futures):
                key = futures[f].spec.key
                try:
                    sub.finished(key, f.result(), log)
                except BrokenProcessPool as e:
                    write_status(grid_dir, key, state=FAILED, error=f"worker process died: {e}")
                    sub.failed(key, f"worker process died ({e})", log)
                except Exception:  # noqa: BLE001 - one failed cell does not stop the others
                    cell_failed(sub, grid_dir, key, log)

    def wait(self, jobs: list[CellJob], sub: Submission, log: Log) -> None:
        """Nothing to wait for: ``submit`` returns when every cell has ended."""

    def dry_run_text(self, count: int, settings: dict[str, Any], grid_dir: Path, grid_id: str) -> str:
        return ""

