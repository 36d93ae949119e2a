"""reports/table1-plateau/core_hours.py against a run's seconds worked out by hand, read the same
from a runs export (grids that ran on several machines) and from a run folder's metrics.jsonl."""

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from vapo_lab.track.export import FORMAT

SCRIPT = Path(__file__).resolve().parents[2] / "reports" / "table1-plateau" / "core_hours.py"
# (step, timestamp ms, step seconds or None, evaluated): step 0 is the evaluation before training;
# step 2's row lands 15 s after step 1's, 10 s of it training, so its evaluation took 5 s; step 3
# lands 31 min later: an interruption, not an evaluation
ROWS = [(0, 100_000, None, True), (1, 110_000, 10.0, False), (2, 125_000, 10.0, True),
        (3, 2_000_000, 10.0, True)]  # fmt: skip
# training 3 x 10 s; evaluations: step 2's 5 s, and step 0's counted as the others' mean, 5 s
TRAIN_S, EVAL_S, STEPS = 30.0, 10.0, 3


@pytest.fixture
def core_hours():
    spec = importlib.util.spec_from_file_location("core_hours", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(name, tags, metrics):
    return {"run_id": name, "run_name": name, "status": "FINISHED", "start_time": 0,
            "end_time": 1, "tags": tags, "params": {}, "metrics": metrics}  # fmt: skip


def _export(path):
    metrics = {
        "time/step_s": [[s, ms, t] for s, ms, t, _ in ROWS if t is not None],
        "eval/avg_at_8": [[s, ms, 50.0] for s, ms, _, e in ROWS if e],
        "critic/value_loss": [[s, ms, 1.0] for s, ms, _, _ in ROWS],  # not a time: ignored
    }
    runs = [_run("grid", {"kind": "grid"}, {}), _run("cell", {"cell_key": "vapo-s0"}, metrics)]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"format": FORMAT, "experiment": "g", "runs": runs}, f)


def test_a_run_export_gives_the_seconds_worked_out_by_hand(core_hours, tmp_path, capsys):
    _export(tmp_path / "runs.json.gz")
    core_hours.main([str(tmp_path / "runs.json.gz")])
    out = capsys.readouterr().out
    # the grid's own run has no cell_key: only the cell counts
    assert f"{tmp_path.name}/runs.json.gz: 1 runs, {STEPS} steps;" in out
    assert f"all: {(TRAIN_S + EVAL_S) / 3600:.2f} core-hours" in out


def test_the_export_and_the_run_folder_read_the_same(core_hours, tmp_path):
    _export(tmp_path / "runs.json.gz")
    from vapo_lab.track.export import read_export

    cell = [r for r in read_export(tmp_path / "runs.json.gz")["runs"] if "cell_key" in r["tags"]]
    from_export = core_hours.run_seconds(core_hours.export_rows(cell[0]))
    jsonl = tmp_path / "metrics.jsonl"
    rows = [
        {"step": s, "timestamp_ms": ms}
        | ({"time/step_s": t} if t is not None else {})
        | ({"eval/avg_at_8": 50.0} if e else {})
        for s, ms, t, e in ROWS
    ]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from_folder = core_hours.run_seconds(core_hours.jsonl_rows(jsonl))
    assert from_export == from_folder == pytest.approx((TRAIN_S, EVAL_S, STEPS))
