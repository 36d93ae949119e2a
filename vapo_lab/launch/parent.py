"""A grid's parent MLflow run: every cell's run is its child, and its status follows the submission.

Created on a grid's first submission (named by the grid id, tagged ``kind=grid``) and reopened by
the next ones (the record keeps its id and tracking URI), it is RUNNING while a submission runs
and ends FINISHED when every submitted cell finished, FAILED or KILLED otherwise; a Slurm grid
left running (``--no-wait``) keeps it RUNNING.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from vapo_lab.launch.base import Log
from vapo_lab.launch.grid import CellSpec, Grid


def tracking_uri(cfg: DictConfig) -> str:
    """Returns the tracking store the submission's runs log to ("none" when tracking is off)."""
    if cfg.tracking.backend == "none":
        return "none"
    from vapo_lab.track import resolve_tracking_uri

    return resolve_tracking_uri(cfg.tracking.uri)


def start_parent(
    grid: Grid,
    specs: list[CellSpec],
    cfg: DictConfig,
    record: dict[str, Any],
    launcher: str,
    grid_dir: Path,
) -> str | None:
    """Returns the grid's parent MLflow run id, RUNNING until the submission ends (created on first
    submission; raises when the tracking server is down, before anything is submitted)."""
    if cfg.tracking.backend == "none":
        return None
    from vapo_lab.track import make_tracker
    from vapo_lab.track.store import set_run_status

    tracker = make_tracker(
        cfg.tracking.backend, cfg.tracking.uri, grid.experiment, cfg.tracking.spool_dir
    )
    if record.get("parent_run_id") and record.get("tracking_uri") == tracking_uri(cfg):
        from vapo_lab.track.store import check_server

        if tracker.uri.startswith(("http://", "https://")):
            check_server(tracker.uri)
        set_run_status(tracker.uri, record["parent_run_id"], "RUNNING")
        return record["parent_run_id"]
    tags = {"grid_id": specs[0].grid_id, "grid": grid.name, "kind": "grid", "launcher": launcher}
    params = {
        "source": grid.source,
        "cells": len(specs),
        "seeds": ",".join(map(str, grid.seeds)),
        "grid_dir": str(grid_dir),
        "cell_names": ",".join(sorted({s.name for s in specs})),
        "command": " ".join(["vapo-lab", *sys.argv[1:]]),
    }
    run_id = tracker.start(specs[0].grid_id, tags, params)
    tracker.close()
    return run_id


def end_parent(cfg: DictConfig, parent: str | None, status: str) -> None:
    """Marks the grid's parent run ``status``: FINISHED when every submitted cell finished. A store
    that does not answer gets it later (``vapo_lab.trainer.heal``: a note beside the spools)."""
    if parent is not None and cfg.tracking.backend != "none":
        from vapo_lab.track.mlflow_tracker import spool_folder
        from vapo_lab.track.store import set_run_status
        from vapo_lab.trainer.heal import note_pending

        if not set_run_status(tracking_uri(cfg), parent, status):
            note_pending(spool_folder(cfg.tracking.spool_dir), tracking_uri(cfg), parent, status)


def heal_tracking(spool_dir: str | None, log: Log) -> None:
    """Completes the runs (cells, parents) that ended while their store did not answer and that
    answers now (``vapo_lab.trainer.heal``): on resubmission, ``vapo-lab jobs`` and ``report``."""
    from vapo_lab.track.mlflow_tracker import spool_folder
    from vapo_lab.trainer.heal import heal

    heal(spool_folder(spool_dir), log)


def heal_everywhere(output_dir: str | Path, log: Log) -> None:
    """``heal_tracking`` of this folder's spools and of every grid's under ``output_dir`` (what
    ``vapo-lab report`` does before it reads a store)."""
    import json

    from vapo_lab.track.mlflow_tracker import spool_folder

    folders = {str(spool_folder(None).resolve())}
    for record in sorted((Path(output_dir) / "grids").glob("*/grid.json")):
        try:
            folders.add(str(json.loads(record.read_text())["spool_dir"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a grid submitted before its record named its spools: this folder's
    for folder in sorted(folders):
        heal_tracking(folder, log)
