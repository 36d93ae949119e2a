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
import reprlib
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from vapo_lab.errors import VapoLabError

FORMAT = "vapo-lab-runs/1"
SOURCE_TAG = "vapo.source_run_id"
# An export to import is untrusted: these caps bound the memory reading one takes before it is
# refused (their sizing: docs/testing.md, "Runs-export caps")
MAX_INFLATED_BYTES = 256 << 20
# JSON values, counted while inflating as their , : [ { bytes (an upper bound)
MAX_JSON_VALUES = 16_000_000
MAX_RUNS = 10_000  # export_runs asks MLflow for at most this many
# MLflow's run statuses: set_terminated refuses any other, after the store is written
STATUSES = frozenset({"RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED"})
_VALUE_BYTES = tuple(b",:[{")
_CHUNK = 1 << 20
_FIX = "write one with `vapo-lab report --save-runs FILE`"
_REPR = reprlib.Repr()  # a bad value in a message, cut short: it may be megabytes
_REPR.maxstring = _REPR.maxother = 60


class ExportError(VapoLabError):
    """An export file that cannot be read or written."""


def export_runs(tracking_uri: str, experiment: str, path: str | Path) -> int:
    """Writes every run of ``experiment`` to ``path`` (.json.gz); returns how many."""
    from vapo_lab.track.store import open_client

    client = open_client(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ExportError(f"no experiment {experiment!r} in {tracking_uri}: nothing to export")
    runs = []
    for r in sorted(
        client.search_runs([exp.experiment_id], max_results=10000),
        key=lambda r: (r.info.start_time or 0, r.info.run_id),
    ):
        metrics = {}
        for key in sorted(r.data.metrics):
            points = sorted(
                client.get_metric_history(r.info.run_id, key), key=lambda m: (m.step, m.timestamp)
            )
            metrics[key] = [[int(m.step), int(m.timestamp), float(m.value)] for m in points]
        runs.append(
            {
                "run_id": r.info.run_id,
                "run_name": r.info.run_name,
                "status": r.info.status,
                "start_time": r.info.start_time,
                "end_time": r.info.end_time,
                "tags": dict(sorted(r.data.tags.items())),
                "params": dict(sorted(r.data.params.items())),
                "metrics": metrics,
            }
        )
    write_export(path, experiment, runs)
    return len(runs)


def write_export(path: str | Path, experiment: str, runs: list[dict[str, Any]]) -> None:
    """Writes ``runs`` (as export_runs reads them) to ``path`` (.json.gz), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(
        {"format": FORMAT, "experiment": experiment, "runs": runs}, sort_keys=True
    ).encode()
    tmp = path.with_name(path.name + ".tmp")
    # mtime 0: same runs, same bytes
    with (
        open(tmp, "wb") as f,
        gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as gz,
    ):
        gz.write(data)
    tmp.replace(path)


def read_export(path: str | Path) -> dict[str, Any]:
    """Returns an export file's contents, checked: the file, untrusted, is inflated in chunks and
    refused at the first cap it passes, then parsed and checked run by run."""
    try:
        data = json.loads(_inflate_capped(path))
    except RecursionError as e:  # json's C parser recurses per nesting level
        raise ExportError(
            f"cannot read runs file {path}: its JSON is too deeply nested; {_FIX}"
        ) from e
    except ValueError as e:  # bad JSON, or an integer over Python's 4300 digits
        raise ExportError(f"cannot read runs file {path}: {e} ({_FIX})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ExportError(
            f"{path} is not a vapo-lab runs export (format {FORMAT}); "
            "write one with `vapo-lab report --save-runs FILE`"
        )
    _check_export(path, data)
    return data


def _inflate_capped(path: str | Path) -> str:
    """The text of gzip ``path``, refused (ExportError) as soon as it passes a cap."""
    try:
        with open(path, "rb") as raw:
            # first in constant memory: a bomb is refused holding 1 MiB
            _inflate(path, raw, keep=False)
            raw.seek(0)
            text = _inflate(path, raw, keep=True)
    except (OSError, EOFError, zlib.error) as e:  # not gzip, truncated, corrupt, missing
        raise ExportError(f"cannot read runs file {path}: {e} ({_FIX})") from e
    try:
        # json.dumps writes ASCII; a str of it costs one byte a character
        return text.decode("ascii")
    except UnicodeDecodeError as e:
        raise ExportError(
            f"cannot read runs file {path}: byte {e.start} is not ASCII, and an export is "
            f"(json.dumps escapes other characters); {_FIX}"
        ) from e


def _inflate(path: str | Path, raw: BinaryIO, keep: bool) -> bytearray:
    """Inflates ``raw`` a chunk at a time, counting its bytes and JSON values against the caps;
    returns the text if ``keep`` (else nothing is held)."""
    text = bytearray()
    size = values = 0
    with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
        while chunk := gz.read(_CHUNK):
            size += len(chunk)
            values += sum(chunk.count(c) for c in _VALUE_BYTES)
            if size > MAX_INFLATED_BYTES:
                raise ExportError(
                    f"{path} inflates to more than {MAX_INFLATED_BYTES >> 20} MiB, "
                    "the cap on a runs export (the committed ones are under 5 MiB); "
                    f"if it is a real export, raise "
                    f"MAX_INFLATED_BYTES in vapo_lab/track/export.py"
                )
            if values > MAX_JSON_VALUES:
                raise ExportError(
                    f"{path} holds more than {MAX_JSON_VALUES:,} JSON values "
                    "(a metric point is 4), "
                    f"the cap on a runs export; if it is a real export, raise MAX_JSON_VALUES "
                    f"in vapo_lab/track/export.py"
                )
            if keep:
                text += chunk
    return text


def _check_export(path: str | Path, data: dict[str, Any]) -> None:
    """Refuses (ExportError, one line) the first run or field not as export_runs writes it."""
    if not isinstance(data.get("experiment"), str) or not data["experiment"]:
        raise ExportError(
            f"{path} has a bad experiment {_short(data.get('experiment'))}, not a name; {_FIX}"
        )
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise ExportError(f"{path} has a bad runs {_short(runs)}, not a list of runs; {_FIX}")
    if len(runs) > MAX_RUNS:
        raise ExportError(
            f"{path} holds {len(runs)} runs, more than the {MAX_RUNS} export_runs writes; {_FIX}"
        )
    for i, run in enumerate(runs):
        problem = _run_problem(run)
        if problem:
            rid = run.get("run_id") if isinstance(run, dict) else None
            name = f"run {i} ({rid!r})" if isinstance(rid, str) else f"run {i}"
            raise ExportError(f"{path}: {name} {problem}; {_FIX}")


def _run_problem(run: Any) -> str | None:
    """What is wrong with one run of an export, or None."""
    if not isinstance(run, dict):
        return f"is {_short(run)}, not an object"
    for field, (ok, expected) in _FIELDS.items():
        if field not in run:
            return f"has no {field}"
        if not ok(run[field]):
            return f"has a bad {field} {_short(run[field])}, not {expected}"
    for key, points in run["metrics"].items():
        if not isinstance(points, list):
            return (
                f"has a bad metrics series {key!r}: {_short(points)}, "
                "not a list of [step, timestamp, value]"
            )
        for j, p in enumerate(points):
            if not (
                type(p) is list and len(p) == 3 and _int64(p[0]) and _int64(p[1]) and _number(p[2])
            ):
                return (
                    f"has bad metrics: {key!r} point {j} is {_short(p)}, "
                    "not [step, timestamp, value] "
                    "(two integers and a number)"
                )
    return None


def _int64(v: Any) -> bool:
    return type(v) is int and -(2**63) <= v < 2**63  # bool is no int here; MLflow stores 64 bits


def _number(v: Any) -> bool:
    return type(v) is float or _int64(v)


def _strings(v: Any) -> bool:
    # JSON keys are strings
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _short(v: Any) -> str:
    return _REPR.repr(v)


# each run field as export_runs writes it: (check, what it should be)
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "run_id": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "run_name": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "status": (
        lambda v: isinstance(v, str) and v in STATUSES,
        "one of " + ", ".join(sorted(STATUSES)),
    ),
    "start_time": (lambda v: v is None or _int64(v), "an integer (ms since the epoch) or null"),
    "end_time": (lambda v: v is None or _int64(v), "an integer (ms since the epoch) or null"),
    "tags": (_strings, "an object of strings"),
    "params": (_strings, "an object of strings"),
    "metrics": (lambda v: isinstance(v, dict), "an object of metric series"),
}


def import_runs(path: str | Path, tracking_uri: str) -> tuple[str, int]:
    """Creates the runs of export ``path`` in ``tracking_uri`` under the same experiment name;
    returns (experiment, runs imported)."""
    data = read_export(path)  # first: a refused file costs neither MLflow's import nor a store
    from mlflow.entities import Metric, Param

    from vapo_lab.track.store import open_client, open_experiment

    client = open_client(tracking_uri)
    exp_id = open_experiment(client, data["experiment"])
    for run in data["runs"]:
        tags = {**run["tags"], SOURCE_TAG: run["tags"].get(SOURCE_TAG, run["run_id"])}
        created = client.create_run(
            exp_id, start_time=run["start_time"], tags=tags, run_name=run["run_name"]
        )
        rid = created.info.run_id
        params = [Param(k, str(v)) for k, v in run["params"].items()]
        metrics = [
            Metric(k, v, ts, step) for k, pts in run["metrics"].items() for step, ts, v in pts
        ]
        for i in range(0, len(params), 100):  # MLflow's per-batch limits
            client.log_batch(rid, params=params[i : i + 100])
        for i in range(0, len(metrics), 1000):
            client.log_batch(rid, metrics=metrics[i : i + 1000])
        if run["status"] != "RUNNING":  # a run still going where it was logged stays RUNNING
            client.set_terminated(rid, status=run["status"], end_time=run["end_time"])
    return data["experiment"], len(data["runs"])
