"""The training state in host memory while the rollout generates, back on its device for the update.

:func:`to_host` moves the actor's, critic's and reference's parameters, gradients and AdamW state
to host memory (pinned when they come from CUDA) and frees the CUDA cache, so that vLLM can use
the GPU; :func:`to_device` puts every tensor back. On a CPU-only run both are plain copies. The
pitfalls this avoids (FSDP2 shards, uneven shards, AdamW's ``step``) are in docs/distributed.md,
GPU / vLLM.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn


@dataclass
class Offloaded:
    """What :func:`to_host` moved and where each piece came from.

    Attributes:
        modules: (module, the device its parameters, gradients and buffers were on).
        states: (one parameter's optimiser state, a key of it, the device that tensor was on).
        host: where they all are now.
    """

    modules: list[tuple[nn.Module, torch.device]] = field(default_factory=list)
    states: list[tuple[dict[str, Any], str, torch.device]] = field(default_factory=list)
    host: torch.device = torch.device("cpu")


def to_host(
    modules: Iterable[nn.Module | None],
    optimizers: Iterable[torch.optim.Optimizer | None],
    host: str | torch.device = "cpu",
) -> Offloaded:
    """Returns the record of moving ``modules`` (parameters, their gradients, buffers) and the state
    tensors of ``optimizers`` into fresh storage on ``host``; None entries are skipped.

    Raises:
        ValueError: a module's tensors are on more than one device, or two modules share
            parameters.
        RuntimeError: the move replaced a parameter object (torch's
            ``set_overwrite_module_params_on_conversion(True)``): its optimiser would lose it.
    """
    host = torch.device(host)
    done = Offloaded(host=host)
    try:  # a failure part-way puts back what had moved (each piece is recorded before it moves)
        seen: set[int] = set()
        for module in modules:
            if module is None:
                continue
            params = {id(p) for p in module.parameters()}
            if params & seen:
                raise ValueError(
                    f"{type(module).__name__} shares parameters with a module offloaded before it: "
                    "pass each parameter's module once"
                )
            seen |= params
            done.modules.append((module, _device_of(module)))
            _move_module(module, host)
        for opt in optimizers:
            if opt is None:
                continue
            for group in opt.param_groups:
                for p in group["params"]:
                    state = opt.state.get(p, {})
                    for key, value in state.items():
                        if isinstance(value, Tensor) and _moves(key, group):
                            done.states.append((state, key, value.device))
                            state[key] = _copy(value, host)
    except BaseException:
        to_device(done)
        raise
    if any(d.type == "cuda" for d in _devices(done)):
        torch.cuda.synchronize()  # the pinned copies are complete before anyone reads them
        torch.cuda.empty_cache()  # hand the freed blocks back for the rollout engine
    return done


def to_device(offloaded: Offloaded) -> None:
    """Moves everything :func:`to_host` moved back to the device it came from (fresh storage
    there); the record is spent after."""
    for module, device in offloaded.modules:
        _move_module(module, device)
    for state, key, device in offloaded.states:
        state[key] = _copy(state[key], device)
    offloaded.modules, offloaded.states = [], []


@contextlib.contextmanager
def on_host(
    modules: Iterable[nn.Module | None],
    optimizers: Iterable[torch.optim.Optimizer | None],
    host: str | torch.device = "cpu",
) -> Iterator[Offloaded]:
    """Runs the body with ``modules`` and ``optimizers`` on ``host`` (:func:`to_host`), and puts
    them back (:func:`to_device`) when it ends, raising or not."""
    offloaded = to_host(modules, optimizers, host)
    try:
        yield offloaded
    finally:
        to_device(offloaded)


def _moves(key: str, group: dict[str, Any]) -> bool:
    """True for an optimiser state entry that lives with its parameter: all but a ``step`` that
    torch hosts on the CPU (neither fused nor capturable)."""
    return key != "step" or bool(group.get("fused") or group.get("capturable"))


def _device_of(module: nn.Module) -> torch.device:
    """Returns the one device of ``module``'s parameters, gradients and buffers (a DTensor's: its
    local shard's; no tensors: the CPU).

    Raises:
        ValueError: they are on more than one device.
    """
    tensors = [
        *module.parameters(),
        *module.buffers(),
        *(p.grad for p in module.parameters() if p.grad is not None),
    ]
    devices = {_local(t).device for t in tensors}
    if len(devices) > 1:
        raise ValueError(
            f"{type(module).__name__} has tensors on {sorted(map(str, devices))}: offloading "
            "moves one module from one device and back; put it on one device first"
        )
    return devices.pop() if devices else torch.device("cpu")


def _move_module(module: nn.Module, device: torch.device) -> None:
    """Copies ``module``'s parameters (with their gradients) and buffers into fresh storage on
    ``device``, keeping every parameter object (the optimiser holds them)."""
    params = [id(p) for p in module.parameters()]
    with torch.no_grad():
        # not p.data = ...: FSDPModule's _apply reshards and re-points its own shard references
        module._apply(lambda t: _copy(t, device))
    if [id(p) for p in module.parameters()] != params:
        raise RuntimeError(
            "moving the module replaced its parameter objects (torch.__future__."
            "set_overwrite_module_params_on_conversion(True)?), so its optimiser would "
            "hold stale ones: leave that flag off to offload"
        )


def _copy(t: Tensor, device: torch.device) -> Tensor:
    """Returns a copy of ``t`` in new storage on ``device`` (a DTensor: its local shard moved,
    same mesh and placements), pinned when it goes from CUDA to the CPU."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        local = _copy(t.to_local(), device)
        return DTensor.from_local(
            local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
        )
    if t.is_cuda and device.type == "cpu":
        return torch.empty_like(t, device=device, pin_memory=True).copy_(t, non_blocking=True)
    return t.to(device, copy=True, non_blocking=t.is_pinned())


def _local(t: Tensor) -> Tensor:
    """Returns this rank's shard of a DTensor, or ``t``."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _devices(done: Offloaded) -> set[torch.device]:
    return {d for _, d in done.modules} | {d for _, _, d in done.states}
