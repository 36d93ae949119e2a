"""Carries the grids' finished runs from one machine to the next through git.

A session's machine can be replaced by a fresh one holding only the repository, so the finished
runs travel in this folder:

    python reports/table1-plateau/carry.py save $ROOT     # finished runs -> carried/<grid>/
    python reports/table1-plateau/carry.py restore $ROOT  # on a new machine, before run.sh

``save`` exports, from a consistent copy of $ROOT/mlflow.db, every cell run that MLflow marks
FINISHED and whose status file says finished (a run cut short starts again on the next machine).
``restore`` imports the carried runs the store lacks (each keeps its original id as
``vapo.source_run_id``) and marks their cells finished, so run.sh skips them. Both are idempotent.
The files are raw runs of unfinished grids, kept only to continue them.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from vapo_lab.launch.status import FINISHED, read_status, write_status
from vapo_lab.track.export import SOURCE_TAG, export_runs, import_runs, read_export, write_export
from vapo_lab.track.mlflow_tracker import open_client

# where the runs travel: this folder's carried/, or another report's (VAPO_CARRIED, e.g.
# reports/table1-free/carried for that report's grids)
CARRIED = Path(os.environ.get("VAPO_CARRIED") or Path(__file__).resolve().parent / "carried")


def grid_dir(root: Path, tags: dict[str, str]) -> Path:
    return root / "runs" / "grids" / tags["grid_id"]


def is_cell(run: dict[str, Any]) -> bool:
    return (
        run["tags"].get("kind") != "grid" and "cell_key" in run["tags"] and "grid_id" in run["tags"]
    )


def source_id(run: dict[str, Any]) -> str:
    return run["tags"].get(SOURCE_TAG, run["run_id"])


def save(root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="vapo-carry-") as tmp:
        # the grid goes on writing its store: read a copy of one instant
        copy = Path(tmp) / "mlflow.db"
        source = sqlite3.connect(f"file:{root / 'mlflow.db'}?mode=ro", uri=True)
        with sqlite3.connect(copy) as target:
            source.backup(target)
        source.close()
        uri = f"sqlite:///{copy}"
        names = [e.name for e in open_client(uri).search_experiments() if e.name != "Default"]
        for name in sorted(names):
            export_runs(uri, name, Path(tmp) / f"{name}.json.gz")
            done = [
                r
                for r in read_export(Path(tmp) / f"{name}.json.gz")["runs"]
                if is_cell(r)
                and r["status"] == "FINISHED"
                and read_status(grid_dir(root, r["tags"]), r["tags"]["cell_key"]).get("state")
                == FINISHED
            ]
            folder = CARRIED / name
            folder.mkdir(parents=True, exist_ok=True)
            new = 0
            for r in done:
                # one file a run, written once: git keeps each run's bytes once however often
                # the grid is saved (a run carried before comes back here, imported)
                path = folder / f"{r['tags']['cell_key']}.json.gz"
                if not path.exists():
                    write_export(path, name, [r])
                    new += 1
            print(
                f"{name}: {len(list(folder.glob('*.json.gz')))} finished runs carried ({new} new)"
            )


def restore(root: Path) -> None:
    uri = f"sqlite:///{root / 'mlflow.db'}"
    root.mkdir(parents=True, exist_ok=True)
    for folder in sorted(p for p in CARRIED.glob("*") if p.is_dir()):
        runs = [r for path in sorted(folder.glob("*.json.gz")) for r in read_export(path)["runs"]]
        experiment = folder.name
        client = open_client(uri)
        exp = client.get_experiment_by_name(experiment)
        have = set()
        if exp is not None:
            have = {
                r.data.tags.get(SOURCE_TAG, r.info.run_id)
                for r in client.search_runs([exp.experiment_id], max_results=10000)
            }
        missing = [r for r in runs if source_id(r) not in have]
        if missing:
            with tempfile.TemporaryDirectory(prefix="vapo-carry-") as tmp:
                write_export(Path(tmp) / "missing.json.gz", experiment, missing)
                import_runs(Path(tmp) / "missing.json.gz", uri)
        exp_id = client.get_experiment_by_name(experiment).experiment_id
        ids = {
            r.data.tags.get(SOURCE_TAG, r.info.run_id): r.info.run_id
            for r in client.search_runs([exp_id], max_results=10000)
        }
        marked = 0
        for r in runs:
            tags, directory = r["tags"], grid_dir(root, r["tags"])
            if read_status(directory, tags["cell_key"]).get("state") == FINISHED:
                continue
            evals = [v for _, _, v in sorted(r["metrics"].get(f"eval/avg_at_{_samples(r)}", []))]
            # training steps only
            last = max((p[0] for p in r["metrics"].get("time/step_s", [])), default=0)
            write_status(
                directory,
                tags["cell_key"],
                state=FINISHED,
                run_id=ids[source_id(r)],
                carried_from=source_id(r),
                step=last,
                base_eval=evals[0] if evals else None,
                final_eval=evals[-1] if evals else None,
                best_eval=max(evals) if evals else None,
            )
            marked += 1
        print(f"{experiment}: {len(missing)} runs imported, {marked} cells marked finished")


def _samples(run: dict[str, Any]) -> int:
    keys = [k for k in run["metrics"] if k.startswith("eval/avg_at_")]
    return max((int(k.rsplit("_", 1)[1]) for k in keys), default=0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("save", "restore"):
        sys.exit("usage: python reports/table1-plateau/carry.py save|restore ROOT")
    {"save": save, "restore": restore}[sys.argv[1]](Path(sys.argv[2]).resolve())
