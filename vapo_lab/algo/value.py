"""Critic loss (clipped value loss) and explained variance."""

from __future__ import annotations

import torch
from torch import Tensor

from vapo_lab.algo.masked import masked_mean, masked_var
from vapo_lab.algo.policy import aggregate_loss


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    clip_range: float | None = None,
    loss_agg: str = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic regression loss towards the returns, optionally clipped around the old values.

    Per token, with R the GAE return (λ_critic = 1 in VAPO: the Monte-Carlo return):
        without clip_range:  ℓ = ½·(V − R)²
        with clip_range ε_v: ℓ = ½·max((V − R)², (V_clip − R)²),
                             V_clip = V_old + clip(V − V_old, −ε_v, ε_v)

    Args:
        values: V(s_t) from the critic being trained, shape (B, T), with gradient.
        old_values: V_old(s_t) from the rollout, shape (B, T).
        returns: regression targets R, shape (B, T).
        response_mask: (B, T) bool or float {0, 1} mask of valid tokens.
        clip_range: ε_v ≥ 0, or None for the unclipped loss.
        loss_agg: one of `policy.LOSS_AGG_MODES`.
        normalizer: optional denominator for micro-batching, see `policy.aggregate_loss`.

    Returns:
        (loss, metrics): 0-dim loss; detached 0-dim metrics `clipfrac` (fraction of valid tokens
        where the clipped term is strictly larger; 0 without clip_range) and `explained_variance`.

    Raises:
        ValueError: if clip_range is negative or loss_agg is unknown.
    """
    if clip_range is not None and not clip_range >= 0:
        raise ValueError(
            f"clip_range={clip_range!r} is negative: the value clip keeps V within ±clip_range "
            "of V_old. Set it >= 0, or None to disable value clipping."
        )
    mask = response_mask.bool()
    returns = returns.detach()
    unclipped = (values - returns) ** 2  # (V − R)²
    if clip_range is None:
        loss_mat = 0.5 * unclipped  # ℓ = ½(V − R)²
        clipped_larger = torch.zeros_like(mask)
    else:
        old_values = old_values.detach()
        values_clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        clipped = (values_clipped - returns) ** 2  # (V_clip − R)²
        loss_mat = 0.5 * torch.maximum(unclipped, clipped)  # ℓ = ½·max((V−R)², (V_clip−R)²)
        clipped_larger = clipped > unclipped
    loss = aggregate_loss(loss_mat, mask, loss_agg, normalizer)
    with torch.no_grad():
        metrics = {
            "clipfrac": masked_mean(clipped_larger.to(values.dtype), mask),
            "explained_variance": explained_variance(values.detach(), returns, mask),
        }
    return loss, metrics


VAR_RTOL = 1e-8  # explained variance is undefined where Var(R) ≤ this x E[R² + V²]


def explained_variance(values: Tensor, returns: Tensor, response_mask: Tensor) -> Tensor:
    """Explained variance 1 − Var(R − V)/Var(R) of the returns by the values, over valid tokens.

    1 is a perfect critic, 0 is no better than predicting the mean return, < 0 is worse.
    VAPO's value pretraining watches it to decide when the critic is ready.

    Args:
        values: V(s_t), shape (B, T).
        returns: R, shape (B, T).
        response_mask: (B, T) bool or float {0, 1} mask of valid tokens.

    Returns:
        0-dim tensor; population variances over valid tokens. NaN when Var(R) is 0 up to
        rounding (e.g. every response got the same reward: the returns A + V of λ = 1 then equal
        it only to float precision) or there are no valid tokens: the ratio is undefined there.
    """
    var_returns = masked_var(returns, response_mask)
    var_residual = masked_var(returns - values, response_mask)
    # Var(R) within rounding of 0, relative to the scale of R and V: GAE's compiled scan returns
    # an all-wrong batch's R = A + V as ±1e-9, not 0, which made EV about −1e14 in a logged run
    scale = masked_mean(returns.square() + values.square(), response_mask)
    defined = var_returns > VAR_RTOL * scale
    safe_var = torch.where(defined, var_returns, torch.ones_like(var_returns))
    ev = 1.0 - var_residual / safe_var  # EV = 1 − Var(R − V)/Var(R)
    return torch.where(defined, ev, torch.full_like(ev, float("nan")))
