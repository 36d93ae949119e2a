"""``vapo-lab jobs`` and ``vapo-lab cancel``: a grid's cells as they stand, and stopping them.

Both read the grid's record and its cells' status files, and ask Slurm (squeue) and this host's
process table whether a cell that says "running" still is.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from vapo_lab.launch.liveness import cell_alive, local_process, pid_alive, squeue_states
from vapo_lab.launch.record import known_job_ids, read_record
from vapo_lab.launch.status import FAILED, FINISHED, PENDING, RUNNING, pct, read_status


def grid_table(grid_dir: Path) -> list[dict[str, Any]]:
    """Returns one row per cell: key, state (with the step or the error), job id, run id."""
    record = read_record(grid_dir)
    known_jobs = known_job_ids(record)
    slurm = squeue_states(list(known_jobs.values()))
    rows = []
    for d in record.get("cells", []):
        key = d["key"]
        st = read_status(grid_dir, key)
        job = st.get("job_id") or known_jobs.get(key)
        state = st.get("state", PENDING)
        if state == RUNNING:
            state = f"running step {st.get('step', 0)}/{st.get('total', '?')}"
            if not cell_alive(st, job, slurm):
                state = (
                    f"stopped at step {st.get('step', 0)} (its process is gone: resubmit to resume)"
                )
        elif state == FAILED:
            state = f"failed: {st.get('error')}"
        elif state == PENDING and job and job in slurm:
            state = f"pending ({slurm[job].lower()} in Slurm)"
        elif state == FINISHED and st.get("final_eval") is not None:
            state = f"finished (eval {pct(st.get('final_eval'))})"
        rows.append(
            {"cell": key, "state": state, "job_id": job or "", "run_id": st.get("run_id", "")}
        )
    return rows


def cancel_grid(grid_dir: Path) -> list[str]:
    """Cancels a grid's queued and running cells (Slurm jobs; local/Ray processes on this host)."""
    record = read_record(grid_dir)
    done = []
    # every submission's jobs, not only the latest per cell: an earlier array may still be queued
    job_ids = sorted(
        {
            v.split("_")[0]
            for s in record.get("submissions", [])
            for v in s.get("job_ids", {}).values()
        }
    )
    live = squeue_states(job_ids)
    live_arrays = sorted({j.split("_")[0] for j in live})
    if live_arrays:
        subprocess.run(["scancel", *live_arrays], capture_output=True, timeout=60)
        done.append(f"scancel {' '.join(live_arrays)}")
    for d in record.get("cells", []):
        st = read_status(grid_dir, d["key"])
        if local_process(st) and pid_alive(int(st.get("pid") or -1)):
            os.kill(int(st["pid"]), signal.SIGTERM)
            done.append(f"SIGTERM {d['key']} (pid {st['pid']})")
    return done
