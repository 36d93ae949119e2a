"""A run killed with SIGKILL and resumed logs the same metrics as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.trainer.conftest import SMALL, last_metrics


def _cli(*args):
    return [sys.executable, "-m", "vapo_lab.cli", "train", "--quiet", *args]


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(workdir):
    steps = ["trainer.total_steps=6"]
    full = subprocess.run(
        _cli(*SMALL, *steps, "run_name=full"),
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert full.returncode == 0, full.stderr[-2000:]

    proc = subprocess.Popen(
        _cli(*SMALL, *steps, "run_name=killed"),
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ckpt = workdir / "runs" / "killed" / "checkpoints" / "step_000003"
    deadline = time.time() + 600
    while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ckpt.exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "timed out"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = last_metrics(workdir / "runs" / "killed")
    assert max(done) < 6  # it really was stopped mid-run

    resumed = subprocess.run(
        _cli("resume=runs/killed"), cwd=workdir, capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed" in resumed.stderr
    a, b = last_metrics(workdir / "runs" / "full"), last_metrics(workdir / "runs" / "killed")
    assert sorted(a) == sorted(b) == list(range(7))
    for step in range(4, 7):
        assert json.dumps(a[step], sort_keys=True) == json.dumps(b[step], sort_keys=True), step
