"""`vapo-lab jobs` states and `cancel`, from status files written by hand (no runs)."""

import os
import socket
import subprocess
import sys
import time

from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.launch.jobs import cancel_grid, grid_table
from vapo_lab.launch.record import find_grid, write_record
from vapo_lab.launch.status import write_status


def _grid(tmp_path, keys):
    grid_dir = tmp_path / "runs" / "grids" / "g-12345678"
    write_record(
        grid_dir, {"grid_id": grid_dir.name, "cells": [{"key": k} for k in keys], "submissions": []}
    )
    return grid_dir


def test_states_read_from_status_files(tmp_path):
    grid_dir = _grid(tmp_path, ["a", "b", "c", "d", "e"])
    host = socket.gethostname()
    write_status(grid_dir, "a", state="finished", final_eval=0.525, run_id="r1")
    write_status(
        grid_dir, "b", state="running", step=7, total=80, host=host, pid=os.getpid(), run_id="r2"
    )
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_status(grid_dir, "c", state="running", step=3, total=80, host=host, pid=dead.pid)
    write_status(grid_dir, "d", state="failed", error="ValueError: loss is NaN at step 12")
    rows = {r["cell"]: r for r in grid_table(grid_dir)}
    assert rows["a"]["state"] == "finished (eval 52.5)" and rows["a"]["run_id"] == "r1"
    assert rows["b"]["state"] == "running step 7/80"
    assert rows["c"]["state"].startswith("stopped at step 3 (its process is gone")
    assert rows["d"]["state"] == "failed: ValueError: loss is NaN at step 12"
    assert rows["e"]["state"] == "pending" and rows["e"]["job_id"] == ""


def test_cancel_stops_a_local_cell_process_and_jobs_cli_lists_it(tmp_path):
    grid_dir = _grid(tmp_path, ["a"])
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    write_status(
        grid_dir, "a", state="running", step=4, total=10, host=socket.gethostname(), pid=proc.pid
    )
    r = CliRunner().invoke(app, ["jobs", "--output-dir", str(tmp_path / "runs")])
    assert r.exit_code == 0 and "running step 4/10" in r.output
    done = cancel_grid(find_grid(tmp_path / "runs", "g-1234"))
    assert done == [f"SIGTERM a (pid {proc.pid})"]
    assert proc.wait(timeout=10) != 0
    time.sleep(0.1)
    assert grid_table(grid_dir)[0]["state"].startswith("stopped at step 4")


def test_jobs_without_any_grid_says_how_to_make_one(tmp_path):
    r = CliRunner().invoke(app, ["jobs", "--output-dir", str(tmp_path / "runs")])
    assert r.exit_code == 1 and "vapo-lab ablate --table1" in r.output
