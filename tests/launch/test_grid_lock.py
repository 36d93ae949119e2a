"""One submitter of a grid at a time, one runner of a cell: real processes.

Before issue 49, two submissions of one grid started together each printed "0 running elsewhere" and
ran every cell twice (``vapo-s0-...`` and ``vapo-s0-...-2``), with two parent runs and a status file
mixing both. Now the second is refused in one line naming the first, and a cell whose lock is held
is not started again.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from vapo_lab.launch.cell import CellJob, run_cell
from vapo_lab.launch.grid import load_grid
from vapo_lab.launch.status import read_status, status_path, write_status
from vapo_lab.locks import Busy, exclusive

from .conftest import SMALL

GRID = "name: lock\nseeds: [0]\ncells:\n  - {name: vapo, algo: vapo}\n"


def _sweep(*extra: str) -> list[str]:
    return [sys.executable, "-m", "vapo_lab.cli", "sweep", "g.yaml", *SMALL, *extra]


def _holder(lock: Path, proc: subprocess.Popen, timeout: float = 300.0) -> dict:
    """Waits until ``proc`` holds the lock ``lock`` (its file names it); returns what it wrote."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            held = json.loads(lock.read_text().splitlines()[0])
            if held["pid"] == proc.pid:
                return held
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{lock} never named pid {proc.pid}")


def _hold(lock: Path) -> subprocess.Popen:
    """Starts a process that holds ``lock`` (``locks.exclusive``) until it is killed."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from vapo_lab.locks import exclusive; "
            "ctx = exclusive(Path(sys.argv[1]), 'x', 'y'); ctx.__enter__(); time.sleep(600)",
            str(lock),
        ]
    )


def test_a_second_submission_of_a_grid_is_refused_naming_the_first(in_tmp):
    (in_tmp / "g.yaml").write_text(GRID)
    first = subprocess.Popen(
        _sweep(), cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        grids = in_tmp / "runs" / "grids"
        deadline = time.monotonic() + 300
        while not list(grids.glob("*.lock")) and time.monotonic() < deadline:
            time.sleep(0.05)
        (lock,) = grids.glob("*.lock")
        _holder(lock, first)
        second = subprocess.run(_sweep(), cwd=in_tmp, capture_output=True, text=True, timeout=300)
        assert first.poll() is None  # refused while the first still ran
    finally:
        out, err = first.communicate(timeout=900)
    assert first.returncode == 0, err[-3000:]
    assert second.returncode == 1
    grid_id = lock.name.removesuffix(".lock")
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(f"error: grid {grid_id} is held by pid {first.pid} on host ")
    assert "vapo-lab sweep g.yaml" in lines[0] and f"vapo-lab jobs {grid_id}" in lines[0]

    # one run of the cell, one folder, one parent
    grid_dir = grids / grid_id
    (key,) = [p.stem for p in (grid_dir / "status").glob("*.json")]
    assert [p.name for p in (grid_dir / "runs").iterdir()] == [key]
    assert read_status(grid_dir, key)["attempts"] == 1
    client = MlflowClient(f"sqlite:///{in_tmp / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("lock").experiment_id])
    assert sorted(r.data.tags.get("kind", "cell") for r in runs) == ["cell", "grid"]

    # the lock went with its holder: the same grid submits again (nothing left to run)
    again = subprocess.run(_sweep(), cwd=in_tmp, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to submit (1 finished" in again.stderr


def test_a_cell_whose_lock_is_held_is_not_started_again(in_tmp):
    (spec,) = load_grid_file(in_tmp).expand(SMALL)
    grid_dir = in_tmp / "runs" / "grids" / "g"
    job = CellJob(spec=spec, grid_dir=str(grid_dir), cwd=str(in_tmp), experiment="lock")
    write_status(grid_dir, spec.key, state="running", pid=12345, host="elsewhere", step=2)
    before = read_status(grid_dir, spec.key)
    lock = status_path(grid_dir, spec.key).with_suffix(".lock")
    holder = _hold(lock)
    try:
        _holder(lock, holder, timeout=60)
        with pytest.raises(Busy, match=rf"^cell {spec.key} is held by pid {holder.pid} on host "):
            run_cell(job)
    finally:
        holder.kill()
        holder.wait()
    assert read_status(grid_dir, spec.key) == before  # the runner's record left alone
    assert not (grid_dir / "runs").exists()
    # its holder gone (killed), the lock is free again
    with exclusive(lock, "cell", "fix"):
        pass


def load_grid_file(folder: Path):
    (folder / "g.yaml").write_text(GRID)
    return load_grid(folder / "g.yaml")


def test_a_submission_reports_a_cell_another_process_runs_by_its_lock(in_tmp):
    # the status says nothing of the other process (it may run on a machine whose pid this one
    # cannot check): the cell is launched, its job finds the lock held and says by whom
    from vapo_lab.launch.actions import run_grid
    from vapo_lab.launch.base import LaunchError

    grid = load_grid_file(in_tmp)
    (spec,) = grid.expand(SMALL)
    grid_dir = in_tmp / "runs" / "grids" / spec.grid_id
    lock = status_path(grid_dir, spec.key).with_suffix(".lock")
    holder = _hold(lock)
    try:
        _holder(lock, holder, timeout=60)
        with pytest.raises(LaunchError) as e:
            run_grid(grid, SMALL, "local", False, True, log=print, out=print)
    finally:
        holder.kill()
        holder.wait()
    said = f"{spec.key}: failed: cell {spec.key} is held by pid {holder.pid} on host "
    assert said in str(e.value), str(e.value)
    assert "failed: None" not in str(e.value)
