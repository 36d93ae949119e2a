"""Masked reductions over valid (unpadded) tokens.

Every loss and metric in `vapo_lab.algo` reduces over the tokens of a response only. Padded
positions may hold garbage (even nan or inf from a padded forward pass), so the mask *selects*
entries with `torch.where` rather than multiplying by it: `nan · 0` is nan, a selected-out nan is 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Sum of `x` over the entries where `mask` is set.

    Args:
        x: values, any shape, e.g. (B, T).
        mask: bool or float {0, 1}, broadcastable to `x`, e.g. the (B, T) `response_mask`.
        dim: dimension(s) to reduce; None reduces everything to a 0-dim tensor.

    Returns:
        Σ x·m over `dim`; entries where m = 0 contribute exactly 0 whatever `x` holds there.
    """
    # where, not x·m: garbage nan/inf at padded positions must not leak (nan·0 = nan).
    selected = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return selected.sum()
    return selected.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Mean of `x` over the entries where `mask` is set; 0 where there are none.

    Args:
        x: values, any shape, e.g. (B, T).
        mask: bool or float {0, 1}, broadcastable to `x`.
        dim: dimension(s) to reduce; None reduces everything to a 0-dim tensor.

    Returns:
        Σ x·m / Σ m over `dim`; 0 (not nan) where Σ m = 0, e.g. a fully masked row.
    """
    total = masked_sum(x, mask, dim)
    count = masked_sum(torch.ones_like(x), mask, dim)
    # Divide by 1 where the count is 0 (the sum is 0 there too), so neither the value nor the
    # gradient becomes nan: torch.where would still back-propagate 0/0 through the other branch.
    safe_count = torch.where(count > 0, count, torch.ones_like(count))
    return total / safe_count  # x̄ = Σ x·m / Σ m


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Population (biased) variance of `x` over the entries where `mask` is set.

    Args:
        x: values, any shape, e.g. (B, T).
        mask: bool or float {0, 1}, broadcastable to `x`.

    Returns:
        0-dim tensor Σ (x − x̄)²·m / Σ m; 0 when no entry is selected.
    """
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)  # Var = Σ (x − x̄)²·m / Σ m
