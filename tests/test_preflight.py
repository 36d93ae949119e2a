"""Pre-flight checks (vapo_lab.config.preflight): each small check on its own, leaving nothing
behind."""

import os
import socket

import pytest
from omegaconf import OmegaConf

from vapo_lab.config.preflight import (
    Need,
    run_problems,
    store_path,
    tracking_problems,
    unwritable,
    writable_problems,
)


def test_unwritable_probes_the_nearest_existing_folder_and_leaves_nothing(tmp_path):
    assert unwritable(tmp_path / "a" / "b") is None  # made later, under a writable folder
    assert os.listdir(tmp_path) == []
    (tmp_path / "f").write_text("x")
    folder, why = unwritable(tmp_path / "f" / "runs")
    assert folder == tmp_path / "f" and why == f"{tmp_path / 'f'} is a file, not a folder"


def test_writable_problems_group_the_needs_one_folder_blocks(tmp_path):
    (tmp_path / "f").write_text("x")
    lines = writable_problems(
        [
            Need(tmp_path / "f" / "a", "output_dir=a", "fix a"),
            Need(tmp_path / "f" / "b", "the caches", "fix b"),
            Need(tmp_path / "ok", "fine", "none"),
        ]
    )
    assert lines == [
        f"{tmp_path / 'f'} is a file, not a folder, and output_dir=a and the caches are written "
        "there: fix a; fix b"
    ]
    assert writable_problems([Need(tmp_path / "f" / "a", "output_dir=a", "fix a")]) == [
        f"output_dir=a cannot be written: {tmp_path / 'f'} is a file, not a folder; fix a"
    ]


@pytest.mark.parametrize(
    "uri, kind, path",
    [
        ("http://127.0.0.1:5000", "server", None),
        ("sqlite:///mlflow.db", "sqlite", "mlflow.db"),
        ("sqlite:////abs/mlflow.db", "sqlite", "/abs/mlflow.db"),
        ("sqlite://", "other", None),
        ("file:///abs/mlruns", "file", "/abs/mlruns"),
        ("mlruns", "file", "mlruns"),
        ("postgresql://u@h/db", "other", None),
    ],
)
def test_store_path_reads_mlflow_uris(uri, kind, path):
    got_kind, got_path = store_path(uri)
    assert got_kind == kind and (got_path is None if path is None else str(got_path) == path)


def test_tracking_problems_for_reading_never_create_the_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (line,) = tracking_problems("sqlite:///nope.db", key="--tracking-uri", must_exist=True)
    assert (
        line.startswith("--tracking-uri sqlite:///nope.db does not exist")
        and "give --tracking-uri" in line
    )
    assert os.listdir(tmp_path) == []
    (tmp_path / "there.db").write_bytes(b"")
    assert tracking_problems("sqlite:///there.db", must_exist=True) == []


def test_tracking_problems_for_writing(tmp_path):
    (tmp_path / "f").write_text("x")
    (line,) = tracking_problems(f"sqlite:///{tmp_path}/f/mlflow.db")
    assert line.startswith(f"tracking.uri=sqlite:///{tmp_path}/f/mlflow.db cannot be written: ")
    assert "tracking=none" in line
    assert tracking_problems(f"sqlite:///{tmp_path}/new/mlflow.db") == [] and sorted(
        os.listdir(tmp_path)
    ) == ["f"]
    (tmp_path / "dir.db").mkdir()
    (line,) = tracking_problems(f"sqlite:///{tmp_path}/dir.db")
    assert "is not a database" in line


def test_tracking_problems_of_a_server_that_does_not_answer():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (line,) = tracking_problems(f"http://127.0.0.1:{port}", timeout=1)
    assert f"http://127.0.0.1:{port} is not answering" in line and "tracking=none" in line
    (line,) = tracking_problems(f"http://127.0.0.1:{port}", key="--tracking-uri", timeout=1)
    assert "give --tracking-uri" in line and "tracking=none" not in line


def test_run_problems_of_a_fine_run_are_none_and_leave_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = OmegaConf.create(
        {"resume": None, "output_dir": "runs", "tracking": {"backend": "mlflow", "uri": None}}
    )
    assert run_problems(cfg, ".vapo_cache") == []
    assert os.listdir(tmp_path) == []
    cfg.tracking.backend = "none"
    (tmp_path / "runs").write_text("x")
    assert run_problems(cfg, ".vapo_cache") == [
        f"output_dir=runs cannot be written: {tmp_path / 'runs'} is a file, not a folder; "
        "set output_dir=/a/writable/folder"
    ]
