"""The Slurm launcher (``launcher=slurm``): one prepare job, then one job array of the cells (submitit).

The array depends on the prepare job (``afterok``), so no cell starts before the shared caches
exist. Each array task runs ``CellJobRunner``: on preemption or time limit Slurm signals it,
submitit requeues it, and the new attempt resumes from the last checkpoint. The jobs outlive the
submitting process: ``--no-wait`` returns once they are queued, and ``vapo-lab jobs`` follows them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from vapo_lab.launch.base import LaunchError, Log, Submission
from vapo_lab.launch.cell import CellJob, CellJobRunner, prepare
from vapo_lab.launch.liveness import squeue_states
from vapo_lab.launch.status import FAILED, FINISHED, read_status, write_status


class SlurmLauncher:
    """Submits a grid's cells as a Slurm job array after a prepare job; optionally waits for them."""

    name = "slurm"
    detached = True

    def preflight(self, settings: dict[str, Any]) -> None:
        check_slurm(settings)

    def submit(self, jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Log) -> None:
        import submitit

        grid_dir, grid_id = Path(jobs[0].grid_dir), jobs[0].spec.grid_id
        folder = _slurm_folder(grid_dir, settings)
        ex = submitit.SlurmExecutor(folder=folder)
        params = slurm_parameters(settings, f"vapo-{grid_id}")
        ex.update_parameters(**_prepare_parameters(params))
        try:
            prep = ex.submit(prepare, jobs)
        except Exception as e:  # noqa: BLE001 - sbatch's refusal, in one line
            raise LaunchError(f"sbatch refused the grid's prepare job: {_sbatch_error(e)}; submitted: none "
                              f"of {len(jobs)} cells") from e
        sub.job_ids["prepare"] = str(prep.job_id)
        ex.update_parameters(**_array_parameters(params, str(prep.job_id)))
        try:
            array = ex.map_array(CellJobRunner(), jobs)
        except Exception as e:  # noqa: BLE001
            subprocess.run(["scancel", str(prep.job_id)], capture_output=True, timeout=30)
            raise LaunchError(f"sbatch refused the cells' job array: {_sbatch_error(e)}; submitted: none of "
                              f"{len(jobs)} cells (the prepare job {prep.job_id} was cancelled)") from e
        for j, job in zip(jobs, array):
            sub.job_ids[j.spec.key] = str(job.job_id)
            write_status(grid_dir, j.spec.key, job_id=str(job.job_id))
        log(f"submitted prepare job {prep.job_id} and array {array[0].job_id.split('_')[0]} of {len(jobs)} "
            f"cells; logs in {folder}; follow with `vapo-lab jobs {grid_id}`")

    def wait(self, jobs: list[CellJob], sub: Submission, log: Log) -> None:
        """Waits until every cell's status is final (finished / failed) or its job has left the queue."""
        grid_dir = Path(jobs[0].grid_dir)
        left = {j.spec.key: sub.job_ids[j.spec.key] for j in jobs}
        while left:
            time.sleep(2.0)
            queued = squeue_states([sub.job_ids["prepare"], *left.values()])
            for key in list(left):
                st = read_status(grid_dir, key)
                job_gone = left[key] not in queued and sub.job_ids["prepare"] not in queued
                if st.get("state") in (FINISHED, FAILED) and left[key] not in queued or job_gone:
                    if st.get("state") == FINISHED:
                        sub.finished(key, st, log)
                    else:
                        sub.failed(key, st.get("error") or "job ended without finishing (see its log)", log)
                    del left[key]

    def dry_run_text(self, count: int, settings: dict[str, Any], grid_dir: Path, grid_id: str) -> str:
        """Returns the two sbatch scripts a submission of ``count`` cells would queue ("" for none)."""
        if not count:
            return ""
        from submitit.slurm.slurm import _make_sbatch_string

        folder = _slurm_folder(grid_dir, settings)
        params = slurm_parameters(settings, f"vapo-{grid_id}")
        command = f"{sys.executable} -u -m submitit.core._submit {folder}"
        return "\n".join([
            "\n# sbatch script 1: the prepare job (base model, reward model, pretrained critic)",
            _make_sbatch_string(command=command, folder=folder, **_prepare_parameters(params)),
            f"\n# sbatch script 2: the job array of {count} cells, after the prepare job",
            _make_sbatch_string(command=command, folder=folder, map_count=count,
                                **_array_parameters(params, "<prepare job id>")),
        ])


def check_slurm(settings: dict[str, Any]) -> None:
    """Raises LaunchError when Slurm's commands are missing or the partition does not exist."""
    missing = [c for c in ("sbatch", "squeue", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        raise LaunchError(f"Slurm commands not found on PATH ({', '.join(missing)}): run this on a Slurm "
                          "login node, or use --launcher local (or --launcher ray)")
    partition = settings.get("partition")
    if partition:
        out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30)
        known = sorted(set(out.stdout.split()))
        if out.returncode == 0 and partition not in known:
            raise LaunchError(f"unknown Slurm partition launcher.slurm.partition={partition!r}: this cluster has "
                              f"{', '.join(known) or 'none'}; nothing was submitted")


def slurm_parameters(settings: dict[str, Any], name: str) -> dict[str, Any]:
    """Returns submitit ``SlurmExecutor`` parameters from the launcher.slurm settings."""
    p: dict[str, Any] = {
        "job_name": name, "time": int(settings.get("time_min", 60)), "nodes": int(settings.get("nodes", 1)),
        "cpus_per_task": int(settings.get("cpus_per_task", 1)), "mem": f"{int(settings.get('mem_gb', 8))}GB",
        "array_parallelism": int(settings.get("array_parallelism", 16)),
        "additional_parameters": dict(settings.get("additional_parameters") or {}),
        "setup": list(settings.get("setup") or []), "signal_delay_s": int(settings.get("signal_delay_s", 120)),
    }
    for key in ("partition", "account", "qos", "constraint"):
        if settings.get(key):
            p[key] = str(settings[key])
    if int(settings.get("gpus_per_task", 0)):
        p["gpus_per_task"] = int(settings["gpus_per_task"])
    return p


def _prepare_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """Returns the prepare job's parameters: the grid's, under the name <grid job name>-prepare."""
    return {**params, "job_name": params["job_name"] + "-prepare"}


def _array_parameters(params: dict[str, Any], prepare_job: str) -> dict[str, Any]:
    """Returns the cells' array parameters: the grid's, starting once the prepare job has succeeded
    (and cancelled by Slurm if it failed, instead of waiting for ever)."""
    extra = {**params["additional_parameters"], "kill-on-invalid-dep": "yes"}
    return {**params, "additional_parameters": extra, "dependency": f"afterok:{prepare_job}"}


def _slurm_folder(grid_dir: Path, settings: dict[str, Any]) -> Path:
    # a fresh folder per submission: job ids can restart (a purged cluster), and a reused folder
    # would hold an old job's result
    return grid_dir / str(settings.get("log_dir", "slurm_logs")) / time.strftime("%Y%m%d-%H%M%S")


def _sbatch_error(e: Exception) -> str:
    text = str(getattr(e, "output", b"") or "") or str(e)
    if isinstance(getattr(e, "output", None), bytes):
        text = e.output.decode(errors="replace")  # type: ignore[attr-defined]
    lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()] or [text.strip().splitlines()[-1]]
    return lines[0][:300]
