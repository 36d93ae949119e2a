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


@pytest.mark.timeout(2400)  # ~15 minutes here; bounded should the warnings come too early
def test_a_time_limit_shorter_than_the_critic_start_advances_every_attempt_to_the_uninterrupted_run(
    slurm, in_tmp, monkeypatch
):
    # a 2-minute time limit; value pretraining (3000 rounds of ~50-100 ms) alone outlasts an
    # attempt, and no periodic save anywhere (critic.save_every null: 10 minutes; save_every 1000):
    # each attempt stops, saving, at Slurm's warning (20 s before the limit, or up to a minute
    # earlier: Slurm checks on a timer) or before a round or step it measures it cannot finish and
    # save in time, whichever comes first, and the next attempt resumes exactly there
    steps = [*SMALL, "trainer.total_steps=300", "trainer.eval_every=100", "tracking=none"]
    steps += ["trainer.save_every=1000", "critic.rm_steps=100", "critic.pretrain.steps=3000"]
    limit = ["launcher.slurm.time_min=2", "launcher.slurm.signal_delay_s=20"]
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]  # VAPO
    # the reference: uninterrupted, on the local launcher, in a folder of its own (its own caches)
    (in_tmp / "ref").mkdir()
    monkeypatch.chdir(in_tmp / "ref")
    ref = run_grid(grid, steps, "local", False, True, log=print, out=print)
    monkeypatch.chdir(in_tmp)
    result = run_grid(
        grid, [*steps, *SLURM[:2], *limit], "slurm", False, True, log=print, out=print
    )
    (key,) = result.submitted
    assert result.results == {key: "finished"}
    grid_dir = in_tmp / "runs" / "grids" / result.grid_id
    st = json.loads((grid_dir / "status" / f"{key}.json").read_text())
    assert st["attempts"] >= 2 and st["step"] == 300
    log = "".join(p.read_text() for p in sorted((grid_dir / "slurm_logs").rglob("*.err")))
    # every attempt's rank 0 read its deadline from squeue
    lefts = [int(n) for n in re.findall(r"the job's time limit is (\d+) s away", log)]
    assert len(lefts) == st["attempts"] and all(0 < n <= 120 for n in lefts), lefts
    # the critic's start stopped (value pretraining at least: it alone outlasts an attempt) and
    # resumed exactly where it saved; so did the steps
    for kind in ("reward model", "pretrained critic"):
        stops = [int(n) for n in re.findall(rf"stopped the {kind} build after round (\d+)", log)]
        starts = [int(n) for n in re.findall(rf"resumed the {kind} build at round (\d+)", log)]
        assert stops == starts and stops == sorted(set(stops)), (kind, log[-3000:])
        assert kind == "reward model" or (stops and stops[0] > 0)
    stops = [int(n) for n in re.findall(r"stopped after step (\d+) of 300", log)]
    starts = [int(n) for n in re.findall(r"resumed \S+ at step (\d+)", log)]
    assert set(stops) <= set(starts) and all(0 < n < 300 for n in stops), (stops, starts)
    reasons = re.findall(r"stopped .*? \((SIGUSR2|time limit)\)", log)
    assert len(reasons) == st["attempts"] - 1, reasons  # every attempt but the last stopped so
    run_dir = grid_dir / "runs" / key
    ref_dir = in_tmp / "ref" / "runs" / "grids" / ref.grid_id / "runs" / key

    def pretrain_rows(folder):
        rows = [json.loads(ln) for ln in (folder / "metrics.jsonl").read_text().splitlines()]
        return [
            {k: v for k, v in r.items() if k != "timestamp_ms"}
            for r in rows
            if "pretrain/value_loss" in r
        ]

    pretrain = pretrain_rows(run_dir)
    assert [r["step"] for r in pretrain] == list(range(3000))  # each round logged once, in order
    assert pretrain == pretrain_rows(ref_dir)
    resumed = last_metrics(run_dir)
    assert sorted(resumed) == list(range(301)) and resumed == last_metrics(ref_dir)
