"""Tracking runs that ended while their MLflow store did not answer, completed once it answers.

A run (or a grid's parent run) that could not send all its metrics, or its final status, when it
ended leaves a note beside its spool: ``<spool dir>/<run id>.pending.json`` (store, run id, final
status, run folder). ``heal`` completes every such run whose store answers now: its spool and the
steps of its metrics.jsonl the store lacks (each step once), then its status; the note and the
spool go. A grid's resubmission, ``vapo-lab jobs`` and ``vapo-lab report`` call it, so an outage
heals without the user; ``train resume=`` also sends a run's spool.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vapo_lab.runs.folder import METRICS_FILE
from vapo_lab.runs.metrics_log import MetricsLog

NOTE = ".pending.json"


def note_pending(
    spool_dir: Path, uri: str, run_id: str, status: str, run_dir: Path | None = None
) -> Path:
    """Writes (atomically) the note that run ``run_id`` at ``uri`` ended ``status`` without its
    store hearing all of it; returns its path. ``run_dir``: the run's folder, whose metrics.jsonl
    holds every step (None for a grid's parent run: a status only)."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    path = spool_dir / f"{run_id}{NOTE}"
    note = {"uri": uri, "run_id": run_id, "status": status, "run_dir": run_dir and str(run_dir)}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(note, indent=1))
    os.replace(tmp, path)
    return path


def pending(spool_dir: Path) -> list[dict[str, Any]]:
    """Returns the notes in ``spool_dir`` (unreadable ones skipped: a note is rewritten whole)."""
    notes = []
    for path in sorted(spool_dir.glob(f"*{NOTE}")) if spool_dir.is_dir() else []:
        try:
            notes.append({**json.loads(path.read_text()), "note": str(path)})
        except (OSError, ValueError):
            continue
    return notes


def heal(spool_dir: Path, log: Callable[[str], None]) -> list[str]:
    """Completes every pending run of ``spool_dir`` whose store answers (see the module docstring);
    returns the run ids completed. Tells ``log`` one line a store: what it completed, or how many
    runs still wait for it. Raises nothing: a store still down is tried again next time."""
    notes = pending(spool_dir)
    done: list[str] = []
    for uri in sorted({n["uri"] for n in notes}):
        mine = [n for n in notes if n["uri"] == uri]
        settled = _heal_store(uri, mine, spool_dir)
        done += settled
        healed = sum(1 for n in mine if n["run_id"] in settled)
        if healed == len(mine):
            log(
                f"tracking: MLflow at {uri} answers again: {healed} run(s) that ended while it did "
                "not now hold all their steps and their final status"
            )
        else:
            log(
                f"tracking: {len(mine) - healed} run(s) still wait for MLflow at {uri} (it does "
                f"not answer); their metrics are kept in {spool_dir} and sent by the next "
                "`vapo-lab jobs`, `report` or resubmission once it does"
            )
    return done


def _heal_store(uri: str, notes: list[dict[str, Any]], spool_dir: Path) -> list[str]:
    """Returns the run ids of ``notes`` completed at ``uri`` (none when it does not answer)."""
    from vapo_lab.track import MlflowTracker
    from vapo_lab.track.store import TrackingError, check_server

    try:
        if uri.startswith(("http://", "https://")):
            check_server(uri)
        tracker = MlflowTracker(uri=uri, spool_dir=spool_dir)
    except TrackingError:
        return []
    done = []
    for n in notes:
        run_dir = Path(n["run_dir"]) if n.get("run_dir") else None
        records = (
            MetricsLog(run_dir / METRICS_FILE, warn=lambda text: None).records()
            if run_dir is not None and (run_dir / METRICS_FILE).is_file()
            else []
        )
        if not tracker.settle(n["run_id"], n.get("status"), records):
            break  # it stopped answering: the rest wait for the next try
        Path(n["note"]).unlink(missing_ok=True)
        done.append(n["run_id"])
    return done
