"""The Ray launcher (``launcher=ray``): each cell a Ray task with its resources.

``launcher.ray.address`` null starts a local Ray for the submission (listening on loopback only
unless ``launcher.ray.expose=true``), ``auto`` joins the running cluster, ``host:port`` or
``ray://host:port`` a remote one. The prepare task runs first; then the cells, each in a fresh
worker process whose output goes to ``<grid>/logs/<cell key>.log``. The submission returns when
every cell has ended; one failed cell does not stop the others.

A cell is one Ray task, one process: a many-rank cell is refused before anything is submitted,
naming the launchers that run it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vapo_lab.launch.base import LaunchError, Log, Submission, cell_failed, log_folder, logged
from vapo_lab.launch.cell import CellJob, cell_ranks, prepare, run_cell

if TYPE_CHECKING:
    from vapo_lab.launch.grid import CellSpec

_RAY_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayLauncher:
    """Runs a grid's cells as Ray tasks and waits for them."""

    name = "ray"
    detached = False

    def preflight(self, settings: dict[str, Any], specs: list[CellSpec]) -> None:
        refusal = many_rank_refusal(specs)
        if refusal:
            raise LaunchError(refusal)
        address = settings.get("address")
        if address and address != "auto":
            check_reachable(str(address))

    def submit(
        self, jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Log
    ) -> None:
        started_ray = ray_init(settings)
        try:
            _run(jobs, settings, sub, log)
        finally:
            if started_ray:
                import ray

                ray.shutdown()

    def wait(self, jobs: list[CellJob], sub: Submission, log: Log) -> None:
        """Nothing to wait for: ``submit`` returns when every cell has ended."""

    def dry_run_text(
        self, specs: list[CellSpec], settings: dict[str, Any], grid_dir: Path, grid_id: str
    ) -> str:
        refusal = many_rank_refusal(specs)
        return f"refused on ray: {refusal}" if refusal else ""


def many_rank_refusal(specs: list[CellSpec]) -> str | None:
    """Returns the one line that refuses a grid with a many-rank cell, None when every cell is one
    process (a Ray task is one process; vapo-lab does not start a cell's ranks as Ray actors)."""
    many = [(s, cell_ranks(s.config)) for s in specs if cell_ranks(s.config) != (1, 1)]
    if not many:
        return None
    s, (nodes, per_node) = many[0]
    more = f" (and {len(many) - 1} more)" if len(many) > 1 else ""
    return (
        f"cell {s.key}{more} runs on {nodes * per_node} ranks (trainer.nodes={nodes} x "
        f"trainer.nproc_per_node={per_node}): the Ray launcher runs one process per cell; "
        "use --launcher local (torchrun on this machine) "
        "or --launcher slurm (a multi-task job); nothing was submitted"
    )


def _run(jobs: list[CellJob], settings: dict[str, Any], sub: Submission, log: Log) -> None:
    import ray

    grid_dir = Path(jobs[0].grid_dir)
    logs = log_folder(grid_dir)
    # max_calls=1: a fresh worker process per cell (its output is redirected to the cell's log)
    resources = {
        "num_cpus": float(settings.get("num_cpus", 1)),
        "num_gpus": float(settings.get("num_gpus", 0)),
        "max_retries": 0,
        "max_calls": 1,
    }
    ray.get(ray.remote(**resources)(logged).remote(prepare, jobs, logs / "prepare.log"))
    remote = ray.remote(**resources)(logged)
    refs = {remote.remote(run_cell, j, logs / f"{j.spec.key}.log"): j for j in jobs}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        key = refs[done[0]].spec.key
        try:
            sub.finished(key, ray.get(done[0]), log)
        except Exception as e:  # noqa: BLE001 - one failed cell does not stop the others
            cell_failed(sub, grid_dir, key, log, e)


def ray_init(settings: dict[str, Any]) -> bool:
    """Connects to the configured Ray cluster, or starts a local one; returns True when this call
    connected (the caller then shuts Ray down). Raises LaunchError if it is unreachable.

    A local Ray started here listens on 127.0.0.1 only, unless ``launcher.ray.expose=true``: anyone
    who can reach a Ray port can run code on it. Ray has no bind option; its switch for a
    loopback-only node (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, meant for laptops) does it.
    """
    address = settings.get("address")
    loopback = not address and not settings.get("expose", False)
    previous = os.environ.get(_RAY_LOOPBACK_ENV)
    if loopback:
        # read when ray is imported, and by the processes it starts
        os.environ[_RAY_LOOPBACK_ENV] = "0"
    try:
        import ray
    except ImportError as e:
        raise LaunchError(
            "the Ray launcher needs `ray` (pip install 'ray>=2.9'), or use --launcher local"
        ) from e
    if ray.is_initialized():
        return False
    from ray._private import ray_constants

    cluster_mode = ray_constants.ENABLE_RAY_CLUSTER
    if loopback:
        # the env var is read at import: ray may be imported already
        ray_constants.ENABLE_RAY_CLUSTER = False
    # never let Ray re-resolve this env with uv
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": "ERROR",
        "configure_logging": False,
    }
    if address and address != "auto":
        check_reachable(address)
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=settings.get("cluster_cpus") or os.cpu_count(), **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure to connect is reported in one line
        raise LaunchError(
            f"cannot connect to Ray at launcher.ray.address={address!r}: "
            f"{str(e).strip().splitlines()[0][:200]}; start it with `ray start --head`, "
            "or leave launcher.ray.address unset for a local Ray"
        ) from e
    finally:
        # the node is started: later connections in this process decide for themselves
        if loopback:
            ray_constants.ENABLE_RAY_CLUSTER = cluster_mode
            if previous is None:
                os.environ.pop(_RAY_LOOPBACK_ENV, None)
            else:
                os.environ[_RAY_LOOPBACK_ENV] = previous
    return True


def check_reachable(address: str) -> None:
    """Raises LaunchError unless host:port of a Ray address answers a TCP connection within 5 s
    (``ray.init`` itself retries an unreachable address for minutes)."""
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(
            f"launcher.ray.address={address!r} is not host:port (or ray://host:port, or auto)"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise LaunchError(
            f"cannot connect to Ray at launcher.ray.address={address!r}: {e.strerror or e}; "
            "start it with `ray start --head`, or leave launcher.ray.address unset for a "
            "local Ray; nothing was submitted"
        ) from e
