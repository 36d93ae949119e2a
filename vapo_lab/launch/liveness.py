"""Whether a cell that says "running" still runs: in a live Slurm job, or a live process here.

A status file only says what its job last wrote; a job killed without a word (``kill -9``, a lost
node, a cancelled array) leaves "running" behind. The submission (skip cells still running,
rerun the others), ``vapo-lab jobs`` (running or stopped) and ``vapo-lab cancel`` ask these.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vapo_lab.launch.status import RUNNING

# squeue states of a job that is queued or still holds its cell
LIVE_SLURM_STATES = (
    "PENDING",
    "RUNNING",
    "CONFIGURING",
    "COMPLETING",
    "REQUEUED",
    "RESIZING",
    "SUSPENDED",
)


def slurm_job_id() -> str | None:
    """Returns this process's Slurm job id (array jobs: <array id>_<task>), None outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def squeue_states(job_ids: Sequence[str]) -> dict[str, str]:
    """Returns {job id: Slurm state} of the jobs ``job_ids`` squeue still knows, arrays expanded."""
    ids = sorted({j.split("_")[0] for j in job_ids if j})
    if not ids or shutil.which("squeue") is None:
        return {}
    out = subprocess.run(
        ["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(ids)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def pid_alive(pid: int) -> bool:
    """True when process ``pid`` exists on this host and is not a zombie."""
    try:
        os.kill(pid, 0)
    except (OSError, TypeError):
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def local_process(status: dict[str, Any]) -> bool:
    """True when a status record says its cell runs in a process of this host, outside Slurm."""
    return (
        status.get("state") == RUNNING
        and status.get("host") == socket.gethostname()
        and not status.get("job_id")
    )


def cell_alive(status: dict[str, Any], job_id: str | None, slurm: dict[str, str]) -> bool:
    """True when the cell is queued or running in a live Slurm job, or in a live local process."""
    if job_id and job_id in slurm:
        return slurm[job_id] in LIVE_SLURM_STATES
    if local_process(status):
        return pid_alive(int(status.get("pid") or -1))
    return False
