"""reports/table1-plateau/carry.py: a grid's finished runs carried to a fresh machine through files,
end to end on a real two-cell grid: the fresh machine's resubmission runs only the cell that had not
finished, and the report sees each cell once, the carried one under its original id."""

import importlib.util
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.launch.conftest import SMALL
from vapo_lab.launch.actions import run_grid
from vapo_lab.launch.grid import load_grid
from vapo_lab.launch.record import find_grid
from vapo_lab.launch.status import read_status, write_status
from vapo_lab.report.collect import load_runs
from vapo_lab.track.export import read_export

SCRIPT = Path(__file__).resolve().parents[2] / "reports" / "table1-plateau" / "carry.py"
# value pretraining logs its own step numbers into the run: more of them than training steps
CONFIG = [*SMALL, "critic.pretrain.steps=5"]
GRID = "name: g\nseeds: [0]\ncells:\n  - {name: vapo, algo: vapo}\n  - {name: dapo, algo: dapo}\n"


@pytest.fixture
def carry(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("carry", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "CARRIED", tmp_path / "carried")
    return module


def _cells(root):
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("g").experiment_id])
    return {r.data.tags["cell"]: r for r in runs if r.data.tags.get("kind") != "grid"}


@pytest.mark.slow
def test_a_fresh_machine_runs_only_what_had_not_finished(carry, tmp_path, monkeypatch):
    old, new = tmp_path / "old", tmp_path / "new"
    for root in (old, new):
        root.mkdir()
        (root / "g.yaml").write_text(GRID)
    monkeypatch.chdir(old)
    run_grid(load_grid(old / "g.yaml"), CONFIG, "local", False, True, log=print, out=print)
    grid_dir = find_grid("runs", None)
    cells = _cells(old)
    # dapo as a cell cut short by the machine's end: running in its status file and in MLflow
    dapo_key = cells["dapo"].data.tags["cell_key"]
    write_status(grid_dir, dapo_key, state="running")
    MlflowClient(f"sqlite:///{old / 'mlflow.db'}").set_terminated(
        cells["dapo"].info.run_id, status="RUNNING"
    )

    carry.save(old)
    vapo_key = cells["vapo"].data.tags["cell_key"]
    # only the finished one
    assert os.listdir(tmp_path / "carried" / "g") == [f"{vapo_key}.json.gz"]
    saved = (tmp_path / "carried" / "g" / f"{vapo_key}.json.gz").read_bytes()
    assert [
        r["run_id"] for r in read_export(tmp_path / "carried" / "g" / f"{vapo_key}.json.gz")["runs"]
    ] == [cells["vapo"].info.run_id]

    carry.restore(new)
    carry.restore(new)  # idempotent: nothing imported twice
    restored = _cells(new)
    assert list(restored) == ["vapo"]
    status = read_status(new / "runs" / "grids" / grid_dir.name, vapo_key)
    assert status["state"] == "finished" and status["carried_from"] == cells["vapo"].info.run_id
    assert status["run_id"] == restored["vapo"].info.run_id != cells["vapo"].info.run_id
    assert (
        status["final_eval"] == cells["vapo"].data.metrics["eval/avg_at_2"] and status["step"] == 3
    )

    monkeypatch.chdir(new)
    logs = []
    run_grid(
        load_grid(new / "g.yaml"), CONFIG, "local", False, True, log=logs.append, out=logs.append
    )
    assert any("1 cell(s) to run on local, 1 finished" in line for line in logs), logs
    after = _cells(new)
    assert set(after) == {"vapo", "dapo"} and after["dapo"].info.status == "FINISHED"
    # the report: one run a cell, the carried one under the id it had where it ran
    ids = {r.variant: r.run_id for r in load_runs(f"sqlite:///{new / 'mlflow.db'}", "g")}
    assert ids == {"VAPO": cells["vapo"].info.run_id, "DAPO": after["dapo"].info.run_id}
    # dapo run again from scratch on the fresh machine (its caches rebuilt): the history it had
    histories = [
        [
            (m.step, m.value)
            for m in sorted(
                MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_metric_history(
                    run.info.run_id, "eval/avg_at_2"
                ),
                key=lambda m: m.step,
            )
        ]
        for root, run in ((old, cells["dapo"]), (new, after["dapo"]))
    ]
    assert histories[0] == histories[1] and len(histories[0]) == 2

    carry.save(new)  # now both; the carried vapo's file is left as it was
    assert sorted(os.listdir(tmp_path / "carried" / "g")) == sorted(
        [f"{vapo_key}.json.gz", f"{dapo_key}.json.gz"]
    )
    assert (tmp_path / "carried" / "g" / f"{vapo_key}.json.gz").read_bytes() == saved
