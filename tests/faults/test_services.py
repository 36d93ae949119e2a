"""Faults outside the process: a Slurm job cancelled mid-run and its grid resubmitted, the MLflow
server stopped and restarted mid-run. Each run ends with the uninterrupted run's history, each
step logged once. Slow: `pytest -m slow tests/faults` (.ci/run starts the local Slurm first)."""

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.launch.conftest import slurm  # noqa: F401 - the fixture
from vapo_lab.launch.actions import run_grid
from vapo_lab.launch.base import LaunchError
from vapo_lab.launch.grid import load_grid
from vapo_lab.track.server import MlflowServer

from .conftest import RUN, assert_like_reference, records, store

pytestmark = pytest.mark.slow


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, what, timeout=900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def _train_steps(run_dir):
    try:
        return {s for kind, s in records(run_dir) if kind == "train"}
    except (FileNotFoundError, json.JSONDecodeError):
        return set()


def test_scancel_then_resubmit_resumes_to_the_uninterrupted_history(
    slurm,  # noqa: F811
    workdir,
    monkeypatch,
):
    monkeypatch.chdir(workdir)
    # long enough that the cancel lands mid-run; checkpoints every 10 steps
    steps = [
        o
        for o in RUN
        if not o.startswith(("trainer.total_steps", "trainer.save_every", "trainer.eval_every"))
    ]
    steps += [
        "trainer.total_steps=60",
        "trainer.save_every=10",
        "trainer.eval_every=30",
        f"tracking.uri={store(workdir)}",
        "trainer.threads=1",
    ]
    grid = load_grid("table1")
    grid.cells = grid.cells[2:3]  # VAPO
    ref = run_grid(grid, [*steps, "output_dir=ref"], "local", False, True, log=print, out=print)
    (key,) = ref.submitted
    slurm_args = [
        "launcher.slurm.cpus_per_task=1",
        "launcher.slurm.mem_gb=1",
        "launcher.slurm.time_min=15",
    ]
    status_file = workdir / "runs" / "grids" / ref.grid_id / "status" / f"{key}.json"
    run_dir = workdir / "runs" / "grids" / ref.grid_id / "runs" / key

    import threading

    first = threading.Thread(
        target=lambda: pytest.raises(
            LaunchError, run_grid, grid, [*steps, *slurm_args], "slurm", False, True, print, print
        )
    )
    first.start()
    _wait_for(lambda: len(_train_steps(run_dir)) >= 14, "step 14 of the Slurm run")
    job = json.loads(status_file.read_text())["job_id"]
    subprocess.run(["scancel", job], check=True, capture_output=True)
    first.join(timeout=300)
    logged = _train_steps(run_dir)
    assert max(logged) < 60  # it really stopped mid-run
    again = run_grid(grid, [*steps, *slurm_args], "slurm", False, True, log=print, out=print)
    assert again.results == {key: "finished"}
    reference = workdir / "ref" / "grids" / ref.grid_id / "runs" / key
    assert_like_reference(run_dir, reference, store(workdir))


def test_mlflow_server_stopped_and_restarted_mid_run(workdir, tmp_path):
    port = _free_port()
    server_store = tmp_path / "server-store"
    srv = MlflowServer("127.0.0.1", port, server_store).__enter__()
    args = [o for o in RUN if not o.startswith(("trainer.total_steps", "trainer.eval_every"))]
    # long enough (~0.2 s a step) that the outage and the restart both land mid-run
    args += [
        "trainer.total_steps=200",
        "trainer.eval_every=100",
        f"tracking.uri={srv.url}",
        "run_name=outage",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vapo_lab.cli", "train", "--quiet", *args],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = workdir / "runs" / "outage"
    try:
        _wait_for(lambda: len(_train_steps(run_dir)) >= 3, "step 3")
        srv.stop()  # the server goes away mid-run
        down_at = len(_train_steps(run_dir))
        _wait_for(
            lambda: len(_train_steps(run_dir)) >= down_at + 10, "10 steps with the server down"
        )
        srv = MlflowServer("127.0.0.1", port, server_store).__enter__()  # and comes back
        out, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, err[-3000:]
        assert err.count("spooling metrics") == 1 and err.count("answers again") == 1, err
        assert _train_steps(run_dir) == set(range(201))
        reference = workdir / "runs" / "reference-200"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "vapo_lab.cli",
                "train",
                "--quiet",
                *[a for a in args if not a.startswith(("tracking.uri", "run_name"))],
                f"tracking.uri={store(workdir)}",
                "run_name=reference-200",
            ],
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert_like_reference(run_dir, reference, srv.url)
    finally:
        proc.kill()
        srv.stop()
