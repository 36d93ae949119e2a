"""The Ray launcher on a local Ray cluster (started by the launcher), and an unreachable address."""

import pytest

from vapo_lab.launch.actions import run_grid
from vapo_lab.launch.base import LaunchError
from vapo_lab.launch.grid import load_grid
from vapo_lab.launch.jobs import grid_table

from .conftest import SMALL


@pytest.mark.slow
def test_ray_runs_table1_and_skips_it_when_resubmitted(in_tmp):
    overrides = [*SMALL, "launcher.ray.num_cpus=1"]
    sub = run_grid(
        load_grid("table1", seeds=1), overrides, "ray", False, True, log=print, out=print
    )
    assert len(sub.submitted) == 10 and set(sub.results.values()) == {"finished"}
    assert all(r["state"].startswith("finished") and r["run_id"] for r in grid_table(sub.grid_dir))
    again = run_grid(
        load_grid("table1", seeds=1), overrides, "ray", False, True, log=print, out=print
    )
    assert again.submitted == [] and len(again.skipped_finished) == 10


def test_unreachable_ray_address_fails_before_anything_is_submitted(in_tmp):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    grid = load_grid("table1")
    grid.cells = grid.cells[:1]
    with pytest.raises(
        LaunchError, match=f"cannot connect to Ray at launcher.ray.address='127.0.0.1:{port}'"
    ):
        run_grid(
            grid,
            [*SMALL, f"launcher.ray.address=127.0.0.1:{port}"],
            "ray",
            False,
            True,
            log=print,
            out=print,
        )
    assert not list((in_tmp / "runs" / "grids").glob("*/status/*.json"))


def test_a_failed_ray_launch_marks_its_cells_and_parent_failed(in_tmp, monkeypatch):
    import json

    from mlflow.tracking import MlflowClient

    from vapo_lab.launch import ray as ray_launcher

    def no_ray(settings):
        raise LaunchError("Ray could not start (test)")

    monkeypatch.setattr(ray_launcher, "ray_init", no_ray)
    grid = load_grid("table1")
    grid.cells = grid.cells[:2]
    with pytest.raises(LaunchError, match="Ray could not start"):
        run_grid(grid, [*SMALL], "ray", False, True, log=print, out=print)
    statuses = [
        json.loads(p.read_text()) for p in (in_tmp / "runs" / "grids").glob("*/status/*.json")
    ]
    assert len(statuses) == 2
    assert all(
        s["state"] == "failed" and "launch failed: Ray could not start" in s["error"]
        for s in statuses
    )
    record = json.loads(next((in_tmp / "runs" / "grids").glob("*/grid.json")).read_text())
    parent = MlflowClient(record["tracking_uri"]).get_run(record["parent_run_id"])
    assert parent.info.status == "FAILED"
