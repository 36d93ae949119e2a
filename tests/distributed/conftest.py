"""Runs scripts on 1 or 2 CPU ranks (gloo) with torchrun; `group`: a process group of this one
process."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vapo_lab.distributed.world import World

REPO = Path(__file__).resolve().parents[2]


def torchrun(
    nproc: int, script: Path, *args: str, timeout: int = 300
) -> subprocess.CompletedProcess:
    """Runs ``script args`` on ``nproc`` ranks of this machine; raises with the ranks' output on
    failure."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            str(script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture
def group(monkeypatch):
    """A process group of this one process (gloo): the sharded code paths, in-process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(k, v)
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    yield World(0, 1, 0, True)
    torch.distributed.destroy_process_group()
