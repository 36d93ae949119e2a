"""PPO clipped policy loss and the loss aggregation modes VAPO ablates.

VAPO's token-level loss (component `token_level_loss`) averages over every token of the batch, so
long responses weigh in proportion to their length; plain PPO's sample-level loss averages each
response's tokens first. Clip-Higher (component `clip_higher`, from DAPO) widens the upper clip
bound to 1 + eps_high with eps_high > eps_low.
"""

from __future__ import annotations

import torch
from torch import Tensor

from vapo_lab.algo.masked import masked_mean, masked_sum

# The valid `loss_agg` modes; names follow verl's `loss_agg_mode`.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator, or 0 where denominator is 0 (value and gradient stay finite)."""
    positive = denominator > 0
    # Divide by 1 where the denominator is 0 so that neither branch of torch.where holds 0/0,
    # whose nan would otherwise reach the gradient.
    safe = torch.where(positive, denominator, torch.ones_like(denominator))
    return torch.where(positive, numerator / safe, torch.zeros_like(numerator))


def _as_normalizer(normalizer: float | Tensor, like: Tensor) -> Tensor:
    """The normalizer as a 0-dim tensor with the dtype and device of `like`."""
    return torch.as_tensor(normalizer, dtype=like.dtype, device=like.device).detach()


