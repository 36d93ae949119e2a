"""Rotary position embedding (RoPE) helpers shared by the sampler's decoder and the packed
training forward: the one reading of a config's RoPE base, and the rotation."""

from __future__ import annotations

import torch
from torch import Tensor


def rope_theta(config: object) -> float | None:
    """Returns the RoPE base of a default-RoPE config, or None when RoPE is scaled/other."""
    # transformers >= 5 keeps {"rope_type", "rope_theta"} in rope_parameters (rope_scaling aliases
    # it); older releases have rope_theta and rope_scaling (None unless scaled) as attributes.
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if params.get("rope_type", params.get("type", "default")) != "default":
        return None
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta) if theta is not None else 10000.0


def rotate_half(x: Tensor) -> Tensor:
    """Returns x with its halves swapped and the second negated: RoPE's rotation by 90 degrees."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
