"""Launch a grid's cells: local worker processes, Ray tasks, or one Slurm job array (submitit).

``submit_grid`` is the one entry point (``vapo-lab sweep`` / ``vapo-lab ablate --table1``):

1. every cell's config is composed and checked, the tracking store and the launcher (Slurm
   commands and partition, Ray address) are checked — all before anything is submitted;
2. the grid's folder ``<output_dir>/grids/<grid id>/`` is created or reopened (``grid.json``: the
   cells, the parent MLflow run, every submission and its job ids);
3. cells already finished are skipped, cells still running in a live job are left alone, the
   rest are submitted: first one job that prepares the shared caches (base model, reward model,
   pretrained critic), then the cells (on Slurm: a job array that depends on that job).

The grid id is a hash of the cells' config hashes, so the same grid submitted again reopens the
same folder and the same MLflow runs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vapo_lab.errors import VapoLabError
from vapo_lab.launch.cell import (
    FAILED,
    FINISHED,
    PENDING,
    RUNNING,
    CellJob,
    CellJobRunner,
    prepare,
    read_status,
    run_cell,
    write_status,
)
from vapo_lab.launch.grid import CellSpec, Grid

LAUNCHERS = ("local", "ray", "slurm")


class LaunchError(VapoLabError):
    """A grid could not be (fully) submitted; the message says what was and what was not."""


@dataclass
class Submission:
    """What ``submit_grid`` did."""

    grid_id: str
    grid_dir: Path
    submitted: list[str] = field(default_factory=list)  # cell keys
    skipped_finished: list[str] = field(default_factory=list)
    skipped_running: list[str] = field(default_factory=list)
    job_ids: dict[str, str] = field(default_factory=dict)  # cell key -> job id (Slurm)
    results: dict[str, str] = field(default_factory=dict)  # cell key -> finished / failed: <line>
    dry_run_text: str = ""


# -------------------------------------------------------------------------------------------------
# The grid's folder


def grid_dir_for(output_dir: str | Path, grid_id: str) -> Path:
    return (Path(output_dir) / "grids" / grid_id).resolve()


def read_record(grid_dir: Path) -> dict[str, Any]:
    path = grid_dir / "grid.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_record(grid_dir: Path, record: dict[str, Any]) -> None:
    grid_dir.mkdir(parents=True, exist_ok=True)
    tmp = grid_dir / f".grid.json.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, grid_dir / "grid.json")


def find_grid(output_dir: str | Path, grid: str | None) -> Path:
    """Returns the folder of grid id ``grid`` (or a unique prefix of it), the latest one when None."""
    root = Path(output_dir) / "grids"
    found = sorted((p for p in root.glob("*") if (p / "grid.json").is_file()), key=lambda p: (p / "grid.json").stat().st_mtime)
    if not found:
        raise LaunchError(f"no grid under {root}: submit one with `vapo-lab ablate --table1` or `vapo-lab sweep FILE`")
    if grid is None:
        return found[-1].resolve()
    if Path(grid).is_dir() and (Path(grid) / "grid.json").is_file():
        return Path(grid).resolve()
    match = [p for p in found if p.name == grid] or [p for p in found if p.name.startswith(grid)]
    if len(match) != 1:
        names = ", ".join(p.name for p in found[-5:])
        raise LaunchError(f"grid {grid!r} {'is ambiguous' if match else 'not found'} under {root} (recent: {names})")
    return match[0].resolve()


# -------------------------------------------------------------------------------------------------
# Liveness: is a cell that says "running" still running somewhere?


def squeue_states(job_ids: Sequence[str]) -> dict[str, str]:
    """Returns {job id: Slurm state} for the jobs of ``job_ids`` still known to squeue (arrays expanded)."""
    ids = sorted({j.split("_")[0] for j in job_ids if j})
    if not ids or shutil.which("squeue") is None:
        return {}
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(ids)], capture_output=True,
                         text=True, timeout=30)
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (OSError, TypeError):
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def cell_alive(status: dict[str, Any], job_id: str | None, slurm: dict[str, str]) -> bool:
    """True when the cell is queued or running in a live Slurm job, or in a live local process."""
    if job_id and job_id in slurm:
        return slurm[job_id] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING",
                                 "SUSPENDED")
    if status.get("state") == RUNNING and status.get("host") == socket.gethostname() and not status.get("job_id"):
        return _pid_alive(int(status.get("pid") or -1))
    return False


# -------------------------------------------------------------------------------------------------
# Submission


def launcher_settings(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg.launcher, resolve=True)


def submit_grid(grid: Grid, specs: list[CellSpec], cfg: DictConfig, launcher: str, dry_run: bool = False,
                wait: bool = True, log: Callable[[str], None] = print) -> Submission:
    """Submits the cells of ``grid`` that still need to run; see the module docstring.

    Args:
        grid: the loaded grid (name, experiment).
        specs: its expanded cells (``Grid.expand``), all sharing one grid id.
        cfg: a composed config holding the submission's ``launcher`` and ``tracking`` settings and
            ``output_dir`` (the first cell's config does).
        launcher: local | ray | slurm.
        dry_run: print what would run (and the sbatch scripts) and submit nothing.
        wait: Slurm only: wait for the array to end (local and Ray always wait).
        log: where progress lines go.
    """
    if launcher not in LAUNCHERS:
        raise LaunchError(f"--launcher {launcher}: unknown; choose one of {', '.join(LAUNCHERS)}")
    settings = launcher_settings(cfg).get(launcher, {})
    grid_id = specs[0].grid_id
    grid_dir = grid_dir_for(cfg.output_dir, grid_id)
    record = read_record(grid_dir)
    sub = Submission(grid_id=grid_id, grid_dir=grid_dir)

    # which cells need a run
    known_jobs = {k: v for s in record.get("submissions", []) for k, v in s.get("job_ids", {}).items()}
    slurm = squeue_states(list(known_jobs.values())) if known_jobs else {}
    todo: list[CellSpec] = []
    for s in specs:
        st = read_status(grid_dir, s.key)
        if st.get("state") == FINISHED:
            sub.skipped_finished.append(s.key)
        elif cell_alive(st, known_jobs.get(s.key), slurm):
            sub.skipped_running.append(s.key)
        else:
            todo.append(s)

    cwd = os.getcwd()
    if dry_run:
        sub.dry_run_text = _dry_run_text(grid, specs, todo, sub, launcher, settings, grid_dir, cwd)
        return sub

    # checks that must pass before anything is submitted
    if launcher == "slurm":
        check_slurm(settings)
    if launcher == "ray" and settings.get("address") and settings.get("address") != "auto":
        _check_reachable(str(settings["address"]))
    parent = _parent_run(grid, specs, cfg, record, launcher, grid_dir)  # also checks the tracking server

    record = {**record, "grid_id": grid_id, "name": grid.name, "experiment": grid.experiment,
              "source": grid.source, "created": record.get("created", time.time()), "parent_run_id": parent,
              "tracking_uri": _tracking_uri(cfg), "output_dir": str(Path(cfg.output_dir).resolve()),
              "cells": [s.to_json() for s in specs], "submissions": record.get("submissions", [])}
    write_record(grid_dir, record)
    if not todo:
        log(f"grid {grid_id}: nothing to submit ({len(sub.skipped_finished)} finished, "
            f"{len(sub.skipped_running)} still running)")
        if not sub.skipped_running:
            _end_parent(cfg, parent, "FINISHED")
        return sub
    jobs = [CellJob(spec=s, grid_dir=str(grid_dir), cwd=cwd, experiment=grid.experiment, parent_run_id=parent)
            for s in todo]
    for j in jobs:  # failed or stopped cells start over as pending (their run resumes)
        write_status(grid_dir, j.spec.key, state="pending", launcher=launcher, error=None, job_id=None)
    entry: dict[str, Any] = {"time": time.time(), "launcher": launcher, "cells": [j.spec.key for j in jobs],
                             "job_ids": {}}
    record["submissions"].append(entry)
    write_record(grid_dir, record)
    log(f"grid {grid_id}: {len(jobs)} cell(s) to run on {launcher}, {len(sub.skipped_finished)} finished, "
        f"{len(sub.skipped_running)} running elsewhere; folder {grid_dir}")
    try:
        if launcher == "local":
            _run_local(jobs, int(settings.get("workers", 1)), grid_dir, sub, log)
        elif launcher == "ray":
            started_ray = _ray_init(settings)
            try:
                _run_ray(jobs, settings, sub, log)
            finally:
                if started_ray:
                    import ray

                    ray.shutdown()
        else:
            try:
                _submit_slurm(jobs, settings, grid_dir, grid_id, sub, log)
            finally:
                entry["job_ids"] = dict(sub.job_ids)
                entry["prepare_job"] = sub.job_ids.get("prepare")
                write_record(grid_dir, record)
            if wait:
                _wait_slurm(jobs, sub, log)
    except BaseException as e:
        # the launch itself failed (or was interrupted): no cell may stay "pending" for ever
        reason = "interrupted" if isinstance(e, KeyboardInterrupt) else f"launch failed: {str(e).splitlines()[0][:300]}"
        for j in jobs:
            if read_status(grid_dir, j.spec.key).get("state") in (PENDING, RUNNING) and not sub.job_ids.get(j.spec.key):
                write_status(grid_dir, j.spec.key, state=FAILED, error=reason)
        _end_parent(cfg, parent, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    sub.submitted = [j.spec.key for j in jobs]
    if launcher != "slurm" or wait:  # a Slurm grid left running keeps its parent RUNNING
        _end_parent(cfg, parent, "FINISHED" if all(sub.results.get(j.spec.key) == FINISHED for j in jobs)
                    else "FAILED")
    return sub


def _end_parent(cfg: DictConfig, parent: str | None, status: str) -> None:
    """Marks the grid's parent run ``status``: FINISHED when every submitted cell finished."""
    if parent is not None and cfg.tracking.backend != "none":
        from vapo_lab.track.mlflow_tracker import set_run_status

        set_run_status(_tracking_uri(cfg), parent, status)


def _tracking_uri(cfg: DictConfig) -> str:
    if cfg.tracking.backend == "none":
        return "none"
    from vapo_lab.track import resolve_tracking_uri

    return resolve_tracking_uri(cfg.tracking.uri)


def _parent_run(grid: Grid, specs: list[CellSpec], cfg: DictConfig, record: dict[str, Any], launcher: str,
                grid_dir: Path) -> str | None:
    """Returns the grid's parent MLflow run id, RUNNING until the submission ends (created on first
    submission; raises when the tracking server is down, before anything is submitted)."""
    if cfg.tracking.backend == "none":
        return None
    from vapo_lab.track import make_tracker
    from vapo_lab.track.mlflow_tracker import set_run_status

    tracker = make_tracker(cfg.tracking.backend, cfg.tracking.uri, grid.experiment, cfg.tracking.spool_dir)
    if record.get("parent_run_id") and record.get("tracking_uri") == _tracking_uri(cfg):
        from vapo_lab.track.mlflow_tracker import check_server

        if tracker.uri.startswith(("http://", "https://")):
            check_server(tracker.uri)
        set_run_status(tracker.uri, record["parent_run_id"], "RUNNING")
        return record["parent_run_id"]
    tags = {"grid_id": specs[0].grid_id, "grid": grid.name, "kind": "grid", "launcher": launcher}
    params = {"source": grid.source, "cells": len(specs), "seeds": ",".join(map(str, grid.seeds)),
              "grid_dir": str(grid_dir), "cell_names": ",".join(sorted({s.name for s in specs})),
              "command": " ".join(["vapo-lab", *sys.argv[1:]])}
    run_id = tracker.start(specs[0].grid_id, tags, params)
    tracker.close()
    return run_id


# -------------------------------------------------------------------------------------------------
# local


def _run_local(jobs: list[CellJob], workers: int, grid_dir: Path, sub: Submission,
               log: Callable[[str], None]) -> None:
    """Runs the prepare step, then the cells, each in a fresh process (``workers`` at a time)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    if workers < 1:
        raise LaunchError(f"launcher.local.workers={workers}: must be >= 1")
    ctx = multiprocessing.get_context("spawn")
    logs = grid_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        pool.submit(_logged, prepare, jobs, logs / "prepare.log").result()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, max_tasks_per_child=1) as pool:
        futures = {pool.submit(_logged, run_cell, j, logs / f"{j.spec.key}.log"): j for j in jobs}
        for f in as_completed(futures):
            key = futures[f].spec.key
            try:
                st = f.result()
                sub.results[key] = FINISHED
                log(f"  {key}: finished (final eval {_pct(st.get('final_eval'))})")
            except BrokenProcessPool as e:
                write_status(grid_dir, key, state=FAILED, error=f"worker process died: {e}")
                sub.results[key] = f"failed: worker process died ({e})"
                log(f"  {key}: {sub.results[key]}")
            except Exception:  # noqa: BLE001 - one failed cell does not stop the others
                sub.results[key] = f"failed: {read_status(grid_dir, key).get('error')}"
                log(f"  {key}: {sub.results[key]} (log {logs / (key + '.log')})")


def _logged(fn: Callable[[Any], Any], arg: Any, log_file: Path) -> Any:
    """Calls fn(arg) with this process's stdout and stderr appended to ``log_file``."""
    with open(log_file, "a", buffering=1, encoding="utf-8") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        sys.stdout = sys.stderr = f
        return fn(arg)


def _pct(v: Any) -> str:
    return "n/a" if v is None else f"{100 * float(v):.1f}"


# -------------------------------------------------------------------------------------------------
# Ray


def _ray_init(settings: dict[str, Any]) -> bool:
    """Connects to the configured Ray cluster (or starts a local one); returns True when this call
    connected (so the caller shuts it down); raises LaunchError if unreachable.

    A local Ray started here listens on 127.0.0.1 only, unless ``launcher.ray.expose=true``: anyone
    who can reach a Ray port can run code on it (Ray's security notes). Ray has no bind option of
    its own for this; its switch for a loopback-only node (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    meant for laptops) makes every Ray process of the node use and listen on 127.0.0.1.
    """
    address = settings.get("address")
    loopback = not address and not settings.get("expose", False)
    previous = os.environ.get(_RAY_LOOPBACK_ENV)
    if loopback:
        os.environ[_RAY_LOOPBACK_ENV] = "0"  # read when ray is imported, and by the processes it starts
    try:
        import ray
    except ImportError as e:
        raise LaunchError("the Ray launcher needs `ray` (pip install 'ray>=2.9'), or use --launcher local") from e
    if ray.is_initialized():
        return False
    from ray._private import ray_constants

    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    if loopback:
        ray_constants.ENABLE_RAY_CLUSTER = False  # the env var is read at import: ray may be imported already
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # never let Ray re-resolve this env with uv
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR",
                              "configure_logging": False}
    if address and address != "auto":
        _check_reachable(address)
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=settings.get("cluster_cpus") or os.cpu_count(), **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure to connect is reported in one line
        raise LaunchError(f"cannot connect to Ray at launcher.ray.address={address!r}: "
                          f"{str(e).strip().splitlines()[0][:200]}; start it with `ray start --head`, "
                          "or leave launcher.ray.address unset for a local Ray") from e
    finally:
        if loopback:  # the node is started: later connections in this process decide for themselves
            ray_constants.ENABLE_RAY_CLUSTER = cluster_mode
            if previous is None:
                os.environ.pop(_RAY_LOOPBACK_ENV, None)
            else:
                os.environ[_RAY_LOOPBACK_ENV] = previous
    return True