def _check_mode(mode: str) -> None:
    """Raises ValueError when ``mode`` is not one of LOSS_AGG_MODES."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"loss_agg={mode!r} is not a loss aggregation mode. Choose one of "
            f"{', '.join(LOSS_AGG_MODES)} (token-mean is VAPO's token-level loss)."
        )


def loss_denominator(mode: str, response_mask: Tensor) -> Tensor:
    """The denominator N of `aggregate_loss` in `mode` over `response_mask`, a 0-dim integer tensor.

    With L_b = Σ_t m_{b,t}: "token-mean" divides by N = Σ_{b,t} m (every valid token); the
    sequence modes by N = #{b : L_b > 0} (every non-empty row). To split a mini-batch into
    micro-batches, compute N once over the mini-batch's mask and pass it to every micro-batch's
    loss as its `normalizer`.

    Args:
        mode: one of LOSS_AGG_MODES.
        response_mask: (B, T) bool or float {0, 1} mask of valid tokens.

    Raises:
        ValueError: if mode is not one of LOSS_AGG_MODES.
    """
    _check_mode(mode)
    mask = response_mask.bool()
    if mode == "token-mean":
        return mask.sum()
    return (mask.sum(dim=-1) > 0).sum()


def aggregate_loss(
    loss_mat: Tensor,
    response_mask: Tensor,
    mode: str,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Scalar loss reduced from per-token losses over valid tokens, in one of LOSS_AGG_MODES.

    With m the mask, L_b = Σ_t m_{b,t} and N the denominator (`loss_denominator`):
        "token-mean":          Σ_{b,t} ℓ·m / N,            N = Σ_{b,t} m (VAPO token-level loss)
        "seq-mean-token-mean": Σ_b (Σ_t ℓ·m / L_b) / N,    N = #{b : L_b > 0} (PPO sample-level)
        "seq-mean-token-sum":  Σ_b Σ_t ℓ·m / N,            N = #{b : L_b > 0}
    Rows with L_b = 0 contribute 0; N = 0 gives a loss of 0.

    A `normalizer` replaces the default N. To split a mini-batch into micro-batches, pass every
    micro-batch the *mini-batch's* N (its total tokens or non-empty rows): the micro-batch losses
    then sum to the unsplit loss, and so do their gradients.

    Args:
        loss_mat: per-token losses ℓ, shape (B, T).
        response_mask: (B, T) bool or float {0, 1} mask of valid tokens.
        mode: one of LOSS_AGG_MODES.
        normalizer: optional float or 0-dim tensor N replacing the default denominator.

    Returns:
        0-dim loss tensor, differentiable with respect to `loss_mat`.

    Raises:
        ValueError: if mode is not one of LOSS_AGG_MODES.
    """
    _check_mode(mode)
    mask = response_mask.bool()
    if mode == "token-mean":
        total = masked_sum(loss_mat, mask)  # Σ_{b,t} ℓ·m
    else:
        row_sums = masked_sum(loss_mat, mask, dim=-1)  # Σ_t ℓ·m per row, (B,)
        if mode == "seq-mean-token-mean":
            lengths = mask.sum(dim=-1).to(loss_mat.dtype)  # L_b, (B,)
            row_sums = _safe_divide(row_sums, lengths)  # Σ_t ℓ·m / L_b; 0 for empty rows
        total = row_sums.sum()
    if normalizer is None:
        denominator = loss_denominator(mode, mask).to(loss_mat.dtype)
    else:
        denominator = _as_normalizer(normalizer, loss_mat)
    return _safe_divide(total, denominator)


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    loss_agg: str = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate loss with asymmetric (Clip-Higher) bounds, and its clip metrics.

    Per token, with r = π(y_t)/π_old(y_t) = exp(logprobs − old_logprobs):
        ℓ = max(−A·r, −A·clip(r, 1 − eps_low, 1 + eps_high))
    With dual_clip = c > 1 (Ye et al. 2020), tokens with A < 0 also get ℓ = min(ℓ, −c·A), which
    bounds the loss when r is far above 1 on a negative advantage.

    Clip-Higher (VAPO/DAPO: eps_low = 0.2, eps_high = 0.28): a token with A > 0 and
    1.2 < r < 1.28 is clipped (zero gradient) with eps_high = 0.2 but not with eps_high = 0.28.

    Args:
        logprobs: log π(y_t) under the current policy, shape (B, T), with gradient.
        old_logprobs: log π_old(y_t) from the rollout policy, shape (B, T).
        advantages: A_t, shape (B, T).
        response_mask: (B, T) bool or float {0, 1} mask of valid tokens.
        eps_low: lower clip ε_low ≥ 0; the ratio is clipped below at 1 − eps_low.
        eps_high: upper clip ε_high ≥ 0; the ratio is clipped above at 1 + eps_high.
        dual_clip: optional c > 1 for dual-clip PPO; None disables it.
        loss_agg: one of LOSS_AGG_MODES.
        normalizer: optional denominator for micro-batching, see `aggregate_loss`.

    Returns:
        (loss, metrics): loss is 0-dim; metrics are detached 0-dim masked means over valid tokens:
        `clipfrac_low` (A < 0 and r < 1 − eps_low), `clipfrac_high` (A > 0 and r > 1 + eps_high),
        `clipfrac_dual` (dual clip active; 0 without it) and `approx_kl`, the mean of the k3
        estimator (r − 1) − log r of KL(π_old‖π).

    Raises:
        ValueError: if eps_low or eps_high is negative, dual_clip is not > 1, or loss_agg is
            unknown.
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(
            f"eps_low={eps_low!r}, eps_high={eps_high!r}: clip ranges must be >= 0 "
            "(the ratio is clipped to [1 - eps_low, 1 + eps_high]). Set both to values >= 0."
        )
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(
            f"dual_clip={dual_clip!r} must be > 1: it bounds the loss of negative-advantage tokens "
            "at -c·A, which needs c > 1 to exceed the clipped loss. Use e.g. 3.0, or None."
        )
    mask = response_mask.bool()
    # Select, not multiply: garbage log-probs at padded positions could overflow exp to inf,
    # and a zero gradient times inf is nan. There r = 1 and A = 0, so ℓ = 0.
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    advantages = torch.where(mask, advantages, torch.zeros_like(advantages)).detach()
    ratio = torch.exp(log_ratio)  # r = π/π_old
    unclipped = -advantages * ratio  # −A·r
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # −A·clip(r)
    loss_mat = torch.maximum(unclipped, clipped)  # ℓ = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high))
    negative = advantages < 0
    if dual_clip is not None:
        dual_bound = -dual_clip * advantages  # −c·A
        dual_active = negative & (loss_mat > dual_bound)
        loss_mat = torch.where(negative, torch.minimum(loss_mat, dual_bound), loss_mat)
    else:
        dual_active = torch.zeros_like(mask)
    loss = aggregate_loss(loss_mat, mask, loss_agg, normalizer)

    with torch.no_grad():
        ratio = ratio.detach()
        log_ratio = log_ratio.detach()
        dtype = ratio.dtype
        metrics = {
            "clipfrac_low": masked_mean((negative & (ratio < 1.0 - eps_low)).to(dtype), mask),
            "clipfrac_high": masked_mean(
                ((advantages > 0) & (ratio > 1.0 + eps_high)).to(dtype), mask
            ),
            "clipfrac_dual": masked_mean(dual_active.to(dtype), mask),
            # k3 = (r − 1) − log r ≥ 0 estimates KL(π_old‖π) on samples from π_old (Schulman 2020).
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask),
        }
    return loss, metrics
