"""Opening an MLflow store: where it is, a client under its lock, an experiment shown as model
training, a server's health, a run's status. The tracker (``mlflow_tracker``), the report, the
launchers and evaluation all open a store through these."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from vapo_lab.errors import VapoLabError
from vapo_lab.track.store_lock import set_aside_if_empty, sqlite_file, store_lock

# MLflow 3's experiment kind: model training (runs table, metric charts), not GenAI (traces,
# evaluations); an MLflow UI that reads it opens the experiment in that view
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


class TrackingError(VapoLabError):
    """The tracking backend cannot be reached when a run starts."""


def resolve_tracking_uri(uri: str | None) -> str:
    """Returns ``uri``, else $MLFLOW_TRACKING_URI, else ./mlflow.db (MLflow's own default)."""
    if uri:
        return uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def open_client(uri: str) -> Any:
    """Returns an MlflowClient of the store at ``uri``, opened under ``store_lock``.

    A sqlite store left unfinished and empty by a process killed while creating it is renamed aside
    (``set_aside_if_empty``) and a new one made, said in one line on stderr.
    """
    from mlflow.tracking import MlflowClient

    with store_lock(uri):
        try:
            return MlflowClient(tracking_uri=uri)
        except Exception:  # a store whose creation was killed midway holds nothing: set it aside
            aside = set_aside_if_empty(uri)
            if aside is None:
                raise
            _forget_engines(uri)
            print(
                f"the MLflow store {sqlite_file(uri)} was left unfinished "
                "by a process killed while creating it and held no run: "
                f"moved it to {aside.name} and created a new one",
                file=sys.stderr,
            )
            return MlflowClient(tracking_uri=uri)


def _forget_engines(uri: str) -> None:
    """Drops MLflow's cached database engine of the sqlite store at ``uri``: its pooled connections
    still read the file just renamed. The cache is MLflow's own (a class attribute); without it,
    nothing is cached and nothing needs dropping."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engines = getattr(SqlAlchemyStore, "_engine_map", {})
    for key in [k for k in engines if sqlite_file(k) == sqlite_file(uri)]:
        engines.pop(key).dispose()


def open_experiment(client: Any, name: str) -> str:
    """Returns the id of experiment ``name``, created when missing, that MLflow's UI shows as model
    training: a new one is created with ``mlflow.experimentKind = custom_model_development``, an
    existing one without a kind gets it, a kind already set (by the user) is kept."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # noqa: BLE001
            # another process (a grid's cell) may have created it in between
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


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
        "or tracking=none"
    )


def set_run_status(uri: str, run_id: str, status: str) -> bool:
    """Sets the status of MLflow run ``run_id`` at ``uri``: RUNNING, or a final one (FINISHED,
    FAILED, KILLED) with its end time; best effort: False when the store did not answer."""
    try:
        client = open_client(resolve_tracking_uri(uri))
        if status == "RUNNING":
            client.update_run(run_id, status=status)
        else:
            client.set_terminated(run_id, status=status)
    except Exception:  # noqa: BLE001 - a status is worth no crash; the cells' own runs are exact
        return False
    return True
