"""MLflow tracking: runs, params and tags land in the store; a backend outage loses nothing."""

import pytest
from mlflow.tracking import MlflowClient

from vapo_lab.track import MlflowTracker, NullTracker, TrackingError, flatten, resolve_tracking_uri


@pytest.fixture
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _history(uri, run_id, key):
    return [
        (m.step, m.value)
        for m in sorted(
            MlflowClient(uri).get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp)
        )
    ]


def test_run_with_params_tags_and_metrics(store, tmp_path):
    t = MlflowTracker(store, "exp", spool_dir=tmp_path / "spool")
    run_id = t.start(
        "r1", {"algo": "vapo", "seed": "0"}, {"loss.eps_high": 0.28, "big": "x" * 7000}
    )
    for step in range(3):
        t.log_metrics({"rollout/reward": step / 10, "actor/clipfrac_high": 0.5}, step)
    assert t.finish() is None
    run = MlflowClient(store).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["algo"] == "vapo"
    assert run.data.params["loss.eps_high"] == "0.28" and len(run.data.params["big"]) == 6000
    assert _history(store, run_id, "rollout/reward") == [(0, 0.0), (1, 0.1), (2, 0.2)]


def test_outage_spools_and_replays_in_order(store, tmp_path, monkeypatch):
    said = []
    t = MlflowTracker(store, "exp", spool_dir=tmp_path / "spool", log=said.append, retry_s=0)
    run_id = t.start("r", {}, {})
    real = t.client.log_batch
    down = {"on": False}

    def flaky(*args, **kwargs):
        if down["on"]:
            raise ConnectionError("server down")
        return real(*args, **kwargs)

    monkeypatch.setattr(t.client, "log_batch", flaky)
    t.log_metrics({"m": 0.0}, 0)
    t.flush()
    down["on"] = True
    t.log_metrics({"m": 1.0}, 1)
    t.log_metrics({"m": 2.0}, 2)
    t.flush()
    spool = tmp_path / "spool" / f"{run_id}.jsonl"
    assert spool.is_file() and len(spool.read_text().splitlines()) == 2
    down["on"] = False
    t.log_metrics({"m": 3.0}, 3)  # replays 1 and 2 first, then sends 3
    t.flush()
    assert not spool.exists()
    assert _history(store, run_id, "m") == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0)]
    assert t.failures == 2
    # told once that it spools (not once per step) and once that it caught up
    assert (
        len(said) == 2
        and "spooling" in said[0]
        and "answers again" in said[1]
        and "2 spooled" in said[1]
    )


def test_spool_kept_when_backend_stays_down(store, tmp_path, monkeypatch):
    t = MlflowTracker(store, "exp", spool_dir=tmp_path / "spool")
    run_id = t.start("r", {}, {})
    monkeypatch.setattr(
        t.client, "log_batch", lambda *a, **k: (_ for _ in ()).throw(OSError("down"))
    )
    t.log_metrics({"m": 1.0}, 1)
    left = t.finish()
    assert left == tmp_path / "spool" / f"{run_id}.jsonl" and left.is_file()


def test_unreachable_server_fails_at_start_with_a_clear_line(tmp_path):
    t = MlflowTracker("http://127.0.0.1:9", "exp", spool_dir=tmp_path)
    with pytest.raises(TrackingError, match="not answering.*tracking=none"):
        t.start("r", {}, {})


def test_uri_resolution(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(None) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://h:5000")
    assert resolve_tracking_uri(None) == "http://h:5000"
    assert resolve_tracking_uri("http://other:1") == "http://other:1"


def test_flatten_and_null_tracker():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {
        "a.b": 1,
        "a.c.d": [1, 2],
        "e": None,
    }
    t = NullTracker()
    assert t.start("r", {}, {}).startswith("local-") and t.finish() is None


def test_a_dead_server_never_stalls_the_caller(store, tmp_path, monkeypatch):
    """Sending happens on a background thread: a call that hangs for 2 s costs the loop nothing,
    and while the server stays down it is tried at most every retry_s seconds."""
    import time

    said = []
    t = MlflowTracker(store, "exp", spool_dir=tmp_path / "spool", log=said.append, retry_s=3600)
    run_id = t.start("r", {}, {})
    calls = []

    def hang(*args, **kwargs):
        calls.append(1)
        time.sleep(2)
        raise ConnectionError("timed out")

    monkeypatch.setattr(t.client, "log_batch", hang)
    start = time.perf_counter()
    for step in range(5):
        t.log_metrics({"m": float(step)}, step)
    assert time.perf_counter() - start < 1.0  # the 2 s hang is not on this thread
    t.flush()
    assert len(calls) == 1  # one try; the other four steps went straight to the spool
    spool = tmp_path / "spool" / f"{run_id}.jsonl"
    assert len(spool.read_text().splitlines()) == 5 and len(said) == 1


def test_backfill_sends_only_what_the_run_lacks(store, tmp_path):
    t = MlflowTracker(store, "exp", spool_dir=tmp_path / "spool")
    run_id = t.start("r", {}, {})
    t.log_metrics({"m": 0.0, "n": 0.5}, 0, timestamp_ms=1000)
    t.log_metrics({"m": 1.0}, 1, timestamp_ms=2000)
    t.flush()
    # a resumed process backfills from its local record: steps 0 and 1 (held) and 2 (lost in flight)
    t.backfill(
        [
            {"step": 0, "timestamp": 1000, "metrics": {"m": 0.0, "n": 0.5}},
            {"step": 1, "timestamp": 2000, "metrics": {"m": 1.0, "n": 1.5}},
            {"step": 2, "timestamp": 3000, "metrics": {"m": 2.0}},
        ]
    )
    assert t.finish() is None
    assert _history(store, run_id, "m") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    assert _history(store, run_id, "n") == [(0, 0.5), (1, 1.5)]
