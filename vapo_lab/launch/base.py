"""What a launcher is: the ``Launcher`` protocol, the ``Submission`` it fills in, and its error.

A launcher takes the cells of a grid that still need to run (``CellJob``: the cell's composed
config, where its grid lives, its parent MLflow run) and runs each one's ``run_cell`` somewhere,
after one ``prepare`` job that builds the caches the cells share. ``submit_grid`` does everything
else (which cells to run, the grid's record and status files, the parent run) the same way for
every launcher. A new launcher is a class with these methods and an entry in
``vapo_lab.launch.registry.LAUNCHERS`` plus its options, ``conf/launcher/<name>.yaml``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from vapo_lab.errors import VapoLabError
from vapo_lab.launch.status import FINISHED, pct, read_status

if TYPE_CHECKING:
    from vapo_lab.launch.cell import CellJob
    from vapo_lab.launch.grid import CellSpec

Log = Callable[[str], None]


class LaunchError(VapoLabError):
    """A grid could not be (fully) submitted; the message says what was and what was not."""


@dataclass
class Submission:
    """What ``submit_grid`` did."""

    grid_id: str
    grid_dir: Path
    submitted: list[str] = field(default_factory=list)  # cell keys
    skipped_finished: list[str] = field(default_factory=list)
    skipped_running: list[str] = field(default_factory=list)
    job_ids: dict[str, str] = field(default_factory=dict)  # cell key -> job id (Slurm)
    results: dict[str, str] = field(default_factory=dict)  # cell key -> finished / failed: <line>
    dry_run_text: str = ""

    def finished(self, key: str, status: dict[str, Any], log: Log) -> None:
        """Records that cell ``key`` finished, with ``status`` its final status record (its last
        tracking warning, if any, told on the next line)."""
        self.results[key] = FINISHED
        log(f"  {key}: finished (final eval {pct(status.get('final_eval'))})")
        if status.get("tracking"):
            log(f"    {status['tracking']}")

    def failed(self, key: str, reason: str, log: Log, where: str = "", tracking: str = "") -> None:
        """Records that cell ``key`` failed for ``reason``; ``where`` points at its log; its last
        tracking warning, if any, told on the next line."""
        self.results[key] = f"failed: {reason}"
        log(f"  {key}: {self.results[key]}{where}")
        if tracking:
            log(f"    {tracking}")


@runtime_checkable
class Launcher(Protocol):
    """A place where a grid's cells run: this machine's processes, a Ray cluster, Slurm.

    Every method takes the launcher's own settings, ``launcher.<name>.*`` of the config
    (``conf/launcher/<name>.yaml``), as a plain dict.
    """

    name: str  # the registry key and the config option: launcher=<name>, --launcher <name>
    # True when the jobs outlive the submitting process (Slurm): their ids are recorded in the
    # grid's record as soon as they exist, and without --wait the submission returns once queued
    detached: bool

    def preflight(self, settings: dict[str, Any], specs: list[CellSpec]) -> None:
        """Raises LaunchError when the launcher cannot take the cells ``specs`` that would run
        (commands missing, cluster unreachable, bad settings, a cell it cannot run: a many-rank
        cell on Ray); called before anything is written or submitted."""

    def submit(
        self, jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Log
    ) -> None:
        """Runs (or queues) the prepare job, then ``run_cell`` of every job; records job ids, and
        the result of each cell that ended, in ``sub``."""

    def wait(self, jobs: list[CellJob], sub: Submission, log: Log) -> None:
        """Waits until every cell that ``submit`` queued has ended, recording each result in ``sub``
        (nothing to do for a launcher whose ``submit`` runs the cells to their end)."""

    def dry_run_text(
        self, specs: list[CellSpec], settings: dict[str, Any], grid_dir: Path, grid_id: str
    ) -> str:
        """Returns what ``--dry-run`` shows beyond the cells of a submission of the cells ``specs``
        (Slurm: its sbatch scripts), or an empty string."""


def logged(fn: Callable[[Any], Any], arg: Any, log_file: Path) -> Any:
    """Calls fn(arg) with this process's stdout and stderr appended to ``log_file``."""
    with open(log_file, "a", buffering=1, encoding="utf-8") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        sys.stdout = sys.stderr = f
        return fn(arg)


def log_folder(grid_dir: Path) -> Path:
    """Returns (and makes) ``<grid>/logs``, where a local or Ray submission's prepare job and cells
    write their output (``prepare.log``, ``<cell key>.log``)."""
    logs = grid_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def cell_failed(
    sub: Submission, grid_dir: Path, key: str, log: Log, error: BaseException | None = None
) -> None:
    """Records in ``sub`` a cell whose worker raised ``error``, with its status file's error (the
    raised one's first line where the cell recorded none: a cell another process runs) and its
    log."""
    status = read_status(grid_dir, key)
    said = str(error).splitlines()[0] if error is not None and str(error) else None
    sub.failed(
        key,
        str(status.get("error") or said or "see its log"),
        log,
        where=f" (log {grid_dir / 'logs' / (key + '.log')})",
        tracking=status.get("tracking") or "",
    )
