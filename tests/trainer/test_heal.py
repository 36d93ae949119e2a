"""Runs that ended while their store did not answer are completed when it answers: every step
once, then the final status; by ``heal`` itself and by `vapo-lab jobs` and `vapo-lab report`.

The store here is a local SQLite one, which always answers; the note and the spool are what a run
in an outage leaves (``RunRecord._end_tracking``). tests/faults/test_outage_heals.py has the real
outage: a server killed during a grid and started again.
"""

import json

from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.launch.actions import jobs_table
from vapo_lab.launch.record import write_record
from vapo_lab.runs.metrics_log import MetricsLog
from vapo_lab.track import MlflowTracker
from vapo_lab.trainer.heal import heal, note_pending, pending


def _steps(uri, run_id, key):
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


def _outage(tmp_path, spool_dir):
    """A run whose store took steps 0-1 of 0-4 and no final status, its spool holding steps 1-3
    (1 twice: sent, then spooled again by a retry), and a grid parent left RUNNING; returns (uri,
    run id, parent id)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MlflowTracker(uri, "g", spool_dir)
    parent_id = parent.start("grid", {"kind": "grid"}, {})
    parent.close()
    t = MlflowTracker(uri, "g", spool_dir)
    run_id = t.start("cell", {}, {}, parent_run_id=parent_id)
    run_dir = tmp_path / "runs" / "cell"
    run_dir.mkdir(parents=True)
    log = MetricsLog(run_dir / "metrics.jsonl")
    for step in range(5):
        log.add(step, {"rollout/reward": step / 10, "loss/actor": -step}, 1000 + step)
        if step < 2:
            t.log_metrics({"rollout/reward": step / 10, "loss/actor": -step}, step, 1000 + step)
    t.close()
    spool_dir.mkdir(parents=True, exist_ok=True)
    spool = spool_dir / f"{run_id}.jsonl"
    spool.write_text(
        "".join(
            json.dumps({"step": s, "timestamp": 1000 + s, "metrics": {"rollout/reward": s / 10}})
            + "\n"
            for s in (1, 2, 3)
        )
    )
    note_pending(spool_dir, uri, run_id, "FINISHED", run_dir)
    note_pending(spool_dir, uri, parent_id, "FINISHED")
    return uri, run_id, parent_id


def _healed(uri, run_id, parent_id):
    client = MlflowClient(uri)
    for key in ("rollout/reward", "loss/actor"):
        assert _steps(uri, run_id, key) == [0, 1, 2, 3, 4]  # each step once
    assert [m.value for m in client.get_metric_history(run_id, "loss/actor")] == [
        0,
        -1,
        -2,
        -3,
        -4,
    ]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_run(parent_id).info.status == "FINISHED"


def test_heal_sends_each_missing_step_once_then_the_status(tmp_path):
    spool_dir = tmp_path / "spool"
    uri, run_id, parent_id = _outage(tmp_path, spool_dir)
    assert MlflowClient(uri).get_run(run_id).info.status == "RUNNING"
    lines = []
    assert sorted(heal(spool_dir, lines.append)) == sorted([run_id, parent_id])
    assert lines == [
        f"tracking: MLflow at {uri} answers again: 2 run(s) that ended while it did not now hold "
        "all their steps and their final status"
    ]
    _healed(uri, run_id, parent_id)
    assert pending(spool_dir) == [] and list(spool_dir.iterdir()) == []
    lines.clear()
    assert heal(spool_dir, lines.append) == [] and lines == []  # nothing twice


def test_a_store_still_down_keeps_the_notes(tmp_path):
    spool_dir = tmp_path / "spool"
    note_pending(spool_dir, "http://127.0.0.1:9", "abc", "FINISHED")
    lines = []
    assert heal(spool_dir, lines.append) == []
    assert len(lines) == 1 and lines[0].startswith(
        "tracking: 1 run(s) still wait for MLflow at http://127.0.0.1:9 (it does not answer)"
    )
    assert [n["run_id"] for n in pending(spool_dir)] == ["abc"]


def test_jobs_heals_the_grid_s_spools(tmp_path):
    spool_dir = tmp_path / "elsewhere" / "spool"
    uri, run_id, parent_id = _outage(tmp_path, spool_dir)
    grid_dir = tmp_path / "runs" / "grids" / "g-1"
    write_record(grid_dir, {"cells": [], "tracking_uri": uri, "spool_dir": str(spool_dir)})
    lines = []
    jobs_table(tmp_path / "runs", "g-1", log=lines.append)
    assert len(lines) == 1 and "answers again: 2 run(s)" in lines[0]
    _healed(uri, run_id, parent_id)


def test_report_heals_this_folder_s_spools_before_reading_the_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri, run_id, parent_id = _outage(tmp_path, tmp_path / ".vapo_cache" / "spool")
    r = CliRunner().invoke(
        app, ["report", "--experiment", "g", "--tracking-uri", uri, "--out", "rep"]
    )
    # two runs without an eval score make no report, but the store was completed first
    assert "answers again: 2 run(s)" in r.output
    _healed(uri, run_id, parent_id)
