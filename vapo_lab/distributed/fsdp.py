"""FSDP2 (``fully_shard``) for the actor, the critic and the reference.

One FSDP group per decoder layer, then the root; parameters stay float32 shards and gradients are
summed over ranks, not averaged (why: docs/distributed.md, Many ranks).
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
    """Shards ``model`` in place over ``world`` (one group per decoder layer, then the root) and
    returns it; ``mp``: FSDP2's MixedPrecisionPolicy (None: compute in the parameters' dtype)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    # an explicit mesh: the default one picks CUDA whenever it exists (pytorch#132471)
    mesh = init_device_mesh(device.type, (world.size,))
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
