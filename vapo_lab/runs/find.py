"""Finding runs and checkpoints on disk: the latest run, a run by its id, checkpoints by step.

Readers of run folders (evaluation, reports) use these; each returns None or an empty result
where nothing is found, so the caller words the refusal in its own options' terms.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vapo_lab.runs.checkpoint import STATE_FILE
from vapo_lab.runs.folder import CHECKPOINTS, RUN_FILE

CHECKPOINT_PREFIX = "step_"


def run_info(run_dir: Path) -> dict[str, Any]:
    """Returns the run's ``run.json`` (tracking run id and store, command, component choices)."""
    return json.loads((run_dir / RUN_FILE).read_text())


def latest_run(runs_dir: Path) -> Path | None:
    """Returns the most recently started run under ``runs_dir`` (newest run.json), or None."""
    runs = sorted(
        (p.parent for p in runs_dir.glob(f"*/{RUN_FILE}")),
        key=lambda d: (d / RUN_FILE).stat().st_mtime,
    )
    return runs[-1] if runs else None


def run_with_id(run_id: str, runs_dir: Path) -> Path | None:
    """Returns the run under ``runs_dir`` whose run.json records run id ``run_id``, or None."""
    for run_json in runs_dir.glob(f"*/{RUN_FILE}"):
        try:
            if json.loads(run_json.read_text()).get("run_id") == run_id:
                return run_json.parent
        except (OSError, json.JSONDecodeError):
            continue
    return None


def checkpoint_step(folder: Path) -> int | None:
    """Returns the training step a checkpoint folder ``step_NNNNNN`` is named for, else None."""
    digits = folder.name[len(CHECKPOINT_PREFIX) :]
    return int(digits) if folder.name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() else None


def checkpoints(run_dir: Path) -> dict[int, Path]:
    """Returns {step: folder} of the run's complete checkpoints (those with their trainer state)."""
    out = {}
    for p in (run_dir / CHECKPOINTS).glob(f"{CHECKPOINT_PREFIX}*"):
        step = checkpoint_step(p)
        if (p / STATE_FILE).is_file() and step is not None:
            out[step] = p
    return out


__all__ = ["checkpoint_step", "checkpoints", "latest_run", "run_info", "run_with_id"]
