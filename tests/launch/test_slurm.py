"""Grids on a real Slurm (shared/slurm's single-node cluster) through submitit, logging to a real
MLflow server on loopback: tags, idempotent resubmission, kill-and-requeue resume, bad input.

Slow (minutes): run with `pytest -m slow`; .ci/run starts the local Slurm first.
"""

import json
import re
import socket
import subprocess
import time

import pytest
from mlflow.tracking import MlflowClient

from tests.trainer.conftest import last_metrics
from vapo_lab.launch.actions import run_grid
from vapo_lab.launch.base import LaunchError
from vapo_lab.launch.grid import load_grid
from vapo_lab.launch.jobs import grid_table
from vapo_lab.launch.record import find_grid
from vapo_lab.track.server import MlflowServer

from .conftest import SMALL

pytestmark = pytest.mark.slow

SLURM = ["launcher.slurm.cpus_per_task=1", "launcher.slurm.mem_gb=1", "launcher.slurm.time_min=15"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server(tmp_path_factory):
    with MlflowServer("127.0.0.1", _free_port(), tmp_path_factory.mktemp("mlflow")) as srv:
        yield srv


def test_table1_on_slurm_lands_tagged_in_the_server_and_resubmission_submits_nothing(
    slurm, in_tmp, server
):
    """The issue's "done when": `vapo-lab ablate --table1 --seeds 1 --launcher slurm` with a few
    steps."""
    overrides = [*SMALL, *SLURM, f"tracking.uri={server.url}"]
    sub = run_grid(
        load_grid("table1", seeds=1), overrides, "slurm", False, True, log=print, out=print
    )
    assert len(sub.submitted) == 10 and set(sub.results.values()) == {"finished"}
    assert "prepare" in sub.job_ids
    assert len({sub.job_ids[k].split("_")[0] for k in sub.submitted}) == 1  # one job array

    client = MlflowClient(server.url)
    exp = client.get_experiment_by_name("table1")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("kind") == "grid"]
    cells = {r.data.tags["cell"]: r for r in runs if r.data.tags.get("kind") != "grid"}
    assert sorted(cells) == sorted(c["name"] for c in load_grid("table1").cells)
    for name, r in cells.items():
        t = r.data.tags
        assert r.info.status == "FINISHED" and t["mlflow.parentRunId"] == parent.info.run_id
        assert t["grid_id"] == sub.grid_id and t["seed"] == "0" and len(t["config_hash"]) == 16
        assert "rollout/reward" in r.data.metrics and "eval/avg_at_2" in r.data.metrics
        assert t["algo"] == ("ppo" if name == "ppo" else "dapo" if name == "dapo" else "vapo")
        dropped = name.removeprefix("vapo-no-") if name.startswith("vapo-no-") else "none"
        assert t["dropped"] == dropped
        if dropped != "none":
            assert t[f"component.{dropped}"] == "off"
    jobs = {r["cell"]: r for r in grid_table(sub.grid_dir)}
    assert all(r["state"].startswith("finished") and r["job_id"] for r in jobs.values())

    before = subprocess.run(
        ["sacct", "-X", "-n", "-o", "JobID"], capture_output=True, text=True
    ).stdout.split()
    again = run_grid(
        load_grid("table1", seeds=1), overrides, "slurm", False, True, log=print, out=print
    )
    assert again.submitted == [] and sorted(again.skipped_finished) == sorted(sub.submitted)
    assert "prepare" not in again.job_ids
    after = subprocess.run(
        ["sacct", "-X", "-n", "-o", "JobID"], capture_output=True, text=True
    ).stdout.split()
    assert after == before  # not a single new job
    assert len(client.search_runs([exp.experiment_id])) == len(runs)


