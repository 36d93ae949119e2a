"""Runs scripts on 1 or 2 CPU ranks (gloo) with torchrun."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def torchrun(nproc: int, script: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs ``script args`` on ``nproc`` ranks of this machine; raises with the ranks' output on failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(nproc), str(script), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    return done
