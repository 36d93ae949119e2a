"""Shared pieces of the launcher tests: a small, fast cell config and grid files."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# a base model, reward model and critic small enough to build in seconds (as tests/trainer's)
SMALL = [
    "task.options.max_digits=3", "task.n_train=128", "task.n_eval=16",
    "model.arch.hidden_size=64", "model.arch.num_layers=2", "model.arch.intermediate_size=128",
    "+model.base.steps=200", "+model.base.eval_samples=1",
    "rollout.responses_per_step=16", "rollout.group_size=4", "rollout.max_new_tokens=16",
    "rollout.eval_samples=2", "trainer.mini_batch_size=8", "trainer.micro_batch_size=8",
    "trainer.total_steps=3", "trainer.eval_every=3", "trainer.save_every=1", "trainer.threads=1",
    "critic.pretrain.steps=2", "critic.rm_steps=2", "critic.rm_batch=16", "reward.overlong.l_cache=4",
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
    if shutil.which("sinfo") and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0:
        yield
        return
    script = shared_dir() / "slurm" / "start-local-slurm.sh"
    if not script.is_file():
        pytest.skip(f"no Slurm here and no {script} to start one (set VAPO_SHARED)")
    subprocess.run(["bash", str(script)], check=True, capture_output=True, timeout=600)
    yield
    subprocess.run(["bash", str(script.with_name("stop-local-slurm.sh"))], capture_output=True, timeout=120)
