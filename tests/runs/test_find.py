"""Finding runs on disk: the latest run, a run by its tracking id, its complete checkpoints by
step."""

import json
import os

from vapo_lab.runs.checkpoint import STATE_FILE
from vapo_lab.runs.find import checkpoint_step, checkpoints, latest_run, run_info, run_with_id


def _run(root, name, run_id, mtime):
    folder = root / name
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"run_id": run_id}))
    os.utime(folder / "run.json", (mtime, mtime))
    return folder


def test_latest_run_and_run_by_id(tmp_path):
    assert latest_run(tmp_path) is None and run_with_id("a" * 32, tmp_path) is None
    older = _run(tmp_path, "older", "a" * 32, 1_000)
    newer = _run(tmp_path, "newer", "b" * 32, 2_000)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{not json")  # skipped, not fatal
    assert latest_run(tmp_path) == tmp_path / "broken"  # the newest run.json, readable or not
    os.utime(tmp_path / "broken" / "run.json", (500, 500))
    assert latest_run(tmp_path) == newer
    assert run_with_id("a" * 32, tmp_path) == older and run_with_id("c" * 32, tmp_path) is None
    assert run_info(older) == {"run_id": "a" * 32}


def test_checkpoints_by_step_are_the_complete_ones(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False)):  # step 6 has no trainer state yet
        folder = tmp_path / "checkpoints" / f"step_{step:06d}"
        folder.mkdir(parents=True)
        if complete:
            (folder / STATE_FILE).write_bytes(b"")
    (tmp_path / "checkpoints" / "step_latest").mkdir()
    assert checkpoints(tmp_path) == {
        2: tmp_path / "checkpoints" / "step_000002",
        4: tmp_path / "checkpoints" / "step_000004",
    }
    assert checkpoint_step(tmp_path / "step_000012") == 12
    assert (
        checkpoint_step(tmp_path / "step_latest") is None
        and checkpoint_step(tmp_path / "policy") is None
    )
