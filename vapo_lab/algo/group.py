"""Group-relative advantages and DAPO's sample filters for group sampling (G samples per prompt)."""

from __future__ import annotations

import torch
from torch import Tensor


def _check_groups(scores: Tensor, group_size: int) -> None:
    """Raise ValueError unless scores is (B,) with B a multiple of group_size ≥ 1."""
    if group_size < 1:
        raise ValueError(
            f"group_size={group_size!r} is below 1: a group holds the G >= 1 samples of one "
            "prompt. Set group_size >= 1."
        )
    if scores.dim() != 1 or scores.shape[0] % group_size != 0:
        raise ValueError(
            f"scores of shape {tuple(scores.shape)} do not split into groups of {group_size}: "
            f"pass (B,) scores with B a multiple of group_size, consecutive rows per prompt."
        )


def group_advantages(
    scores: Tensor, group_size: int, norm_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantage of each response against the other samples of its prompt.

    Â_i = (r_i − mean_g)/(std_g + eps) as in GRPO/DAPO, std_g the unbiased (Bessel, G − 1)
    sample standard deviation as `torch.std` gives; norm_std=False gives r_i − mean_g (Dr. GRPO).

    Args:
        scores: rewards r, shape (B,), B = number of prompts × G; rows [k·G, (k+1)·G) belong to
            prompt k.
        group_size: G ≥ 1.
        norm_std: divide by the group std.
        eps: added to the std, so all-equal groups give 0, not nan.

    Returns:
        Â, shape (B,), floating (float32 for integer or bool scores). For G = 1 it is 0: a lone
        sample has nothing to be compared with (and its unbiased std is undefined).

    Raises:
        ValueError: if group_size < 1 or B is not a multiple of group_size.
    """
    _check_groups(scores, group_size)
    if not scores.is_floating_point():
        scores = scores.to(torch.float32)
    if group_size == 1:
        return torch.zeros_like(scores)
    grouped = scores.view(-1, group_size)  # (B/G, G)
    centred = grouped - grouped.mean(dim=-1, keepdim=True)  # r_i − mean_g
    if norm_std:
        std = grouped.std(dim=-1, unbiased=True, keepdim=True)  # Bessel-corrected, as in GRPO
        centred = centred / (std + eps)  # Â = (r − mean_g)/(std_g + eps)
    return centred.reshape(-1)


def dynamic_sampling_keep(scores: Tensor, group_size: int) -> Tensor:
    """Which responses DAPO dynamic sampling keeps: every row of a group with unequal scores.

    A group whose samples are all correct (or all wrong) has zero group-relative advantage and
    gives no policy gradient; DAPO drops it and samples more prompts.

    Args:
        scores: rewards, shape (B,), consecutive groups of G.
        group_size: G ≥ 1.

    Returns:
        (B,) bool, True for every row of a group whose scores are not all equal (always False
        for G = 1).

    Raises:
        ValueError: if group_size < 1 or B is not a multiple of group_size.
    """
    _check_groups(scores, group_size)
    grouped = scores.view(-1, group_size)
    varied = grouped.amax(dim=-1) != grouped.amin(dim=-1)  # (B/G,)
    return varied.repeat_interleave(group_size)


def overlong_penalty(lengths: Tensor, l_max: int, l_cache: int, penalty: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment, a reward added per response for lengths near the limit.

        R(l) = 0                                     if l ≤ l_max − l_cache
        R(l) = ((l_max − l_cache) − l)/l_cache · p   if l_max − l_cache < l ≤ l_max
        R(l) = −p                                    if l > l_max

    Args:
        lengths: response lengths l, shape (B,).
        l_max: maximum length L_max.
        l_cache: length of the soft-punishment interval L_cache, 0 < l_cache ≤ l_max.
        penalty: p, the punishment at and beyond l_max.

    Returns:
        (B,) penalties ≤ 0, float32 (float64 if lengths is float64).

    Raises:
        ValueError: unless 0 < l_cache ≤ l_max.
    """
    if not 0 < l_cache <= l_max:
        raise ValueError(
            f"l_cache={l_cache!r} with l_max={l_max!r}: the soft punishment interval needs "
            "0 < l_cache <= l_max. Set l_cache to a positive length no larger than l_max."
        )
    dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
    l = lengths.to(dtype)
    start = l_max - l_cache
    ramp = (start - l) / l_cache * penalty  # ((L_max − L_cache) − l)/L_cache · p
    out = torch.where(l > start, ramp, torch.zeros_like(l))
    return torch.where(l > l_max, torch.full_like(l, -penalty), out)
