"""Export an experiment's runs from MLflow to one file, and import them into another store.

MLflow has no portable run export of its own (its SQLite schema changes between versions), so a
grid's results travel as gzipped JSON: every run's name, status, times, tags, params and full
metric histories (step, timestamp, value). Importing creates new runs, each tagged
``vapo.source_run_id`` with the id it had where it was logged (the report lists that id), so a
report made from an import is the report of the original store. Artifacts are not exported.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from vapo_lab.errors import VapoLabError

FORMAT = "vapo-lab-runs/1"
SOURCE_TAG = "vapo.source_run_id"


class ExportError(VapoLabError):
    """An export file that cannot be read or written."""


def export_runs(tracking_uri: str, experiment: str, path: str | Path) -> int:
    """Writes every run of ``experiment`` in ``tracking_uri`` to ``path`` (.json.gz); returns the count."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ExportError(f"no experiment {experiment!r} in {tracking_uri}: nothing to export")
    runs = []
    for r in sorted(client.search_runs([exp.experiment_id], max_results=10000),
                    key=lambda r: (r.info.start_time or 0, r.info.run_id)):
        metrics = {}
        for key in sorted(r.data.metrics):
            points = sorted(client.get_metric_history(r.info.run_id, key), key=lambda m: (m.step, m.timestamp))
            metrics[key] = [[int(m.step), int(m.timestamp), float(m.value)] for m in points]
        runs.append({"run_id": r.info.run_id, "run_name": r.info.run_name, "status": r.info.status,
                     "start_time": r.info.start_time, "end_time": r.info.end_time,
                     "tags": dict(sorted(r.data.tags.items())), "params": dict(sorted(r.data.params.items())),
                     "metrics": metrics})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"format": FORMAT, "experiment": experiment, "runs": runs}, sort_keys=True).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz:  # mtime 0: same runs, same bytes
        gz.write(data)
    tmp.replace(path)
    return len(runs)


def read_export(path: str | Path) -> dict[str, Any]:
    """Returns an export file's contents, checked."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError) as e:
        raise ExportError(f"cannot read runs file {path}: {e} (write one with `vapo-lab report --save-runs FILE`)") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ExportError(f"{path} is not a vapo-lab runs export (format {FORMAT}); "
                          "write one with `vapo-lab report --save-runs FILE`")
    return data


def import_runs(path: str | Path, tracking_uri: str) -> tuple[str, int]:
    """Creates the runs of export ``path`` in ``tracking_uri`` under the same experiment name;
    returns (experiment, runs imported)."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from vapo_lab.track.mlflow_tracker import open_experiment

    data = read_export(path)
    client = MlflowClient(tracking_uri=tracking_uri)
    exp_id = open_experiment(client, data["experiment"])
    for run in data["runs"]:
        tags = {**run["tags"], SOURCE_TAG: run["tags"].get(SOURCE_TAG, run["run_id"])}
        created = client.create_run(exp_id, start_time=run["start_time"], tags=tags, run_name=run["run_name"])
        rid = created.info.run_id
        params = [Param(k, str(v)) for k, v in run["params"].items()]
        metrics = [Metric(k, v, ts, step) for k, pts in run["metrics"].items() for step, ts, v in pts]
        for i in range(0, len(params), 100):  # MLflow's per-batch limits
            client.log_batch(rid, params=params[i:i + 100])
        for i in range(0, len(metrics), 1000):
            client.log_batch(rid, metrics=metrics[i:i + 1000])
        if run["status"] != "RUNNING":  # a run still going where it was logged stays RUNNING
            client.set_terminated(rid, status=run["status"], end_time=run["end_time"])
    return data["experiment"], len(data["runs"])
