"""``metrics.jsonl``: a run's local record of every logged metric, each step written once.

One JSON object a line: ``{"step": k, "timestamp_ms": t, "<area>/<name>": value, ...}``. Training
steps and value-pretraining steps (``pretrain/*`` keys) are numbered separately, so a record is
identified by (kind, step). The file is written before the tracker is told, so after a kill it
holds every step the tracker may have seen.

A resumed run recomputes the steps between its checkpoint and the kill. Those are already in the
record; :meth:`MetricsLog.add` does not write them again (nor, through the caller, send them to the
tracker). It compares the recomputed values with the logged ones instead, and says once if they
differ (on CPU they are bit-identical; see ``trainer.deterministic``). A line cut short by the
kill is dropped when the file is opened.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

# wall-clock figures differ between two computations of the same step
VOLATILE = ("time/", "perf/")
RESERVED = ("step", "timestamp_ms")


def record_kind(metrics: dict[str, Any]) -> str:
    """Returns "pretrain" for a value-pretraining record (all keys ``pretrain/*``), else "train"."""
    keys = [k for k in metrics if k not in RESERVED]
    return "pretrain" if keys and all(k.startswith("pretrain/") for k in keys) else "train"


def _stable(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k not in RESERVED and not k.startswith(VOLATILE)}


class MetricsLog:
    """Appends metric records to ``path``, each (kind, step) once; see the module docstring."""

    def __init__(self, path: Path, warn: Callable[[str], None] = print) -> None:
        self.path, self.warn = path, warn
        self.logged: dict[tuple[str, int], dict[str, Any]] = {}
        self._warned = False
        if path.is_file():
            self._load()

    def _load(self) -> None:
        good: list[dict[str, Any]] = []
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                good.append(json.loads(line))
            except ValueError:
                if i != len(lines) - 1:  # only the last line can be cut by a kill
                    raise
        if len(good) != sum(1 for line in lines if line.strip()):  # drop the cut line
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in good), encoding="utf-8")
            os.replace(tmp, self.path)
        for r in good:
            self.logged[(record_kind(r), int(r["step"]))] = r

    def records(self) -> list[dict[str, Any]]:
        """Returns every logged record in the tracker's form: ``{step, timestamp, metrics}``."""
        return [
            {
                "step": int(r["step"]),
                "timestamp": int(r.get("timestamp_ms", 0)),
                "metrics": {k: v for k, v in r.items() if k not in RESERVED},
            }
            for r in self.logged.values()
        ]

    def add(self, step: int, metrics: dict[str, float], timestamp_ms: int) -> bool:
        """Appends the record and returns True; returns False, writing nothing, when this (kind,
        step) is already logged (a step recomputed after a resume), after comparing the values."""
        key = (record_kind(metrics), int(step))
        if key in self.logged:
            before, now = _stable(self.logged[key]), _stable(metrics)
            if before != now and not self._warned:
                self._warned = True
                differ = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
                self.warn(
                    f"warning: {key[0]} step {step} recomputed after the resume "
                    "differs from the value "
                    f"logged before the interruption ({', '.join(differ[:3])}"
                    f"{', ...' if len(differ) > 3 else ''}); "
                    "the first logged values are kept (the run is not bit-for-bit repeatable here)"
                )
            return False
        record = {"step": int(step), "timestamp_ms": int(timestamp_ms), **metrics}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self.logged[key] = record
        return True
