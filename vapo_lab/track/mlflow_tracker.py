"""MLflow tracking that never silently loses a metric.

Metrics go to MLflow through ``MlflowClient`` (no global fluent state, so several runs can live in
one process). When a call fails mid-run (server down, network), the batch is appended to a spool
file on disk and training goes on; the spool is replayed, in order, before the next successful
call and at ``finish``. A spool that still cannot be replayed at the end is kept and its path
reported, so nothing is lost.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vapo_lab.errors import VapoLabError

MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_LENGTH = 6000


class TrackingError(VapoLabError):
    """The tracking backend cannot be reached when a run starts."""


def resolve_tracking_uri(uri: str | None) -> str:
    """Returns ``uri``, else $MLFLOW_TRACKING_URI, else the local store ./mlflow.db (MLflow's own default)."""
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Returns {dotted.key: leaf} for a nested mapping (lists stay leaves)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_server(uri: str, timeout: float = 3.0) -> None:
    """Raises TrackingError unless the MLflow server at ``uri`` answers its /health endpoint."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as r:
            if r.status == 200:
                return
            problem = f"HTTP {r.status}"
    except (urllib.error.URLError, OSError) as e:
        problem = str(getattr(e, "reason", e))
    raise TrackingError(
        f"MLflow tracking server {uri} is not answering ({problem}): start it with "
        "`mlflow server --host 127.0.0.1 --port 5000`, or set tracking.uri to a reachable server, "
        "or tracking=none")


class MlflowTracker:
    """Logs one run to MLflow, spooling to disk whatever fails to send."""

    def __init__(self, uri: str | None = None, experiment: str = "vapo-lab",
                 spool_dir: str | Path | None = None) -> None:
        # MLflow retries an unreachable server with exponential backoff for minutes; training
        # should instead spool and go on, so keep retries short unless the user set them
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient  # heavy import, only when tracking is on

        self.uri = resolve_tracking_uri(uri)
        self.experiment = experiment
        self.client = MlflowClient(tracking_uri=self.uri)
        self.spool_dir = Path(spool_dir) if spool_dir else Path.cwd() / ".vapo_cache" / "spool"
        self.run_id: str | None = None
        self.failures = 0

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, run_name: str | None, tags: Mapping[str, str], params: Mapping[str, Any],
              resume_run_id: str | None = None, parent_run_id: str | None = None) -> str:
        """Returns the run id of a new run (or of ``resume_run_id``, reopened); raises TrackingError."""
        from mlflow.entities import Param

        if self.uri.startswith(("http://", "https://")):
            check_server(self.uri)
        try:
            if resume_run_id:
                self.client.update_run(resume_run_id, status="RUNNING")
                self.run_id = resume_run_id
                return resume_run_id
            exp = self.client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(self.experiment)
            all_tags = {str(k): str(v) for k, v in tags.items()}
            if parent_run_id:
                all_tags["mlflow.parentRunId"] = parent_run_id
            run = self.client.create_run(exp_id, run_name=run_name, tags=all_tags)
            self.run_id = run.info.run_id
            items = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in params.items()]
            for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
                self.client.log_batch(self.run_id, params=items[i:i + MAX_PARAMS_PER_BATCH])
            return self.run_id
        except Exception as e:  # noqa: BLE001 - any backend failure at start is fatal and clear
            raise TrackingError(
                f"cannot reach the MLflow tracking store {self.uri}: {str(e).splitlines()[0][:200]}; "
                "start it (`mlflow server --host 127.0.0.1`) or set tracking.uri / tracking=none") from e

    def finish(self, status: str = "FINISHED") -> Path | None:
        """Returns the path of a spool that could not be replayed (None when everything was sent)."""
        self._replay()
        spool = self._spool_path()
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception:  # noqa: BLE001 - the metrics are what matters; they are spooled
            self.failures += 1
        return spool if spool.exists() else None

    # -- logging -------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Logs ``metrics`` at ``step``; on failure spools them to disk."""
        record = {"step": int(step), "timestamp": int(time.time() * 1000),
                  "metrics": {k: float(v) for k, v in metrics.items()}}
        if self._spool_path().exists() and not self._replay():
            self._append(record)
            return
        try:
            self._send([record])
        except Exception:  # noqa: BLE001 - backend down: keep training, keep the data
            self.failures += 1
            self._append(record)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Sets tags on the run (best effort: tags are re-set at the next start/resume)."""
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

    # -- spool ---------------------------------------------------------------------------------
    def _spool_path(self) -> Path:
        return self.spool_dir / f"{self.run_id}.jsonl"

    def _append(self, record: dict[str, Any]) -> None:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        with self._spool_path().open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def _send(self, records: list[dict[str, Any]]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(k, v, r["timestamp"], r["step"]) for r in records for k, v in r["metrics"].items()]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])

    def _replay(self) -> bool:
        """Returns True when the spool is empty after trying to send it."""
        path = self._spool_path()
        if not path.exists():
            return True
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
        try:
            self._send(records)
        except Exception:  # noqa: BLE001
            self.failures += 1
            return False
        path.unlink()
        return True


class NullTracker:
    """Same methods as MlflowTracker; records nothing (tracking=none)."""

    uri = "none"
    run_id: str | None = None
    failures = 0

    def start(self, run_name: str | None, tags: Mapping[str, str], params: Mapping[str, Any],
              resume_run_id: str | None = None, parent_run_id: str | None = None) -> str:
        self.run_id = resume_run_id or f"local-{int(time.time() * 1000)}"
        return self.run_id

    def finish(self, status: str = "FINISHED") -> Path | None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def log_text(self, text: str, artifact_file: str) -> None:
        pass
