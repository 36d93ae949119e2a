"""A cell's status file, ``<grid>/status/<key>.json``: what ``vapo-lab jobs`` shows.

A cell's job writes it as it goes (pending / running step k / finished / failed with the last
error line, and the host, pid and Slurm job id that run it); the submission and ``vapo-lab jobs``
read it. Writes are atomic, so a reader never sees half a record.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PENDING, RUNNING, FINISHED, FAILED = "pending", "running", "finished", "failed"


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


def pct(v: Any) -> str:
    """Returns an eval score (a fraction) as a percentage with one decimal, ``n/a`` when missing."""
    return "n/a" if v is None else f"{100 * float(v):.1f}"
