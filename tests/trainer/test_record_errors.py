"""A run's record when things fail around it: a full disk while it records a failure, a spool cut
short, a tracking store that cannot be opened. The first error is the one the user hears; the
MLflow run is still marked FAILED (KILLED for an interrupt); nothing is left behind."""

import pytest
from mlflow.tracking import MlflowClient

from vapo_lab.config.compose import compose_config
from vapo_lab.config.schema import typed
from vapo_lab.track import TrackingError
from vapo_lab.trainer.record import RunRecord


def config(tmp_path, uri=None):
    """A run's typed config, tracking to a sqlite store in ``tmp_path``."""
    store = uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
    overrides = [
        "run_name=r",
        f"output_dir={tmp_path / 'runs'}",
        "tracking=mlflow",
        f"tracking.uri={store}",
        "tracking.experiment=e",
        f"tracking.spool_dir={tmp_path / 'spool'}",
    ]
    return typed(compose_config(overrides=overrides).cfg)


def opened(tmp_path, said):
    record = RunRecord(config(tmp_path), {}, None, "test", None, None, log=said.append)
    record.open()
    return record


def status(tmp_path, record):
    return MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(record.run_id).info.status


@pytest.mark.parametrize(
    "error, expected",
    [(OSError(28, "No space left on device"), "FAILED"), (KeyboardInterrupt(), "KILLED")],
)
def test_a_full_disk_while_writing_failure_txt_masks_nothing_and_the_run_is_still_ended(
    tmp_path, error, expected
):
    said = []
    record = opened(tmp_path, said)
    failure = record.run_dir / "failure.txt"
    failure.symlink_to("/dev/full")  # every write to it: OSError ENOSPC, as on a full disk
    # before the fix: raised ENOSPC on top of `error`, the run left RUNNING
    record.close_on_error(error, 3)
    assert status(tmp_path, record) == expected
    assert not failure.exists()  # no empty failure.txt left to mislead
    told = [line for line in said if "failure.txt" in line]
    assert len(told) == 1 and "No space left on device" in told[0] and "\n" not in told[0]


def test_a_spool_cut_short_by_a_full_disk_does_not_stop_the_run_being_marked_failed(tmp_path):
    said = []
    record = opened(tmp_path, said)
    spool = tmp_path / "spool" / f"{record.run_id}.jsonl"
    spool.parent.mkdir(parents=True)
    spool.write_text('{"step": 1, "timestamp": 1, "metrics": {"m": 1.0}}\n{"step": 2, "timest')
    # before the fix: JSONDecodeError, the run left RUNNING
    record.close_on_error(RuntimeError("boom"), 2)
    assert status(tmp_path, record) == "FAILED"
    assert "RuntimeError: boom" in (record.run_dir / "failure.txt").read_text()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [(m.step, m.value) for m in client.get_metric_history(record.run_id, "m")] == [(1, 1.0)]


def test_a_store_that_cannot_be_opened_fails_in_one_line_and_leaves_no_run_folder(tmp_path):
    (tmp_path / "mlflow.db").write_bytes(b"not a database" * 100)
    with pytest.raises(TrackingError) as raised:
        RunRecord(config(tmp_path), {}, None, "test", None, None, log=print)
    message = str(raised.value)
    assert (
        "\n" not in message
        and str(tmp_path / "mlflow.db") in message
        and "tracking=none" in message
    )
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []
