"""FSDP2 (``fully_shard``) for the actor, the critic and the reference.

One FSDP group per decoder layer, then the root; parameters stay float32 shards and gradients are
summed over ranks, not averaged (why: docs/distributed.md, Many ranks). The shards span every rank,
or under HSDP (``World.replicas`` > 1) a node's ranks, each node holding a replica (docs/
distributed.md, HSDP).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from vapo_lab.distributed.world import World


def transformer_layers(model: nn.Module) -> list[nn.Module]:
    """Returns the decoder layers of a causal LM (``model.model.layers``), a bare transformer
    (``model.layers``) or a value model (``model.backbone.layers``)."""
    for path in ("model.layers", "backbone.layers", "layers"):
        obj: Any = model
        for attr in path.split("."):
            obj = getattr(obj, attr, None)
        if isinstance(obj, nn.ModuleList):
            return list(obj)
    raise TypeError(
        f"cannot find the decoder layers of {type(model).__name__} to shard (no .model.layers, "
        ".backbone.layers or .layers)"
    )


def shard(model: nn.Module, world: World, device: torch.device, mp: Any = None) -> nn.Module:
    """Shards ``model`` in place over ``world``'s mesh (``device_mesh``; one group per decoder
    layer, then the root) and returns it; ``mp``: FSDP2's MixedPrecisionPolicy (None: compute in
    the parameters' dtype). Gradients are summed over every rank: reduce-scattered within a shard
    group and, under HSDP, all-reduced across the replicas, both with SUM and no divide."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = device_mesh(device.type, world)
    mp = mp or MixedPrecisionPolicy()
    for layer in transformer_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
            _allow_calls(m)
    return model


def mesh_shape(world: World) -> tuple[int, ...]:
    """Returns the DeviceMesh shape of ``world``'s N ranks: (N,) to shard over all of them; with R
    replicas, (R, N / R), rank r at row r // (N / R) (its node) and column r % (N / R), so that
    a shard group is a node's consecutive ranks and a replicate group one rank of each node.

    Raises:
        ValueError: R does not divide N.
    """
    if world.replicas == 1:
        return (world.size,)
    if world.size % world.replicas:
        raise ValueError(f"{world.replicas} replicas do not divide {world.size} ranks")
    return (world.replicas, world.size // world.replicas)


# (the process group, the device type, a shape) -> its mesh: built once, see device_mesh
_MESHES: dict[tuple[Any, str, tuple[int, ...]], Any] = {}


def device_mesh(device_type: str, world: World) -> Any:
    """Returns the DeviceMesh ``shard`` uses for ``world`` (``mesh_shape``; 2-D dimensions named
    ``replicate`` and ``shard``), one per process group: a 2-D mesh creates a process group per
    dimension, an NCCL communicator and its buffers each, so the actor, critic and reference
    share one."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(world)
    group = torch.distributed.group.WORLD
    key = (group, device_type, shape)
    if key not in _MESHES:
        # a mesh dies with its process group: a test may start another in this process
        for stale in [k for k in _MESHES if k[0] is not group]:
            del _MESHES[stale]
        names = ("replicate", "shard") if len(shape) == 2 else None
        # an explicit mesh: the default one picks CUDA whenever it exists (pytorch#132471)
        _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return _MESHES[key]


_CALL = "_vapo_forward_call"


def _allow_calls(module: nn.Module) -> None:
    """Gives a sharded ``module`` a method that runs a function as its forward (``as_forward``)."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    setattr(module, _CALL, types.MethodType(lambda self, fn, *args: fn(*args), module))
    register_fsdp_forward_method(module, _CALL)


def as_forward(module: nn.Module, fn: Callable[..., Any], *args: Any) -> Any:
    """Returns ``fn(*args)`` run as ``module``'s forward pass, inside FSDP2's hooks when ``shard``
    wrapped it (parameters gathered, gradients reduce-scattered), so that code calling submodules
    directly (the packed forward) trains the module as its own ``forward`` would."""
    call = getattr(module, _CALL, None)
    return call(fn, *args) if call is not None else fn(*args)


def is_sharded(model: nn.Module | None) -> bool:
    """True for a module ``shard`` has wrapped."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full(t: Tensor) -> Tensor:
    """Returns the whole tensor of a DTensor (a collective: call it in the same order on every
    rank), or ``t`` itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_parameters(model: nn.Module) -> Any:
    """Yields (name, whole tensor) for each parameter of ``model``, one at a time: a sharded
    model is gathered parameter by parameter, never whole on one rank."""
    for name, p in model.named_parameters():
        yield name, full(p.detach())