def test_a_cell_requeued_mid_run_resumes_and_ends_with_the_uninterrupted_metrics(slurm, in_tmp):
    # long enough that the requeue lands mid-run: Slurm lets a job run KillWait (5 s on the local
    # cluster) after the requeue's SIGTERM, and a step of this config takes ~0.1 s
    steps = [*SMALL, "trainer.total_steps=200", "trainer.eval_every=50", "tracking=none"]
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]  # VAPO
    # the reference: the same cell, uninterrupted, on the local launcher in another folder
    ref = run_grid(grid, [*steps, "output_dir=ref"], "local", False, True, log=print, out=print)
    (key,) = ref.submitted

    done = []
    import threading

    def submit():
        done.append(run_grid(grid, [*steps, *SLURM], "slurm", False, True, log=print, out=print))

    t = threading.Thread(target=submit)
    t.start()
    status_file = in_tmp / "runs" / "grids" / ref.grid_id / "status" / f"{key}.json"
    deadline = time.time() + 300
    while time.time() < deadline:
        st = json.loads(status_file.read_text()) if status_file.is_file() else {}
        if st.get("state") == "running" and st.get("step", 0) >= 3:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the cell never reached step 3: {st}")
    subprocess.run(["scontrol", "requeue", st["job_id"]], check=True, capture_output=True)
    t.join(timeout=600)
    assert done and done[0].results == {key: "finished"}

    st = json.loads(status_file.read_text())
    assert st["attempts"] == 2  # it really ran twice
    run_dir = in_tmp / "runs" / "grids" / ref.grid_id / "runs" / key
    resumed = last_metrics(run_dir)
    reference = last_metrics(in_tmp / "ref" / "grids" / ref.grid_id / "runs" / key)
    assert sorted(resumed) == list(range(201)) and resumed == reference
    log = "".join(p.read_text() for p in (run_dir.parents[1] / "slurm_logs").rglob("*.err"))
    assert "resumed" in log and "REQUEUE" in log


@pytest.mark.timeout(1500)  # ~8 minutes here; bounded should the warnings come too early
def test_a_time_limit_shorter_than_save_every_still_advances_every_attempt(slurm, in_tmp):
    # a 2-minute time limit, Slurm's warning 60 s before it (sent up to a minute early: Slurm checks
    # on a timer), 1000 steps of ~0.1 s and no periodic save before the end: each attempt saves at
    # its first safe point after the warning, the job requeues and the next attempt resumes there
    steps = [*SMALL, "trainer.total_steps=1000", "trainer.eval_every=1000", "tracking=none"]
    steps += ["trainer.save_every=1000"]
    limit = ["launcher.slurm.time_min=2", "launcher.slurm.signal_delay_s=60"]
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]  # VAPO
    result = run_grid(
        grid, [*steps, *SLURM[:2], *limit], "slurm", False, True, log=print, out=print
    )
    (key,) = result.submitted
    assert result.results == {key: "finished"}
    grid_dir = in_tmp / "runs" / "grids" / result.grid_id
    st = json.loads((grid_dir / "status" / f"{key}.json").read_text())
    assert st["attempts"] >= 2 and st["step"] == 1000
    run_dir = grid_dir / "runs" / key
    assert sorted(last_metrics(run_dir)) == list(range(1001))  # every step logged once
    log = "".join(p.read_text() for p in sorted((grid_dir / "slurm_logs").rglob("*.err")))
    # every stop at the warning saved its step, and an attempt resumed from exactly there
    stops = [int(n) for n in re.findall(r"stopped after step (\d+) of 1000 \(SIGUSR2\)", log)]
    starts = [int(n) for n in re.findall(r"resumed \S+ at step (\d+)", log)]
    assert stops and stops == sorted(set(stops)) and 0 < stops[0] and stops[-1] < 1000
    assert set(stops) <= set(starts), (stops, starts)


def test_unknown_partition_fails_in_one_line_before_submitting(slurm, in_tmp):
    grid = load_grid("table1")
    grid.cells = grid.cells[:1]
    with pytest.raises(
        LaunchError,
        match=r"unknown Slurm partition launcher.slurm.partition='nope': this "
        r"cluster has debug; nothing was submitted",
    ):
        run_grid(
            grid,
            [*SMALL, *SLURM, "launcher.slurm.partition=nope"],
            "slurm",
            False,
            True,
            log=print,
            out=print,
        )


def test_rejected_sbatch_reports_what_was_submitted(slurm, in_tmp):
    grid = load_grid("table1")
    grid.cells = grid.cells[:2]
    with pytest.raises(
        LaunchError, match=r"sbatch refused the grid's prepare job: .*; submitted: none of 2 cells"
    ):
        run_grid(
            grid,
            [*SMALL, *SLURM, "launcher.slurm.mem_gb=100000"],
            "slurm",
            False,
            True,
            log=print,
            out=print,
        )
    grid_dir = find_grid("runs", None)
    # nothing ran: each cell says why, not "pending" for ever (resubmitting starts them afresh)
    assert all(
        r["state"].startswith("failed: launch failed: sbatch refused") and not r["job_id"]
        for r in grid_table(grid_dir)
    )
