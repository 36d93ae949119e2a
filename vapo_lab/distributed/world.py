"""The ranks of one run and the reductions the trainer makes over them.

:class:`World`'s methods are the only collectives the trainer calls; with one process and no
process group they are identities, so the single-process path runs the same code.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vapo_lab.errors import ConfigError

STRATEGIES = ("single", "fsdp")
# flat: FSDP2 shards over all ranks; hsdp: within a node, each node a replica (docs/distributed.md)
MESHES = ("flat", "hsdp")


@dataclass(frozen=True)
class World:
    """This process's place in the run: ``rank`` of ``size`` ranks, ``local_rank`` on its node;
    the models are sharded over ``size // replicas`` consecutive ranks and kept in ``replicas``
    copies (1: one copy sharded over every rank; the node count under trainer.mesh=hsdp)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    initialized: bool = False  # a torch.distributed process group is up
    comm_device: str = "cpu"  # where collectives' tensors must be: "cuda" under nccl
    replicas: int = 1

    @property
    def main(self) -> bool:
        """True on the rank that logs, tracks and writes the run's files (rank 0)."""
        return self.rank == 0

    def sum(self, x: Tensor | float) -> Tensor:
        """Returns the sum of ``x`` over ranks (a float64 tensor for a Python number)."""
        t = (
            x.detach().clone()
            if isinstance(x, Tensor)
            else torch.tensor(float(x), dtype=torch.float64)
        )
        return self._all_reduce(t, torch.distributed.ReduceOp.SUM) if self.initialized else t

    def mean(self, x: Tensor) -> float:
        """Returns the mean of the entries of ``x`` over all ranks (one process: ``x.mean()``)."""
        if not self.initialized:
            return float(x.mean())
        return float(self.sum(x.double().sum()) / self.sum(float(x.numel())).clamp(min=1))

    def std(self, x: Tensor) -> float:
        """Returns the sample standard deviation of the entries of ``x`` over all ranks (one
        process: ``x.std()``); 0 for fewer than two entries."""
        if not self.initialized:
            return float(x.std()) if x.numel() > 1 else 0.0
        x = x.double()
        n, s1, s2 = self.sum(
            torch.stack(
                [torch.tensor(float(x.numel()), dtype=torch.float64), x.sum(), (x * x).sum()]
            )
        )
        return float(((s2 - s1 * s1 / n) / (n - 1)).clamp(min=0).sqrt()) if n > 1 else 0.0

    def max(self, x: Tensor | float) -> Tensor:
        """Returns the maximum of ``x`` over ranks."""
        t = (
            x.detach().clone()
            if isinstance(x, Tensor)
            else torch.tensor(float(x), dtype=torch.float64)
        )
        return self._all_reduce(t, torch.distributed.ReduceOp.MAX) if self.initialized else t

    def _all_reduce(self, t: Tensor, op: Any) -> Tensor:
        """Returns ``t`` reduced over ranks with ``op``, on ``t``'s device; the collective runs on
        ``comm_device`` because nccl reduces only CUDA tensors."""
        moved = t.to(self.comm_device)
        torch.distributed.all_reduce(moved, op=op)
        return moved.to(t.device)

    def gather(self, obj: Any) -> list[Any]:
        """Returns every rank's ``obj``, in rank order (picklable objects; small ones)."""
        if not self.initialized:
            return [obj]
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Returns rank 0's ``obj`` on every rank."""
        if not self.initialized:
            return obj
        box = [obj if self.main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.initialized:
            torch.distributed.barrier()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Runs the body on rank 0, then on the other ranks: rank 0 builds a shared cache (base
        model, reward model, pretrained critic) that the others then find and load."""
        if not self.main:
            self.barrier()
        yield
        if self.main:
            self.barrier()

    def require_shared(self, folders: dict[str, Path]) -> None:
        """Checks that every rank sees what rank 0 writes in each of ``folders`` ({what: path}):
        ranks on other nodes read the run folder and the caches that rank 0 wrote.

        Raises:
            ConfigError: on every rank, naming the first rank and folder that saw nothing.
        """
        if self.size == 1:
            return
        token = self.broadcast(f".vapo-shared-{os.getpid()}-{time.time_ns()}")
        if self.main:
            for path in folders.values():
                path.mkdir(parents=True, exist_ok=True)
                (path / token).write_text("rank 0 wrote this\n")
        self.barrier()
        blind = [what for what, path in folders.items() if not (path / token).is_file()]
        seen = self.gather(blind)
        self.barrier()
        if self.main:
            for path in folders.values():
                (path / token).unlink(missing_ok=True)
        for rank, missed in enumerate(seen):
            if missed:
                what = missed[0]
                raise ConfigError(
                    f"rank {rank} does not see {folders[what]} ({what}) as rank 0 wrote it: on "
                    "many nodes it must be on a file system every node shares (run from a shared "
                    "folder, or set output_dir to one)"
                )


def single() -> World:
    """The world of a one-process run."""
    return World()


def env_world() -> tuple[int, int, int] | None:
    """Returns (rank, world size, local rank) from the variables torchrun (or
    ``submitit.helpers.TorchDistributedEnvironment``) set; None outside such a launch."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return (
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
    )


