"""The local launcher end to end: a small grid in worker processes, tracked in MLflow (SQLite),
resubmitted (nothing runs again), with a crashing cell that does not stop the others."""

import json

import pytest
from mlflow.tracking import MlflowClient

from vapo_lab.cli import app
from vapo_lab.launch.actions import run_grid
from vapo_lab.launch.base import LaunchError
from vapo_lab.launch.grid import load_grid
from vapo_lab.launch.jobs import grid_table
from vapo_lab.launch.record import find_grid
from vapo_lab.trainer.record import machine

from .conftest import SMALL


def _runs(tmp, experiment):
    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def test_local_grid_runs_tags_skips_finished_and_isolates_a_crash(in_tmp):
    grid_file = in_tmp / "g.yaml"
    # no GPU: fails at run time
    grid_file.write_text(
        "name: g\nseeds: [0]\ncells:\n"
        "  - {name: vapo, algo: vapo}\n"
        "  - {name: dapo, algo: dapo}\n"
        "  - {name: broken, algo: grpo, overrides: [trainer.device=cuda:0]}\n"
    )
    logs = []
    with pytest.raises(LaunchError, match="1 cell\\(s\\) failed: broken-s0-.*no CUDA GPU"):
        run_grid(
            load_grid(grid_file),
            [*SMALL, "launcher.local.workers=2"],
            "local",
            False,
            True,
            log=logs.append,
            out=logs.append,
        )
    grid_dir = find_grid("runs", None)
    rows = {r["cell"].split("-s0-")[0]: r for r in grid_table(grid_dir)}
    assert rows["vapo"]["state"].startswith("finished") and rows["dapo"]["state"].startswith(
        "finished"
    )
    assert rows["broken"]["state"].startswith(
        "failed: ConfigError: trainer.device=cuda:0 but no CUDA GPU"
    )

    runs = _runs(in_tmp, "g")
    children = [r for r in runs if r.data.tags.get("kind") != "grid"]
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "grid"]
    assert parent.data.params["command"].startswith("vapo-lab")
    # the broken one never started a run
    assert {r.data.tags["cell"] for r in children} == {
        "vapo",
        "dapo",
    }
    for r in children:
        t = r.data.tags
        assert t["mlflow.parentRunId"] == parent.info.run_id and t["grid_id"] == grid_dir.name
        assert t["seed"] == "0" and t["algo"] == r.data.tags["cell"] and t["dropped"] == "none"
        assert t["cell_key"] == f"{t['cell']}-s0-{t['config_hash'][:8]}"
        assert t["machine"] == machine()
        assert r.info.status == "FINISHED"
        assert r.data.metrics["eval/avg_at_2"] >= 0 and "rollout/reward" in r.data.metrics
        run_dir = grid_dir / "runs" / t["cell_key"]
        assert json.loads((run_dir / "run.json").read_text())["run_id"] == r.info.run_id

    # the same grid again, the broken cell fixed by an override it does not see: nothing re-runs,
    # the broken cell is retried (and fails the same way), no MLflow run is duplicated
    logs.clear()
    with pytest.raises(LaunchError, match="1 cell\\(s\\) failed"):
        run_grid(
            load_grid(grid_file),
            [*SMALL, "launcher.local.workers=2"],
            "local",
            False,
            True,
            log=logs.append,
            out=logs.append,
        )
    assert any("1 cell(s) to run on local, 2 finished" in line for line in logs)
    assert len(_runs(in_tmp, "g")) == len(runs)


def test_resubmitting_a_finished_grid_submits_nothing(in_tmp):
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]  # VAPO only
    first = run_grid(grid, SMALL, "local", False, True, log=print, out=print)
    assert len(first.submitted) == 1 and first.results == {first.submitted[0]: "finished"}
    again = run_grid(grid, SMALL, "local", False, True, log=print, out=print)
    assert again.submitted == [] and again.skipped_finished == first.submitted
    status = json.loads((again.grid_dir / "status" / f"{first.submitted[0]}.json").read_text())
    assert status["attempts"] == 1 and status["step"] == 3


def test_cli_dry_run_prints_the_cells_and_sbatch_scripts_and_submits_nothing(in_tmp):
    from typer.testing import CliRunner

    r = CliRunner().invoke(
        app,
        [
            "ablate",
            "--table1",
            "--dry-run",
            "--launcher",
            "slurm",
            "--seeds",
            "2",
            "launcher.slurm.partition=gpu",
            "launcher.slurm.gpus_per_task=8",
            "launcher.slurm.setup=[module load cuda]",
            "trainer.total_steps=5",
        ],
    )
    assert r.exit_code == 0, r.output
    assert r.output.count("would run") == 20
    assert "#SBATCH --partition=gpu" in r.output and "#SBATCH --array=0-19%16" in r.output
    assert "#SBATCH --gpus-per-task=8" in r.output and "module load cuda" in r.output
    assert "#SBATCH --dependency='afterok:<prepare job id>'" in r.output
    assert not (in_tmp / "runs").exists()


def test_missing_slurm_commands_name_the_local_launcher(in_tmp, monkeypatch):
    monkeypatch.setenv("PATH", str(in_tmp))  # no sbatch anywhere
    grid = load_grid("table1")
    grid.cells = grid.cells[:1]
    with pytest.raises(LaunchError, match="Slurm commands not found.*--launcher local"):
        run_grid(grid, SMALL, "slurm", False, True, log=print, out=print)
    assert not list((in_tmp / "runs" / "grids").glob("*/grid.json"))


def test_tracking_server_down_fails_before_anything_runs(in_tmp):
    import socket

    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    grid = load_grid("table1")
    grid.cells = grid.cells[:1]
    from vapo_lab.track import TrackingError

    with pytest.raises(TrackingError, match=f"127.0.0.1:{port} is not answering"):
        run_grid(
            grid,
            [*SMALL, f"tracking.uri=http://127.0.0.1:{port}"],
            "local",
            False,
            True,
            log=print,
            out=print,
        )
    assert not list((in_tmp / "runs" / "grids").glob("*/status/*.json"))


def test_unknown_launcher_and_missing_grid(in_tmp):
    grid = load_grid("table1")
    grid.cells = grid.cells[:1]
    with pytest.raises(
        LaunchError, match="unknown launcher 'kube': valid names are local, ray, slurm"
    ):
        run_grid(grid, SMALL, "kube", False, True, log=print, out=print)
    with pytest.raises(LaunchError, match="no grid under runs"):
        find_grid("runs", None)
