"""Submitting a grid the same way whatever the launcher (``vapo-lab sweep``, ``ablate --table1``).

``submit_grid`` runs the launcher's preflight checks and checks the tracking store before
anything is submitted; creates or reopens the grid's folder (``vapo_lab.launch.record``); skips
the cells already finished and those still running in a live job; and hands the rest to the
launcher: first one job that prepares the shared caches, then the cells. The grid id hashes the
cells' configs, so the same grid submitted again reopens the same folder and the same MLflow runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from vapo_lab.launch.base import Launcher, Log, Submission
from vapo_lab.launch.cell import CellJob
from vapo_lab.launch.grid import CellSpec, Grid
from vapo_lab.launch.liveness import cell_alive, squeue_states
from vapo_lab.launch.parent import end_parent, heal_tracking, start_parent, tracking_uri
from vapo_lab.launch.record import grid_dir_for, known_job_ids, read_record, write_record
from vapo_lab.launch.status import FAILED, FINISHED, PENDING, RUNNING, read_status, write_status
from vapo_lab.locks import exclusive
from vapo_lab.track.mlflow_tracker import spool_folder


def submit_grid(
    grid: Grid,
    specs: list[CellSpec],
    cfg: DictConfig,
    launcher: Launcher,
    dry_run: bool = False,
    wait: bool = True,
    log: Log = print,
) -> Submission:
    """Submits the cells of ``grid`` that still need to run; see the module docstring.

    One submission of a grid at a time (``<grid id>.lock`` beside its folder, held until this
    returns): a second one, whichever command made it, is refused in one line naming the first,
    before it reads a status or writes anything. A dry run takes no lock.

    Args:
        specs: the grid's expanded cells (``Grid.expand``), all sharing one grid id.
        cfg: a composed config holding the submission's ``launcher`` and ``tracking`` settings and
            ``output_dir`` (the first cell's config does).
        dry_run: print what would run (and the launcher's scripts) and submit nothing.
        wait: for a launcher whose jobs outlive this process (Slurm): wait for them to end (the
            others always wait).

    Raises:
        Busy: the grid is being submitted by another process.
    """
    grid_id = specs[0].grid_id
    grid_dir = grid_dir_for(cfg.output_dir, grid_id)
    if dry_run:
        return _submit(grid, specs, cfg, launcher, grid_dir, True, wait, log)
    fix = (
        f"wait for that submission to end (`vapo-lab jobs {grid_id}` follows its cells); "
        "nothing was submitted here"
    )
    with exclusive(grid_dir.with_name(f"{grid_id}.lock"), f"grid {grid_id}", fix):
        return _submit(grid, specs, cfg, launcher, grid_dir, False, wait, log)


def _submit(
    grid: Grid,
    specs: list[CellSpec],
    cfg: DictConfig,
    launcher: Launcher,
    grid_dir: Path,
    dry_run: bool,
    wait: bool,
    log: Log,
) -> Submission:
    """``submit_grid``'s submission into ``grid_dir``, under its lock (none for a dry run)."""
    launchers: dict[str, Any] = OmegaConf.to_container(  # type: ignore[assignment]
        cfg.launcher, resolve=True
    )
    settings: dict[str, Any] = launchers.get(launcher.name, {})
    grid_id = specs[0].grid_id
    record = read_record(grid_dir)
    sub = Submission(grid_id=grid_id, grid_dir=grid_dir)

    # which cells need a run
    known_jobs = known_job_ids(record)
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
        sub.dry_run_text = dry_run_text(grid, specs, sub, launcher, settings, todo)
        return sub

    launcher.preflight(settings, todo)
    if cfg.tracking.backend != "none":  # runs that ended in an outage: completed if it is over
        heal_tracking(cfg.tracking.spool_dir, log)
    # also checks the tracking server
    parent = start_parent(grid, specs, cfg, record, launcher.name, grid_dir)

    record = {
        **record,
        "grid_id": grid_id,
        "name": grid.name,
        "experiment": grid.experiment,
        "source": grid.source,
        "created": record.get("created", time.time()),
        "parent_run_id": parent,
        "tracking_uri": tracking_uri(cfg),
        # where its cells spool what the store did not take (``vapo-lab jobs`` sends it from there)
        "spool_dir": str(spool_folder(cfg.tracking.spool_dir).resolve()),
        "output_dir": str(Path(cfg.output_dir).resolve()),
        "cells": [s.to_record() for s in specs],
        "submissions": record.get("submissions", []),
    }
    write_record(grid_dir, record)
    if not todo:
        log(
            f"grid {grid_id}: nothing to submit ({len(sub.skipped_finished)} finished, "
            f"{len(sub.skipped_running)} still running)"
        )
        if not sub.skipped_running:
            end_parent(cfg, parent, "FINISHED")
        return sub
    jobs = [
        CellJob(
            spec=s,
            grid_dir=str(grid_dir),
            cwd=cwd,
            experiment=grid.experiment,
            parent_run_id=parent,
        )
        for s in todo
    ]
    for j in jobs:  # failed or stopped cells start over as pending (their run resumes)
        write_status(
            grid_dir, j.spec.key, state=PENDING, launcher=launcher.name, error=None, job_id=None
        )
    entry: dict[str, Any] = {
        "time": time.time(),
        "launcher": launcher.name,
        "cells": [j.spec.key for j in jobs],
        "job_ids": {},
    }
    record["submissions"].append(entry)
    write_record(grid_dir, record)
    log(
        f"grid {grid_id}: {len(jobs)} cell(s) to run on {launcher.name}, "
        f"{len(sub.skipped_finished)} finished, "
        f"{len(sub.skipped_running)} running elsewhere; folder {grid_dir}"
    )
    try:
        try:
            launcher.submit(jobs, settings, sub, log)
        finally:
            if launcher.detached:  # its jobs outlive this process: record them, queued or not
                entry["job_ids"] = dict(sub.job_ids)
                entry["prepare_job"] = sub.job_ids.get("prepare")
                write_record(grid_dir, record)
        if wait or not launcher.detached:
            launcher.wait(jobs, sub, log)
    except BaseException as e:
        # the launch itself failed (or was interrupted): no cell may stay "pending" for ever
        reason = (
            "interrupted"
            if isinstance(e, KeyboardInterrupt)
            else f"launch failed: {str(e).splitlines()[0][:300]}"
        )
        for j in jobs:
            if read_status(grid_dir, j.spec.key).get("state") in (
                PENDING,
                RUNNING,
            ) and not sub.job_ids.get(j.spec.key):
                write_status(grid_dir, j.spec.key, state=FAILED, error=reason)
        end_parent(cfg, parent, "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED")
        raise
    sub.submitted = [j.spec.key for j in jobs]
    if wait or not launcher.detached:  # a detached grid left running keeps its parent RUNNING
        end_parent(
            cfg,
            parent,
            "FINISHED" if all(sub.results.get(j.spec.key) == FINISHED for j in jobs) else "FAILED",
        )
    return sub


def dry_run_text(
    grid: Grid,
    specs: list[CellSpec],
    sub: Submission,
    launcher: Launcher,
    settings: dict[str, Any],
    todo: list[CellSpec],
) -> str:
    """Returns what ``--dry-run`` prints: every cell with its state and how it is composed, then
    what the launcher adds for the cells ``todo`` that would run."""
    lines = [
        f"grid {specs[0].grid_id} ({grid.source}): {len(specs)} run(s), "
        f"experiment {grid.experiment!r}, "
        f"folder {sub.grid_dir}",
        f"{'cell':<44} {'seed':>4}  {'config':<16}  state",
    ]
    for s in specs:
        state = (
            "finished: skip"
            if s.key in sub.skipped_finished
            else "running: skip"
            if s.key in sub.skipped_running
            else "would run"
        )
        label = s.name + "".join(f" {k}={v}" for k, v in s.sweep.items())
        lines.append(f"{label:<44} {s.seed:>4}  {s.config_hash:<16}  {state}")
        extra = [o for o in s.overrides if not o.startswith("seed=")]
        drop = f"--algo {s.algo}" + "".join(f" --drop {d}" for d in s.drop)
        lines.append(f"    {drop}{' ' + ' '.join(extra) if extra else ''}")
    lines.append(f"{len(todo)} to run on {launcher.name}")
    scripts = launcher.dry_run_text(todo, settings, sub.grid_dir, specs[0].grid_id)
    if scripts:
        lines.append(scripts)
    return "\n".join(lines)
