"""The lock that one process at a time opens a local sqlite MLflow store under."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy

from vapo_lab.track.store_lock import sqlite_file, store_lock


@pytest.mark.parametrize(
    "uri, path",
    [
        ("sqlite:////tmp/x/mlflow.db", Path("/tmp/x/mlflow.db")),
        ("sqlite:///mlflow.db", Path("mlflow.db")),
        ("sqlite+pysqlite:////tmp/m.db?timeout=20", Path("/tmp/m.db")),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        ("http://127.0.0.1:5000", None),
        ("postgresql://u@h/db", None),
        ("file:///tmp/mlruns", None),
    ],
)
def test_the_database_file_of_a_uri(uri, path):
    assert sqlite_file(uri) == path


def test_a_second_process_waits_for_the_lock(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    other = [
        sys.executable,
        "-c",
        f"from vapo_lab.track.store_lock import store_lock\nwith store_lock({uri!r}): pass",
    ]
    with store_lock(uri):
        waiting = subprocess.Popen(other)
        time.sleep(2)
        assert waiting.poll() is None  # blocked while this process holds the lock
    assert waiting.wait(timeout=60) == 0
    assert (tmp_path / "mlflow.db.lock").is_file()


# opens a fresh sqlite store and is killed (SIGKILL) right after MLflow creates its first
# `_alembic_tmp_` table, midway through the schema's migrations: a store MLflow cannot open again
KILLED_MIDWAY = """
import os, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine

@event.listens_for(Engine, "after_cursor_execute")
def die(conn, cursor, statement, *args):
    if statement.lstrip().upper().startswith("CREATE TABLE _ALEMBIC_TMP_"):
        os.kill(os.getpid(), signal.SIGKILL)

from mlflow.tracking import MlflowClient
MlflowClient(tracking_uri=sys.argv[1])
"""


def _killed_midway(uri: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", KILLED_MIDWAY, uri], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == -9, done.stderr[-2000:]  # killed, as a node failure would


def test_a_store_killed_while_it_was_created_is_set_aside_and_made_anew(tmp_path, capfd):
    from mlflow.tracking import MlflowClient

    from vapo_lab.track import open_client

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _killed_midway(uri)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        MlflowClient(tracking_uri=uri)  # MLflow alone cannot open or finish it
    client = open_client(uri)
    assert client.search_experiments()[0].name == "Default"
    client.create_run(client.create_experiment("x"))  # a working store
    aside = [p.name for p in tmp_path.glob("mlflow.db.unfinished-*")]
    assert len(aside) == 1 and (tmp_path / aside[0]).stat().st_size > 0  # renamed, never deleted
    err = capfd.readouterr().err
    assert f"moved it to {aside[0]} and created a new one" in err and "Traceback" not in err


def test_a_store_that_holds_anything_is_never_set_aside(tmp_path):
    import sqlite3

    from vapo_lab.track import open_client

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _killed_midway(uri)
    # an experiment of its owner's, beside Default
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        db.execute(
            "INSERT INTO experiments (experiment_id, name, lifecycle_stage) "
            "VALUES (1, 'kept', 'active')"
        )
    with pytest.raises(sqlalchemy.exc.OperationalError):
        open_client(uri)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db", "mlflow.db.lock"]