def world_size(trainer: Any) -> int:
    """Returns the number of ranks a ``trainer`` config section asks for: nodes x nproc_per_node."""
    return int(trainer.nodes) * int(trainer.nproc_per_node)


def replicas(trainer: Any) -> int:
    """Returns how many copies of each model a ``trainer`` config section keeps: trainer.nodes
    under trainer.mesh=hsdp (one sharded copy a node), else 1 (one copy sharded over all ranks)."""
    return int(trainer.nodes) if trainer.mesh == "hsdp" else 1


def init_world(trainer: Any, device: torch.device) -> World:
    """Returns this process's world: ``single`` for trainer.strategy=single; for fsdp, joins (or
    finds) the process group that torchrun / Slurm set up, gloo on CPU and nccl on CUDA.

    Raises:
        ConfigError: fsdp asked for N ranks but this process was started as one of M != N, or
            outside a launcher with N > 1; or trainer.mesh=hsdp and the launcher did not number
            each node's ranks consecutively.
    """
    if trainer.strategy == "single":
        return single()
    want = world_size(trainer)
    found = env_world()
    if found is None:
        if want > 1:
            raise ConfigError(
                f"trainer.strategy=fsdp with {want} ranks needs a launcher: run `vapo-lab train` "
                "(it starts torchrun), or torchrun / a Slurm multi-task job, not this process alone"
            )
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        found = (0, 1, 0)
    rank, size, local = found
    if size != want:
        raise ConfigError(
            f"this process is one of {size} ranks but trainer.nodes x trainer.nproc_per_node = "
            f"{want}: start the run with `vapo-lab train` or set the two to match the launch"
        )
    copies = replicas(trainer)
    if copies > 1:
        _check_node_major(rank, local, int(trainer.nproc_per_node))
    if not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        bound = None
        if device.type == "cuda":
            index = gpu_index(local)
            torch.cuda.set_device(index)
            # bound to its GPU, NCCL does not guess the device from the global rank (a hang where
            # ranks and GPUs do not map one to one) and fails at once on a bad communicator
            bound = torch.device("cuda", index)
        torch.distributed.init_process_group(
            backend,
            rank=rank,
            world_size=size,
            timeout=timedelta(minutes=int(trainer.collective_timeout_min)),
            device_id=bound,
        )
    return World(
        rank,
        size,
        local,
        initialized=True,
        comm_device="cuda" if device.type == "cuda" else "cpu",
        replicas=copies,
    )


def _check_node_major(rank: int, local_rank: int, per_node: int) -> None:
    """Checks that rank ``rank`` is its node's ``local_rank``-th of ``per_node`` consecutive ranks,
    as HSDP's mesh assumes (its shard groups are ranks k·per_node ... k·per_node + per_node − 1).

    Raises:
        ConfigError: the launcher numbered ranks otherwise (Slurm --distribution=cyclic).
    """
    if local_rank != rank % per_node:
        raise ConfigError(
            f"trainer.mesh=hsdp shards within each node's {per_node} consecutive ranks, but rank "
            f"{rank} is LOCAL_RANK={local_rank} on its node, not {rank % per_node}: the launcher "
            "numbered the ranks across nodes. Launch node by node (torchrun does; Slurm "
            "--distribution=block), or set trainer.mesh=flat"
        )


def gpu_index(local_rank: int) -> int:
    """Returns the GPU of the rank with ``local_rank`` among the GPUs this process sees: the node's
    (index ``local_rank``), or its own alone where the site binds one GPU to each task (index 0).

    Raises:
        ConfigError: the process sees several GPUs but not ``local_rank`` + 1.
    """
    seen = torch.cuda.device_count()
    if seen == 1:
        return 0
    if local_rank >= seen:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but this process sees {seen} GPUs "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): give every "
            "rank of a node the node's GPUs, or one GPU each"
        )
    return local_rank


def close_world(world: World) -> None:
    """Leaves the process group (once the run is over)."""
    if world.initialized and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
