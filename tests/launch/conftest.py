"""Shared pieces of the launcher tests: a small, fast cell config and grid files."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.trainer.conftest import SMALL as TRAINER_SMALL

# the trainer tests' small base model, reward model and critic (built in seconds), with 3 steps,
# one eval at the end, one thread per cell, and tracking left to each test
_CHANGED = {"trainer.total_steps": "3", "trainer.eval_every": "3", "trainer.threads": "1"}
SMALL = [
    f"{o.split('=')[0]}={_CHANGED[o.split('=')[0]]}" if o.split("=")[0] in _CHANGED else o
    for o in TRAINER_SMALL
    if o != "tracking=none"
]

# three cells of Table 1: enough to see tags, skipping and resuming without the ten-cell cost
GRID3 = """\
name: mini
seeds: [0]
cells:
  - {name: ppo, algo: ppo}
  - {name: vapo, algo: vapo}
  - {name: vapo-no-clip_higher, algo: vapo, drop: [clip_higher]}
"""


@pytest.fixture
def in_tmp(tmp_path):
    """Runs the test in its own working directory (caches, runs/ and mlflow.db land there)."""
    old = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)


def shared_dir() -> Path:
    """Returns the shared folder with slurm/ (VAPO_SHARED, else ../shared beside the repository)."""
    env = os.environ.get("VAPO_SHARED")
    if env:
        return Path(env)
    for candidate in (Path(__file__).resolve().parents[3] / "shared", Path("/work/shared")):
        if (candidate / "slurm").is_dir():
            return candidate
    return Path(__file__).resolve().parents[3] / "shared"


@pytest.fixture(scope="session")
def slurm():
    """A real single-node Slurm: the running one, else started with shared/slurm's script."""
    if (
        shutil.which("sinfo")
        and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
    ):
        yield
        return
    script = shared_dir() / "slurm" / "start-local-slurm.sh"
    if not script.is_file():
        pytest.skip(f"no Slurm here and no {script} to start one (set VAPO_SHARED)")
    subprocess.run(["bash", str(script)], check=True, capture_output=True, timeout=600)
    yield
    subprocess.run(
        ["bash", str(script.with_name("stop-local-slurm.sh"))], capture_output=True, timeout=120
    )
