"""Mixed precision, one policy for one process and many: float32 master weights, compute in
``model.dtype``.

A model is loaded in float32 and tagged with its compute dtype (``set_compute``); one process runs
its passes under ``torch.autocast`` (``autocast``), a sharded one under FSDP2's policy
(``fsdp_policy``). Why not pure bf16: an AdamW step of 1e-6 rounds away in most bf16 weights
(docs/distributed.md, Many ranks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from vapo_lab.models.dtypes import DTYPES

MASTER = torch.float32  # parameters, gradients, optimiser state, reductions
_ATTR = "_vapo_compute_dtype"


def compute_dtype(name: str) -> torch.dtype | None:
    """Returns the compute dtype ``model.dtype`` names, or None for float32 (no mixed precision)."""
    dtype = DTYPES[name]
    return None if dtype == MASTER else dtype


def set_compute(model: nn.Module, name: str) -> nn.Module:
    """Returns ``model`` with float32 parameters, to compute in the dtype ``model.dtype`` names."""
    model.to(MASTER)
    setattr(model, _ATTR, compute_dtype(name))
    return model


def fsdp_policy(model: nn.Module) -> object:
    """Returns FSDP2's MixedPrecisionPolicy for ``model``'s compute dtype, reducing in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = getattr(model, _ATTR, None)
    return MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=MASTER if dtype is not None else None
    )


@contextlib.contextmanager
def autocast(model: nn.Module) -> Iterator[None]:
    """Runs the block's passes of ``model`` in its compute dtype (nothing for float32, nor for a
    sharded model, whose FSDP2 policy casts)."""
    dtype = getattr(model, _ATTR, None)
    if dtype is None or _sharded(model):
        yield
        return
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=dtype):
        yield


def _sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)