_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _check_reachable(address: str) -> None:
    """Raises LaunchError unless host:port of a Ray address answers a TCP connection within 5 s
    (``ray.init`` itself retries an unreachable address for minutes)."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(f"launcher.ray.address={address!r} is not host:port (or ray://host:port, or auto)")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise LaunchError(f"cannot connect to Ray at launcher.ray.address={address!r}: {e.strerror or e}; "
                          "start it with `ray start --head`, or leave launcher.ray.address unset for a "
                          "local Ray; nothing was submitted") from e


def _run_ray(jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Callable[[str], None]) -> None:
    import ray

    grid_dir = Path(jobs[0].grid_dir)
    logs = grid_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # max_calls=1: a fresh worker process per cell (its output is redirected to the cell's log)
    resources = {"num_cpus": float(settings.get("num_cpus", 1)), "num_gpus": float(settings.get("num_gpus", 0)),
                 "max_retries": 0, "max_calls": 1}
    ray.get(ray.remote(**resources)(_logged).remote(prepare, jobs, logs / "prepare.log"))
    remote = ray.remote(**resources)(_logged)
    refs = {remote.remote(run_cell, j, logs / f"{j.spec.key}.log"): j for j in jobs}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        key = refs[done[0]].spec.key
        try:
            st = ray.get(done[0])
            sub.results[key] = FINISHED
            log(f"  {key}: finished (final eval {_pct(st.get('final_eval'))})")
        except Exception:  # noqa: BLE001 - one failed cell does not stop the others
            sub.results[key] = f"failed: {read_status(grid_dir, key).get('error')}"
            log(f"  {key}: {sub.results[key]} (log {logs / (key + '.log')})")


# -------------------------------------------------------------------------------------------------
# Slurm (submitit)


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


def _slurm_folder(grid_dir: Path, log_dir: str) -> Path:
    # a fresh folder per submission: job ids can restart (a purged cluster), and a reused folder
    # would hold an old job's result
    return grid_dir / log_dir / time.strftime("%Y%m%d-%H%M%S")


def _submit_slurm(jobs: list[CellJob], settings: dict[str, Any], grid_dir: Path, grid_id: str, sub: Submission,
                  log: Callable[[str], None]) -> None:
    import submitit

    folder = _slurm_folder(grid_dir, str(settings.get("log_dir", "slurm_logs")))
    ex = submitit.SlurmExecutor(folder=folder)
    params = slurm_parameters(settings, f"vapo-{grid_id}")
    ex.update_parameters(**{**params, "job_name": f"vapo-{grid_id}-prepare"})
    try:
        prep = ex.submit(prepare, jobs)
    except Exception as e:  # noqa: BLE001 - sbatch's refusal, in one line
        raise LaunchError(f"sbatch refused the grid's prepare job: {_sbatch_error(e)}; submitted: none "
                          f"of {len(jobs)} cells") from e
    sub.job_ids["prepare"] = str(prep.job_id)
    extra = {**params["additional_parameters"], "kill-on-invalid-dep": "yes"}
    ex.update_parameters(**{**params, "additional_parameters": extra, "dependency": f"afterok:{prep.job_id}"})
    try:
        array = ex.map_array(CellJobRunner(), jobs)
    except Exception as e:  # noqa: BLE001
        subprocess.run(["scancel", str(prep.job_id)], capture_output=True, timeout=30)
        raise LaunchError(f"sbatch refused the cells' job array: {_sbatch_error(e)}; submitted: none of "
                          f"{len(jobs)} cells (the prepare job {prep.job_id} was cancelled)") from e
    for j, job in zip(jobs, array):
        sub.job_ids[j.spec.key] = str(job.job_id)
        write_status(grid_dir, j.spec.key, job_id=str(job.job_id))
    log(f"submitted prepare job {prep.job_id} and array {array[0].job_id.split('_')[0]} of {len(jobs)} cells; "
        f"logs in {folder}; follow with `vapo-lab jobs {grid_id}`")


def _sbatch_error(e: Exception) -> str:
    text = str(getattr(e, "output", b"") or "") or str(e)
    if isinstance(getattr(e, "output", None), bytes):
        text = e.output.decode(errors="replace")  # type: ignore[attr-defined]
    lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()] or [text.strip().splitlines()[-1]]
    return lines[0][:300]


def _wait_slurm(jobs: list[CellJob], sub: Submission, log: Callable[[str], None]) -> None:
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
                state = st.get("state")
                if state == FINISHED:
                    sub.results[key] = FINISHED
                    log(f"  {key}: finished (final eval {_pct(st.get('final_eval'))})")
                else:
                    sub.results[key] = f"failed: {st.get('error') or 'job ended without finishing (see its log)'}"
                    log(f"  {key}: {sub.results[key]}")
                del left[key]


def _dry_run_text(grid: Grid, specs: list[CellSpec], todo: list[CellSpec], sub: Submission, launcher: str,
                  settings: dict[str, Any], grid_dir: Path, cwd: str) -> str:
    lines = [f"grid {specs[0].grid_id} ({grid.source}): {len(specs)} run(s), experiment {grid.experiment!r}, "
             f"folder {grid_dir}",
             f"{'cell':<44} {'seed':>4}  {'config':<16}  state"]
    todo_keys = {s.key for s in todo}
    for s in specs:
        state = ("finished: skip" if s.key in sub.skipped_finished else
                 "running: skip" if s.key in sub.skipped_running else "would run")
        label = s.name + "".join(f" {k}={v}" for k, v in s.sweep.items())
        lines.append(f"{label:<44} {s.seed:>4}  {s.config_hash:<16}  {state}")
        extra = [o for o in s.overrides if not o.startswith("seed=")]
        drop = f"--algo {s.algo}" + "".join(f" --drop {d}" for d in s.drop)
        lines.append(f"    {drop}{' ' + ' '.join(extra) if extra else ''}")
    lines.append(f"{len(todo_keys)} to run on {launcher}")
    if launcher == "slurm" and todo:
        from submitit.slurm.slurm import _make_sbatch_string

        folder = _slurm_folder(grid_dir, str(settings.get("log_dir", "slurm_logs")))
        params = slurm_parameters(settings, f"vapo-{specs[0].grid_id}")
        command = f"{sys.executable} -u -m submitit.core._submit {folder}"
        lines.append("\n# sbatch script 1: the prepare job (base model, reward model, pretrained critic)")
        lines.append(_make_sbatch_string(command=command, folder=folder,
                                         **{**params, "job_name": params["job_name"] + "-prepare"}))
        lines.append(f"\n# sbatch script 2: the job array of {len(todo)} cells, after the prepare job")
        extra = {**params["additional_parameters"], "kill-on-invalid-dep": "yes"}
        lines.append(_make_sbatch_string(command=command, folder=folder, map_count=len(todo),
                                         **{**params, "additional_parameters": extra,
                                            "dependency": "afterok:<prepare job id>"}))
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------
# jobs / cancel


def grid_table(grid_dir: Path) -> list[dict[str, Any]]:
    """Returns one row per cell: key, state (with the step or the error), job id, run id."""
    record = read_record(grid_dir)
    known_jobs = {k: v for s in record.get("submissions", []) for k, v in s.get("job_ids", {}).items()}
    slurm = squeue_states(list(known_jobs.values()))
    rows = []
    for d in record.get("cells", []):
        key = d["key"]
        st = read_status(grid_dir, key)
        job = st.get("job_id") or known_jobs.get(key)
        state = st.get("state", "pending")
        if state == RUNNING:
            state = f"running step {st.get('step', 0)}/{st.get('total', '?')}"
            if not cell_alive(st, job, slurm):
                state = f"stopped at step {st.get('step', 0)} (its process is gone: resubmit to resume)"
        elif state == FAILED:
            state = f"failed: {st.get('error')}"
        elif state == "pending" and job and job in slurm:
            state = f"pending ({slurm[job].lower()} in Slurm)"
        elif state == FINISHED and st.get("final_eval") is not None:
            state = f"finished (eval {_pct(st.get('final_eval'))})"
        rows.append({"cell": key, "state": state, "job_id": job or "", "run_id": st.get("run_id", "")})
    return rows


def cancel_grid(grid_dir: Path) -> list[str]:
    """Cancels a grid's queued and running cells (Slurm jobs; local/Ray processes on this host)."""
    record = read_record(grid_dir)
    done = []
    job_ids = sorted({v.split("_")[0] for s in record.get("submissions", []) for v in s.get("job_ids", {}).values()})
    live = squeue_states(job_ids)
    live_arrays = sorted({j.split("_")[0] for j in live})
    if live_arrays:
        subprocess.run(["scancel", *live_arrays], capture_output=True, timeout=60)
        done.append(f"scancel {' '.join(live_arrays)}")
    import signal

    for d in record.get("cells", []):
        st = read_status(grid_dir, d["key"])
        if st.get("state") == RUNNING and not st.get("job_id") and st.get("host") == socket.gethostname() \
                and _pid_alive(int(st.get("pid") or -1)):
            os.kill(int(st["pid"]), signal.SIGTERM)
            done.append(f"SIGTERM {d['key']} (pid {st['pid']})")
    return done
