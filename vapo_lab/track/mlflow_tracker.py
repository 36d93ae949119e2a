"""MLflow tracking that never silently loses a metric and never stalls training.

Metrics go to MLflow through ``MlflowClient`` (no global fluent state, so several runs can live in
one process), sent by a background thread. When a send fails (server down, network), the batch is
appended to a spool file on disk and training goes on; the user is told once; the spool is
replayed, in order, when the server answers again (tried at most every ``retry_s`` seconds) and at
``finish``, and the user is told once that it caught up. A spool that still cannot be replayed at
the end is kept and its path reported, so nothing is lost. After a resume, :meth:`backfill` sends
the steps that a killed process had written to its local record but not sent, and only those. A
local sqlite store is opened under a lock beside it (``store_lock``): runs started together in a
fresh folder never race to create its schema.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vapo_lab.track.store import (
    TrackingError,
    check_server,
    open_client,
    open_experiment,
    resolve_tracking_uri,
)

MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_LENGTH = 6000


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Returns {dotted.key: leaf} for a nested mapping (lists stay leaves)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def first_line(error: BaseException) -> str:
    """Returns the first line of ``error``'s message, cut to 200 characters (or its type's name)."""
    lines = str(error).splitlines()
    return lines[0][:200] if lines else type(error).__name__


def spool_folder(spool_dir: str | Path | None) -> Path:
    """Returns where runs spool what their store did not take (``tracking.spool_dir``; default
    ``.vapo_cache/spool`` of the working folder, beside the caches a grid's jobs share)."""
    return Path(spool_dir) if spool_dir else Path.cwd() / ".vapo_cache" / "spool"


def read_spool(path: Path) -> list[dict[str, Any]]:
    """Returns the records of a spool file; a line cut short (a full disk mid-write) is dropped."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


class MlflowTracker:
    """Logs one run to MLflow, spooling to disk whatever fails to send (see the module docstring).

    After :meth:`start` a background thread sends the metrics; without it (logging into an
    existing run, as ``vapo-lab eval`` does) each call sends at once.
    """

    def __init__(
        self,
        uri: str | None = None,
        experiment: str = "vapo-lab",
        spool_dir: str | Path | None = None,
        log: Callable[[str], None] | None = None,
        retry_s: float = 10.0,
    ) -> None:
        # MLflow retries an unreachable server with exponential backoff for minutes; training
        # should instead spool and go on, so keep retries short unless the user set them
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.uri = resolve_tracking_uri(uri)
        self.experiment = experiment
        try:  # imports MLflow (heavy) only when tracking is on
            self.client = open_client(self.uri)
        except Exception as e:  # noqa: BLE001
            # a store that cannot be opened (corrupt, unwritable): one line
            raise TrackingError(
                f"cannot open the MLflow tracking store {self.uri}: {first_line(e)}; "
                "repair or move it, or set tracking.uri to another store, or tracking=none"
            ) from e
        self.spool_dir = spool_folder(spool_dir)
        self.run_id: str | None = None
        self.failures = 0
        self.log = log or (lambda text: None)
        self.retry_s = retry_s
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._spooling = False  # in an outage (told once per outage)
        self._told_lost = False  # told that metrics could be neither sent nor spooled
        self._last_try = -math.inf
        self.status_sent = False  # finish() marked the run's final status in the store

    # -- lifecycle -----------------------------------------------------------------------------
    def start(
        self,
        run_name: str | None,
        tags: Mapping[str, str],
        params: Mapping[str, Any],
        resume_run_id: str | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        """Returns the id of a new run (or of ``resume_run_id``, reopened); raises TrackingError."""
        from mlflow.entities import Param

        if self.uri.startswith(("http://", "https://")):
            check_server(self.uri)
        try:
            if resume_run_id:
                self.client.update_run(resume_run_id, status="RUNNING")
                self.run_id = resume_run_id
            else:
                exp_id = open_experiment(self.client, self.experiment)
                all_tags = {str(k): str(v) for k, v in tags.items()}
                if parent_run_id:
                    all_tags["mlflow.parentRunId"] = parent_run_id
                run = self.client.create_run(exp_id, run_name=run_name, tags=all_tags)
                self.run_id = run.info.run_id
                items = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
                for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                    self.client.log_batch(self.run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])
        except Exception as e:  # noqa: BLE001 - any backend failure at start is fatal and clear
            raise TrackingError(
                f"cannot reach the MLflow tracking store {self.uri}: {first_line(e)}; "
                "start it (`mlflow server --host 127.0.0.1`) or set tracking.uri / tracking=none"
            ) from e
        self._thread = threading.Thread(target=self._sender, name="vapo-lab-mlflow", daemon=True)
        self._thread.start()
        return self.run_id

    def close(self, wait_s: float = 60.0) -> None:
        """Sends what is queued (waiting at most ``wait_s`` seconds) and stops the sender; the run's
        status is left as it is (a grid's parent run stays RUNNING while its cells run)."""
        if self._thread is not None:
            self._queue.put(("stop", None))
            self._thread.join(wait_s)
            self._thread = None

    def finish(self, status: str = "FINISHED", wait_s: float = 60.0) -> Path | None:
        """Sends what is queued (waiting at most ``wait_s`` seconds), marks the run ``status``
        (FINISHED, FAILED or KILLED) and returns the path of a spool that could not be sent (None
        when everything was sent)."""
        self.close(wait_s)
        try:
            self._replay(force=True)
        except Exception:  # noqa: BLE001
            # a spool that cannot be read is kept; the status is still set
            self.failures += 1
        try:
            self.client.set_terminated(self.run_id, status=status)
            self.status_sent = True
        except Exception:  # noqa: BLE001 - the metrics are what matters; they are spooled
            self.failures += 1
        spool = self._spool_path()
        return spool if spool.exists() else None

    def settle(self, run_id: str, status: str | None, records: list[dict[str, Any]]) -> bool:
        """Completes, in the store, a run that ended while the store did not answer: sends those of
        its spool and of ``records`` ({step, timestamp, metrics}: its metrics.jsonl) that the run
        lacks, each (key, step) once, then marks it ``status`` (None: leaves it). Returns True when
        all of it was done; False (the spool kept) when the store failed again."""
        self.run_id = run_id
        path = self._spool_path()
        try:
            spooled = read_spool(path) if path.exists() else []
            self._send(self._missing([*spooled, *records]))
            if status is not None:
                self.client.set_terminated(run_id, status=status)
        except Exception:  # noqa: BLE001 - still down: the next try settles it
            self.failures += 1
            return False
        path.unlink(missing_ok=True)
        return True

    # -- logging -------------------------------------------------------------------------------
    def log_metrics(
        self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None
    ) -> None:
        """Logs ``metrics`` at ``step``; on failure spools them to disk (never raises)."""
        record = {
            "step": int(step),
            "timestamp": int(timestamp_ms or time.time() * 1000),
            "metrics": {k: float(v) for k, v in metrics.items()},
        }
        if self._thread is not None:
            self._queue.put(("record", record))
        else:
            self._deliver(record)

    def backfill(self, records: list[dict[str, Any]]) -> None:
        """Sends those of ``records`` ({step, timestamp, metrics}) whose (key, step) the run does
        not hold yet: after a resume, the steps a killed process wrote to its local record but
        never got to send. The store is asked once per metric key; nothing is sent twice."""
        if not records:
            return
        if self._thread is not None:
            self._queue.put(("backfill", records))
        else:
            self._backfill(records)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Sets tags on the run (best effort: a failure is counted, not raised; a resumed run keeps
        the tags it started with, so only tags set here change)."""
        try:
            for k, v in tags.items():
                self.client.set_tag(self.run_id, k, str(v))
        except Exception:  # noqa: BLE001
            self.failures += 1

    def log_text(self, text: str, artifact_file: str) -> None:
        """Stores ``text`` as an artifact of the run (e.g. the resolved config YAML)."""
        try:
            self.client.log_text(self.run_id, text, artifact_file)
        except Exception:  # noqa: BLE001
            self.failures += 1

    # -- the sender ----------------------------------------------------------------------------
    def _sender(self) -> None:
        """The background thread: delivers queued work in order until told to stop."""
        while True:
            kind, item = self._queue.get()
            try:
                if kind == "stop":
                    return
                if kind == "record":
                    self._deliver(item)
                else:
                    self._backfill(item)
            except Exception as e:  # noqa: BLE001
                # e.g. a full disk under the spool: the sender goes on
                self._lost(e)
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Returns once everything logged so far has been sent or spooled."""
        if self._thread is not None:
            self._queue.join()

    def _deliver(self, record: dict[str, Any]) -> None:
        """Sends ``record`` after any spooled ones, or appends it to the spool."""
        if self._spool_path().exists() and not self._replay():
            self._append(record)
            return
        try:
            self._send([record])
        except Exception as e:  # noqa: BLE001 - backend down: keep training, keep the data
            self._outage(e)
            self._append(record)

    def _outage(self, e: Exception) -> None:
        self.failures += 1
        self._last_try = time.monotonic()
        if not self._spooling:
            self._spooling = True
            self.log(
                f"tracking: MLflow at {self.uri} is not answering "
                f"({str(e).splitlines()[0][:120]}); "
                f"spooling metrics to {self._spool_path()}, training goes on; "
                "they are sent when it answers"
            )

    def _lost(self, e: Exception) -> None:
        """Counts metrics neither sent nor spooled; the user is told once (a training run's
        metrics.jsonl still holds them, and resuming it sends what the store lacks)."""
        self.failures += 1
        if not self._told_lost:
            self._told_lost = True
            self.log(
                f"tracking: metrics could be neither sent to {self.uri} "
                f"nor spooled to {self._spool_path()} "
                f"({first_line(e)}); the run's metrics.jsonl keeps them and resume= sends them"
            )

    def _backfill(self, records: list[dict[str, Any]]) -> None:
        if self._spool_path().exists() and not self._replay():
            for r in records:  # cannot ask the store now: keep them for later, after the spool
                self._append({**r, "backfill": True})
            return
        try:
            self._send(self._missing(records))
        except Exception as e:  # noqa: BLE001
            self._outage(e)
            for r in records:
                self._append({**r, "backfill": True})

    def _missing(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Returns ``records`` cut to the (key, step) pairs the run does not hold, each once."""
        keys = sorted({k for r in records for k in r["metrics"]})
        held = {k: {m.step for m in self.client.get_metric_history(self.run_id, k)} for k in keys}
        out = []
        for r in records:  # the first of two records of one (key, step) is the one sent
            metrics = {k: v for k, v in r["metrics"].items() if r["step"] not in held[k]}
            for k in metrics:
                held[k].add(r["step"])
            if metrics:
                out.append({**r, "metrics": metrics})
        return out

    # -- spool ---------------------------------------------------------------------------------
    def _spool_path(self) -> Path:
        return self.spool_dir / f"{self.run_id}.jsonl"

    def _append(self, record: dict[str, Any]) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        with self._spool_path().open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _send(self, records: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        metrics = [
            Metric(k, v, r["timestamp"], r["step"])
            for r in records
            for k, v in r["metrics"].items()
        ]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])

    def _replay(self, force: bool = False) -> bool:
        """Returns True when the spool is empty after trying to send it (while the server is down,
        tried at most every ``retry_s`` seconds unless ``force``)."""
        path = self._spool_path()
        if not path.exists():
            return True
        if not force and self._spooling and time.monotonic() - self._last_try < self.retry_s:
            return False
        records = read_spool(path)
        try:
            plain = [r for r in records if not r.get("backfill")]
            self._send(plain)
            backfill = [r for r in records if r.get("backfill")]
            if backfill:
                self._send(self._missing(backfill))
        except Exception as e:  # noqa: BLE001
            self._outage(e)
            return False
        path.unlink()
        if self._spooling:
            self._spooling = False
            self.log(
                f"tracking: MLflow at {self.uri} answers again; "
                f"the {len(records)} spooled step(s) were sent"
            )
        return True


class NullTracker:
    """Same methods as MlflowTracker; records nothing (tracking=none)."""

    uri = "none"
    run_id: str | None = None
    failures = 0
    status_sent = True

    def start(
        self,
        run_name: str | None,
        tags: Mapping[str, str],
        params: Mapping[str, Any],
        resume_run_id: str | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        self.run_id = resume_run_id or f"local-{int(time.time() * 1000)}"
        return self.run_id

    def finish(self, status: str = "FINISHED") -> Path | None:
        return None

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None
    ) -> None:
        pass

    def backfill(self, records: list[dict[str, Any]]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass
