"""The Slurm launcher (``launcher=slurm``, through submitit): a prepare job, then the cells' arrays.

The arrays depend on the prepare job (``afterok``), so no cell starts before the shared caches
exist. Each array task runs ``CellJobRunner``: on preemption or time limit Slurm signals it,
submitit requeues it, and the new attempt resumes from the last checkpoint. The jobs outlive the
submitting process: ``--no-wait`` returns once they are queued, and ``vapo-lab jobs`` follows them.

A many-rank cell is a multi-task job (``--nodes`` = trainer.nodes, ``--ntasks-per-node`` =
trainer.nproc_per_node): srun starts one task per rank, no torchrun, and each task joins the
others (``cell.join_slurm_ranks``). An array's tasks share their sbatch parameters, so the cells
go as one array per shape (nodes, tasks per node).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from vapo_lab.launch.base import LaunchError, Log, Submission
from vapo_lab.launch.cell import CellJob, CellJobRunner, cell_ranks, prepare
from vapo_lab.launch.liveness import squeue_states
from vapo_lab.launch.status import FAILED, FINISHED, read_status, write_status

if TYPE_CHECKING:
    from vapo_lab.launch.grid import CellSpec

Cell = TypeVar("Cell")  # a CellJob or a CellSpec


class SlurmLauncher:
    """Submits a grid's cells as Slurm job arrays after a prepare job, and can wait for them."""

    name = "slurm"
    detached = True

    def preflight(self, settings: dict[str, Any], specs: list[CellSpec]) -> None:
        check_slurm(settings)
        for spec in specs:
            check_time(spec.config, settings, spec.name)
        given = settings.get("mem_gb")
        if given is None:
            return
        for spec in specs:
            need = host_gb_per_rank(spec.config, settings)
            if need is not None and _is_gpu(spec.config, settings) and given < need[0]:
                raise LaunchError(
                    f"launcher.slurm.mem_gb={given} is below the host memory a rank of cell "
                    f"{spec.name} needs by its plan, {need[0]} GB ({need[1]}): set "
                    f"launcher.slurm.mem_gb={need[0]}, or leave it unset to take the plan's; "
                    "nothing was submitted"
                )

    def submit(
        self, jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Log
    ) -> None:
        import submitit

        grid_dir, grid_id = Path(jobs[0].grid_dir), jobs[0].spec.grid_id
        folder = _slurm_folder(grid_dir, settings)
        params = slurm_parameters(settings, f"vapo-{grid_id}")
        max_requeues = int(settings.get("max_requeues", 100))
        ex = submitit.SlurmExecutor(folder=folder)
        ex.update_parameters(**_prepare_parameters(params))
        try:
            # base models only: the cells build the critic's start (resumable, one build a key)
            prep = ex.submit(prepare, jobs, False)
        except Exception as e:  # noqa: BLE001 - sbatch's refusal, in one line
            raise LaunchError(
                f"sbatch refused the grid's prepare job: {_sbatch_error(e)}; submitted: none "
                f"of {len(jobs)} cells"
            ) from e
        sub.job_ids["prepare"] = str(prep.job_id)
        arrays: list[tuple[tuple[int, int], list[CellJob], list[Any]]] = []
        for shape, group in task_groups(jobs, lambda j: j.spec.config).items():
            # a fresh executor per array: update_parameters merges, and one shape's parameters
            # (--ntasks-per-node, --gpus-per-node) must not leak into the next array
            ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=max_requeues)
            configs = [j.spec.config for j in group]
            mem = group_mem_gb(configs, settings)
            array = _array_parameters(params, str(prep.job_id), *shape, mem)
            array["signal_delay_s"] = group_signal_delay(configs, settings)
            array["cpus_per_task"] = group_cpus(configs, settings)
            ex.update_parameters(**array)
            runner = CellJobRunner(array["signal_delay_s"])
            try:
                arrays.append((shape, group, ex.map_array(runner, group)))
            except Exception as e:  # noqa: BLE001
                queued = [str(prep.job_id), *(_array_id(a) for _, _, a in arrays)]
                subprocess.run(["scancel", *queued], capture_output=True, timeout=30)
                cancelled = (
                    f"the prepare job {prep.job_id} was"
                    if len(queued) == 1
                    else f"the prepare job {prep.job_id} and array(s) {', '.join(queued[1:])} were"
                )
                raise LaunchError(
                    f"sbatch refused the cells' job array{_shape_text(*shape)}: "
                    f"{_sbatch_error(e)}; "
                    f"submitted: none of {len(jobs)} cells ({cancelled} cancelled)"
                ) from e
        for _, group, array in arrays:
            for j, job in zip(group, array):
                sub.job_ids[j.spec.key] = str(job.job_id)
                write_status(grid_dir, j.spec.key, job_id=str(job.job_id))
        listed = ", ".join(
            f"{_array_id(a)} of {len(g)} cells{_shape_text(*shape)}" for shape, g, a in arrays
        )
        log(
            f"submitted prepare job {prep.job_id} and "
            f"array{'s' if len(arrays) > 1 else ''} {listed}; logs in "
            f"{folder}; follow with `vapo-lab jobs {grid_id}`"
        )

    def wait(self, jobs: list[CellJob], sub: Submission, log: Log) -> None:
        """Waits until every cell's status is final or its job has left the queue."""
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
                        sub.failed(
                            key,
                            st.get("error") or "job ended without finishing (see its log)",
                            log,
                            tracking=st.get("tracking") or "",
                        )
                    del left[key]

    def dry_run_text(
        self, specs: list[CellSpec], settings: dict[str, Any], grid_dir: Path, grid_id: str
    ) -> str:
        """Returns the sbatch scripts a submission of the cells ``specs`` would queue: the prepare
        job, then one job array per shape of cell ("" for none)."""
        if not specs:
            return ""
        from submitit.slurm.slurm import _make_sbatch_string

        folder = _slurm_folder(grid_dir, settings)
        params = slurm_parameters(settings, f"vapo-{grid_id}")
        command = f"{sys.executable} -u -m submitit.core._submit {folder}"
        parts = [
            "\n# sbatch script 1: the prepare job (base model, reward model, pretrained critic)",
            _make_sbatch_string(command=command, folder=folder, **_prepare_parameters(params)),
        ]
        for i, (shape, group) in enumerate(task_groups(specs, lambda s: s.config).items()):
            parts += [
                f"\n# sbatch script {i + 2}: "
                f"the job array of {len(group)} cells{_shape_text(*shape)}, "
                "after the prepare job",
                _make_sbatch_string(
                    command=command,
                    folder=folder,
                    map_count=len(group),
                    **_array_parameters(
                        params,
                        "<prepare job id>",
                        *shape,
                        group_mem_gb([c.config for c in group], settings),
                    ),
                ),
            ]
        return "\n".join(parts)


def task_groups(
    cells: list[Cell], config: Callable[[Cell], dict[str, Any]]
) -> dict[tuple[int, int], list[Cell]]:
    """Returns the cells grouped by the shape of their jobs, (nodes, tasks per node), in the order
    each shape first appears: one job array per group (an array's tasks share their sbatch
    parameters). One-process cells are (1, 1); ``config(cell)`` gives a cell's composed config."""
    groups: dict[tuple[int, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault(cell_ranks(config(c)), []).append(c)
    return groups


def check_slurm(settings: dict[str, Any]) -> None:
    """Raises LaunchError when Slurm's commands are missing or the partition does not exist."""
    missing = [c for c in ("sbatch", "squeue", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        raise LaunchError(
            f"Slurm commands not found on PATH ({', '.join(missing)}): run this on a Slurm "
            "login node, or use --launcher local (or --launcher ray)"
        )
    partition = settings.get("partition")
    if partition:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30
        )
        known = sorted(set(out.stdout.split()))
        if out.returncode == 0 and partition not in known:
            raise LaunchError(
                f"unknown Slurm partition launcher.slurm.partition={partition!r}: this cluster has "
                f"{', '.join(known) or 'none'}; nothing was submitted"
            )


def slurm_parameters(settings: dict[str, Any], name: str) -> dict[str, Any]:
    """Returns submitit ``SlurmExecutor`` parameters from the launcher.slurm settings."""
    p: dict[str, Any] = {
        "job_name": name,
        "time": int(settings.get("time_min", 60)),
        "nodes": int(settings.get("nodes", 1)),
        "cpus_per_task": int(settings.get("cpus_per_task") or CPUS_PER_RANK),
        "mem": f"{int(settings.get('mem_gb') or PREPARE_MEM_GB)}GB",
        "array_parallelism": int(settings.get("array_parallelism", 16)),
        "additional_parameters": dict(settings.get("additional_parameters") or {}),
        "setup": list(settings.get("setup") or []),
        "signal_delay_s": int(settings.get("signal_delay_s") or SIGNAL_DELAY_S),
    }
    for key in ("partition", "account", "qos", "constraint"):
        if settings.get(key):
            p[key] = str(settings[key])
    if int(settings.get("gpus_per_task", 0)):
        p["gpus_per_task"] = int(settings["gpus_per_task"])
    return p


# CPUs a rank asks for where launcher.slurm.cpus_per_task is unset: a vLLM rank runs the engine's
# scheduler in its own process beside math-verify's serial grading and the tokenisers
CPUS_PER_RANK, VLLM_CPUS_PER_RANK = 2, 8
# Slurm's warning before the time limit where launcher.slurm.signal_delay_s is unset and no cell's
# plan gives one (CPU cells: the plan's times are a GPU's)
SIGNAL_DELAY_S = 120


def _cell_plan(config: dict[str, Any], settings: dict[str, Any]) -> tuple[Any, Any] | None:
    """Returns (the cell's plan on its ranks, its config as the plan reads it): on GPUs of 80 GB,
    on CPU ranks of the host; None where the plan cannot be made here (no model shape to read)."""
    from omegaconf import OmegaConf

    from vapo_lab.config.plan import plan_run
    from vapo_lab.errors import ConfigError

    cfg = OmegaConf.create(config)
    gpu = _is_gpu(config, settings)
    try:
        return plan_run(cfg, 80e9 if gpu else 1e12, device="cuda" if gpu else "cpu"), cfg
    except ConfigError:
        return None


def _plan_times(config: dict[str, Any], settings: dict[str, Any]) -> Any:
    """Returns the cell's ``AttemptTimes`` by its plan on GPUs, or None (a CPU cell, whose plan
    has no times, or no shape to read)."""
    from vapo_lab.config.attempt import attempt_times

    planned = _cell_plan(config, settings) if _is_gpu(config, settings) else None
    return attempt_times(*planned) if planned is not None else None


def check_time(config: dict[str, Any], settings: dict[str, Any], name: str) -> None:
    """Raises LaunchError, before anything is submitted, when a GPU cell's attempt cannot make
    progress within launcher.slurm.time_min (start-up + its longest unit of work + that unit's
    save, by its plan), or its whole run needs more attempts than launcher.slurm.max_requeues
    allows."""
    times = _plan_times(config, settings)
    if times is None:
        return
    limit = 60.0 * int(settings.get("time_min", 60))
    least = math.ceil(times.least_limit / 60)
    if limit < times.least_limit:
        raise LaunchError(
            f"launcher.slurm.time_min={limit / 60:g} is too short for cell {name}: by its plan an "
            f"attempt needs {least} min to start up, run its longest unit of work and save it "
            f"(`vapo-lab plan` prints the budget): set launcher.slurm.time_min={least} or more; "
            "nothing was submitted"
        )
    attempts, allowed = times.attempts(limit), int(settings.get("max_requeues", 100)) + 1
    if attempts is not None and attempts > allowed:
        raise LaunchError(
            f"cell {name} needs ~{attempts} attempts of launcher.slurm.time_min={limit / 60:g} by "
            f"its plan, more than launcher.slurm.max_requeues={allowed - 1} allows: raise "
            f"launcher.slurm.time_min or set launcher.slurm.max_requeues={attempts}; nothing was "
            "submitted"
        )


def group_signal_delay(configs: list[dict[str, Any]], settings: dict[str, Any]) -> int:
    """Returns the seconds before the time limit an array's jobs are warned:
    launcher.slurm.signal_delay_s when set, else the longest its cells' plans ask for (their
    longest unit of work + its save, ``AttemptTimes.warning``), else ``SIGNAL_DELAY_S``."""
    if settings.get("signal_delay_s"):
        return int(settings["signal_delay_s"])
    warnings = [t.warning for c in configs if (t := _plan_times(c, settings)) is not None]
    return max(warnings, default=SIGNAL_DELAY_S)


def group_cpus(configs: list[dict[str, Any]], settings: dict[str, Any]) -> int:
    """Returns the CPUs a rank of an array asks for: launcher.slurm.cpus_per_task when set, else
    ``VLLM_CPUS_PER_RANK`` where a cell samples with vLLM, else ``CPUS_PER_RANK``."""
    if settings.get("cpus_per_task"):
        return int(settings["cpus_per_task"])
    vllm = any(c.get("rollout", {}).get("backend") == "vllm" for c in configs)
    return VLLM_CPUS_PER_RANK if vllm else CPUS_PER_RANK


# a rank's own host memory beside what its plan counts: the H200 acceptance run's one rank (0.5B
# shape, fsdp) peaked at 27.8 GB RSS (docs/gpu-runs); a CPU rank of the embedded default at 1.0 GB
# and the acceptance script's 2-layer Qwen2 at 1.7 GB (docs/benchmarks.md, gpu-acceptance --cpu)
GPU_PROCESS_GB = 28
CPU_PROCESS_GB = 2
# the prepare job's memory when launcher.slurm.mem_gb is unset: one process building the caches of
# a one-rank cell or the base model of a many-rank one
PREPARE_MEM_GB = 8


def _is_gpu(config: dict[str, Any], settings: dict[str, Any]) -> bool:
    return bool(int(settings.get("gpus_per_task") or 0)) or str(
        config.get("trainer", {}).get("device", "")
    ).startswith("cuda")


def host_gb_per_rank(config: dict[str, Any], settings: dict[str, Any]) -> tuple[int, str] | None:
    """Returns (GB of host memory a rank of the cell ``config`` needs, how) by its plan, or None
    where the plan cannot be made here (no model shape to read): on GPUs its share of the plan's
    host memory a node (pinned offload, vLLM asleep at level 1, the critic-cache write) + a
    process's own ``GPU_PROCESS_GB``; on CPU the plan's need a rank + ``CPU_PROCESS_GB``."""
    planned = _cell_plan(config, settings)
    if planned is None:
        return None
    plan, fp = planned[0], planned[0].footprint
    if _is_gpu(config, settings):
        ranks = max(1, plan.setup.ranks_per_node if plan.setup.strategy == "fsdp" else 1)
        share = fp.host_per_node / ranks / 1e9
        how = f"{share:.1f} of the plan's host memory a node + {GPU_PROCESS_GB} a process"
        return math.ceil(share + GPU_PROCESS_GB), how
    how = f"the plan's {fp.need / 1e9:.1f} a rank + {CPU_PROCESS_GB} a process"
    return math.ceil(fp.need / 1e9 + CPU_PROCESS_GB), how


def group_mem_gb(configs: list[dict[str, Any]], settings: dict[str, Any]) -> int:
    """Returns the GB a rank of a job array asks for: launcher.slurm.mem_gb when set, else the
    largest plan figure of its cells (``host_gb_per_rank``; ``PREPARE_MEM_GB`` where none)."""
    if settings.get("mem_gb") is not None:
        return int(settings["mem_gb"])
    needs = [n[0] for c in configs if (n := host_gb_per_rank(c, settings)) is not None]
    return max(needs, default=PREPARE_MEM_GB)


def _prepare_parameters(params: dict[str, Any]) -> dict[str, Any]:
    """Returns the prepare job's parameters: the grid's, under the name <grid job name>-prepare."""
    return {**params, "job_name": params["job_name"] + "-prepare"}


def _array_parameters(
    params: dict[str, Any],
    prepare_job: str,
    nodes: int = 1,
    tasks: int = 1,
    mem_gb: int | None = None,
) -> dict[str, Any]:
    """Returns the parameters of an array of cells on ``nodes`` x ``tasks`` per node, ``mem_gb`` a
    rank (None: the grid's): the grid's, starting once the prepare job has succeeded (and cancelled
    by Slurm if it failed, instead of waiting for ever); a many-rank shape is a multi-task job,
    one task per rank."""
    extra = {**params["additional_parameters"], "kill-on-invalid-dep": "yes"}
    p = {**params, "additional_parameters": extra, "dependency": f"afterok:{prepare_job}"}
    per_rank = int(params["mem"].removesuffix("GB")) if mem_gb is None else mem_gb
    p["mem"] = f"{per_rank}GB"
    if nodes * tasks == 1:
        return p
    p.update(
        job_name=f"{params['job_name']}-{nodes}x{tasks}",
        nodes=nodes,
        ntasks_per_node=tasks,
        # --mem is per node: mem_gb per rank
        mem=f"{per_rank * tasks}GB",
        # a rank that fails ends the job's other ranks at once, as torchrun does (they would
        # otherwise wait in their next collective for the process group's timeout)
        srun_args=["--kill-on-bad-exit=1"],
    )
    if p.pop("gpus_per_task", 0):
        # one GPU per rank, and every task sees the node's GPUs: init_world takes cuda:{LOCAL_RANK}
        # (--gpus-per-task would bind each task to its own GPU, which is cuda:0 in every task)
        p["gpus_per_node"] = tasks
    return p


def _shape_text(nodes: int, tasks: int) -> str:
    """Returns how a job array's shape reads in messages ("" for one-process cells)."""
    return (
        ""
        if nodes * tasks == 1
        else f" on {nodes} node(s) x {tasks} tasks ({nodes * tasks} ranks each)"
    )


def _array_id(array: list[Any]) -> str:
    return str(array[0].job_id).split("_")[0]


def _slurm_folder(grid_dir: Path, settings: dict[str, Any]) -> Path:
    # a fresh folder per submission: job ids can restart (a purged cluster), and a reused folder
    # would hold an old job's result
    return grid_dir / str(settings.get("log_dir", "slurm_logs")) / time.strftime("%Y%m%d-%H%M%S")


def _sbatch_error(e: Exception) -> str:
    text = str(getattr(e, "output", b"") or "") or str(e)
    if isinstance(getattr(e, "output", None), bytes):
        text = e.output.decode(errors="replace")  # type: ignore[attr-defined]
    lines = [ln.strip() for ln in text.splitlines() if "error" in ln.lower()] or [
        text.strip().splitlines()[-1]
    ]
    return lines[0][:300]
