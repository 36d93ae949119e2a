"""The lock that one process at a time opens a local sqlite MLflow store under."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from vapo_lab.track.store_lock import sqlite_file, store_lock


@pytest.mark.parametrize("uri, path", [
    ("sqlite:////tmp/x/mlflow.db", Path("/tmp/x/mlflow.db")),
    ("sqlite:///mlflow.db", Path("mlflow.db")),
    ("sqlite+pysqlite:////tmp/m.db?timeout=20", Path("/tmp/m.db")),
    ("sqlite://", None), ("sqlite:///:memory:", None),
    ("http://127.0.0.1:5000", None), ("postgresql://u@h/db", None), ("file:///tmp/mlruns", None),
])
def test_the_database_file_of_a_uri(uri, path):
    assert sqlite_file(uri) == path


def test_a_second_process_waits_for_the_lock(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    other = [sys.executable, "-c", f"from vapo_lab.track.store_lock import store_lock\nwith store_lock({uri!r}): pass"]
    with store_lock(uri):
        waiting = subprocess.Popen(other)
        time.sleep(2)
        assert waiting.poll() is None  # blocked while this process holds the lock
    assert waiting.wait(timeout=60) == 0
    assert (tmp_path / "mlflow.db.lock").is_file()
