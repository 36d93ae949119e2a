"""A grid's folder, ``<output_dir>/grids/<grid id>/``, and its record ``grid.json``.

The record holds the grid's cells, its parent MLflow run and every submission with its job ids;
beside it, ``status/`` (one file per cell, ``vapo_lab.launch.status``), ``runs/`` (the cells' run
folders) and ``logs/`` or ``slurm_logs/``. The grid id hashes the cells' configs, so the same grid
submitted again reopens the same folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vapo_lab.launch.base import LaunchError


def grid_dir_for(output_dir: str | Path, grid_id: str) -> Path:
    return (Path(output_dir) / "grids" / grid_id).resolve()


def read_record(grid_dir: Path) -> dict[str, Any]:
    path = grid_dir / "grid.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_record(grid_dir: Path, record: dict[str, Any]) -> None:
    grid_dir.mkdir(parents=True, exist_ok=True)
    tmp = grid_dir / f".grid.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, grid_dir / "grid.json")


def known_job_ids(record: dict[str, Any]) -> dict[str, str]:
    """Returns {cell key (or "prepare"): job id} over every submission, the latest last."""
    return {k: v for s in record.get("submissions", []) for k, v in s.get("job_ids", {}).items()}


def find_grid(output_dir: str | Path, grid: str | None) -> Path:
    """Returns the folder of grid id ``grid`` (or a unique prefix), the latest grid when None."""
    root = Path(output_dir) / "grids"
    found = sorted(
        (p for p in root.glob("*") if (p / "grid.json").is_file()),
        key=lambda p: (p / "grid.json").stat().st_mtime,
    )
    if not found:
        raise LaunchError(
            f"no grid under {root}: "
            "submit one with `vapo-lab ablate --table1` or `vapo-lab sweep FILE`"
        )
    if grid is None:
        return found[-1].resolve()
    if Path(grid).is_dir() and (Path(grid) / "grid.json").is_file():
        return Path(grid).resolve()
    match = [p for p in found if p.name == grid] or [p for p in found if p.name.startswith(grid)]
    if len(match) != 1:
        names = ", ".join(p.name for p in found[-5:])
        raise LaunchError(
            f"grid {grid!r} {'is ambiguous' if match else 'not found'} under {root} "
            f"(recent: {names})"
        )
    return match[0].resolve()
