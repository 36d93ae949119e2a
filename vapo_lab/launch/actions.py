"""What ``vapo-lab sweep / ablate --table1 / jobs / cancel`` do, apart from argument parsing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vapo_lab.launch.base import LaunchError, Submission
from vapo_lab.launch.grid import Grid


def run_grid(
    grid: Grid,
    overrides: Sequence[str],
    launcher: str | None,
    dry_run: bool,
    wait: bool,
    log: Callable[[str], None],
    out: Callable[[str], None],
) -> Submission:
    """Expands ``grid`` with the command line's overrides and submits it; returns the Submission.

    ``--launcher X`` is the ``launcher=X`` override; ``launcher.*`` and ``tracking.*`` overrides set
    the submission's launcher and tracking (they do not change the runs' config hashes).
    """
    from omegaconf import OmegaConf

    from vapo_lab.launch.registry import resolve_launcher
    from vapo_lab.launch.submit import submit_grid

    backend = resolve_launcher(launcher, [*grid.overrides, *overrides])
    overrides = list(overrides)
    if launcher is not None:
        overrides = [o for o in overrides if not o.startswith("launcher=")] + [
            f"launcher={launcher}"
        ]
    specs = grid.expand(overrides)
    cfg = OmegaConf.create(specs[0].config)
    if not dry_run:  # the grid's folder, the caches and the tracking store, before any cell starts
        from vapo_lab.config.preflight import check_run
        from vapo_lab.integrity import CACHE_DIR

        check_run(cfg, CACHE_DIR)
    sub = submit_grid(grid, specs, cfg, backend, dry_run=dry_run, wait=wait, log=log)
    if dry_run:
        out(sub.dry_run_text)
        return sub
    failed = {k: v for k, v in sub.results.items() if v != "finished"}
    if sub.results:
        out(
            f"grid {sub.grid_id}: {len(sub.results) - len(failed)} finished, "
            f"{len(failed)} failed this time; "
            f"{len(sub.skipped_finished)} were already finished. "
            f"`vapo-lab jobs {sub.grid_id}` for details"
        )
    if failed:
        raise LaunchError(
            f"{len(failed)} cell(s) failed: "
            + "; ".join(f"{k}: {v}" for k, v in failed.items())
            + ". Fix and resubmit the same command: finished cells are skipped"
        )
    return sub


def jobs_table(
    output_dir: str | Path, grid: str | None, log: Callable[[str], None] = print
) -> tuple[Path, list[dict[str, Any]]]:
    """Returns (the grid's folder, one row per cell: key, state, job id, run id) of grid id ``grid``
    (or a unique prefix of it) under ``output_dir``, the latest grid when None; first completes, in
    its store, the runs that ended while it did not answer (``log`` hears how it went)."""
    from vapo_lab.launch.jobs import grid_table
    from vapo_lab.launch.parent import heal_tracking
    from vapo_lab.launch.record import find_grid, read_record

    path = find_grid(output_dir, grid)
    record = read_record(path)
    if record.get("tracking_uri", "none") != "none":
        heal_tracking(record.get("spool_dir"), log)
    return path, grid_table(path)


def cancel(output_dir: str | Path, grid: str | None) -> tuple[Path, list[str]]:
    """Cancels the queued and running cells of a grid (as ``jobs_table`` finds it); returns (its
    folder, one line per action taken)."""
    from vapo_lab.launch.jobs import cancel_grid
    from vapo_lab.launch.record import find_grid

    path = find_grid(output_dir, grid)
    return path, cancel_grid(path)
