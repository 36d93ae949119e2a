"""The tracker's background sender when the spool cannot be written (a full disk): it keeps
going."""

import threading

from mlflow.tracking import MlflowClient

from vapo_lab.track import MlflowTracker


def flushed(tracker, timeout=30.0):
    """True once everything logged so far has been sent or spooled within ``timeout`` seconds."""
    done = threading.Event()
    threading.Thread(target=lambda: (tracker.flush(), done.set()), daemon=True).start()
    return done.wait(timeout)


def test_a_spool_that_cannot_be_written_does_not_stop_the_sender(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    said = []
    t = MlflowTracker(uri, "exp", spool_dir=tmp_path / "spool", log=said.append, retry_s=0)
    run_id = t.start("r", {}, {})
    real = t.client.log_batch
    monkeypatch.setattr(
        t.client, "log_batch", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("down"))
    )
    monkeypatch.setattr(
        t, "_append", lambda record: (_ for _ in ()).throw(OSError(28, "No space left on device"))
    )
    t.log_metrics({"m": 1.0}, 1)
    t.log_metrics({"m": 2.0}, 2)
    assert flushed(t)  # before the fix the sender died at the first failed spool write: flush hung
    monkeypatch.setattr(t.client, "log_batch", real)
    t.log_metrics({"m": 3.0}, 3)
    assert flushed(t)
    assert t.finish() is None
    client = MlflowClient(uri)
    assert [m.step for m in client.get_metric_history(run_id, "m")] == [3]
    assert client.get_run(run_id).info.status == "FINISHED"
    lost = [line for line in said if "No space left on device" in line]
    assert len(lost) == 1 and "metrics.jsonl" in lost[0]
