"""Prints the core-hours a grid's runs took, from their run folders' metrics.jsonl or from runs
exports (a runs.json.gz, or a carried/ folder of them); one torch thread a run, so a run's seconds
are core-seconds.

    python reports/table1-plateau/core_hours.py $ROOT/runs/grids/*/
    python reports/table1-plateau/core_hours.py reports/table1-plateau/*/runs.json.gz
    python reports/table1-plateau/core_hours.py reports/table1-free/runs.json.gz

A run's time is its training steps' `time/step_s` plus its held-out evaluations. An evaluation at
step k is the time between the rows of steps k-1 and k less step k's `time/step_s`; the one before
step 1 has no row before it and counts as the mean of the others. Not counted: set-up (a few
seconds) and the steps a killed run repeated after its resume.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def jsonl_rows(metrics: Path) -> dict[int, dict]:
    """Returns {step: row} of a run folder's metrics.jsonl."""
    rows = {}
    for line in metrics.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["step"]] = row  # a step logged twice (resumed) counts once: the last
    return rows


def export_rows(run: dict) -> dict[int, dict]:
    """Returns {step: row} of one run of a runs export, with the metrics run_seconds reads.

    The trainer logs a step's metrics, its evaluation's included, with one timestamp; value
    pretraining's history shares the step numbers, so it is left out.
    """
    rows: dict[int, dict] = {}
    for key in sorted(run["metrics"], key=lambda k: k != "time/step_s"):  # a step's time first
        if key == "time/step_s" or key.startswith("eval/"):
            for step, ms, value in run["metrics"][key]:
                rows.setdefault(step, {"step": step, "timestamp_ms": ms})[key] = value
    return rows


def run_seconds(rows: dict[int, dict]) -> tuple[float, float, int]:
    """Returns (training seconds, evaluation seconds, steps) of the run whose rows are ``rows``."""
    train = sum(r.get("time/step_s", 0.0) for r in rows.values())
    evals = [
        (
            rows[s]["timestamp_ms"] / 1000
            - rows[s - 1]["timestamp_ms"] / 1000
            - rows[s]["time/step_s"]
        )
        for s in rows
        if s > 0 and s - 1 in rows and any(k.startswith("eval/") for k in rows[s])
    ]
    # a gap of 15 min or more is an interruption, not an evaluation
    evals = [e for e in evals if 0 < e < 900]
    first = statistics.mean(evals) if evals and 0 in rows else 0.0
    return train, sum(evals) + first, max(rows, default=0)


def main(grids: list[str]) -> None:
    total = 0.0
    for grid in grids:
        exports = (
            [Path(grid)] if grid.endswith(".json.gz") else sorted(Path(grid).glob("*.json.gz"))
        )
        if exports:
            from vapo_lab.track.export import read_export

            parts = [
                run_seconds(export_rows(r))
                for e in exports
                for r in read_export(e)["runs"]
                if "cell_key" in r["tags"]
            ]
        else:
            parts = [
                run_seconds(jsonl_rows(p)) for p in sorted(Path(grid).glob("runs/*/metrics.jsonl"))
            ]
        train, evals = sum(p[0] for p in parts) / 3600, sum(p[1] for p in parts) / 3600
        total += train + evals
        # an export is named by its folder: every report's is runs.json.gz
        name = (
            f"{Path(grid).parent.name}/{Path(grid).name}"
            if grid.endswith(".json.gz")
            else Path(grid).name
        )
        print(
            f"{name}: {len(parts)} runs, {sum(p[2] for p in parts)} steps; "
            f"training {train:.2f} h, "
            f"evaluation {evals:.2f} h; {train + evals:.2f} core-hours"
        )
    print(f"all: {total:.2f} core-hours")


if __name__ == "__main__":
    main(sys.argv[1:])
