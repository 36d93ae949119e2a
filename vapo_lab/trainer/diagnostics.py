"""Per-step ``diag/*`` metrics for what VAPO argues but does not plot: the critic's bias by token
position, length against correctness, and the advantage gap that reaches early tokens of long
responses (docs/training.md#metrics says what each shows). Pure functions of tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

EDGES: tuple[int, ...] = (0, 8, 16, 32, 64, 128, 256)
# responses this long or longer are "long" for the advantage gap (~4x the default task's median)
LONG_RESPONSE = 64


def bucket_labels(edges: tuple[int, ...] = EDGES) -> list[str]:
    """Returns one label per bucket, e.g. ["000_007", "008_015", ..., "256_up"]."""
    return [f"{lo:03d}_{hi - 1:03d}" for lo, hi in zip(edges, edges[1:])] + [f"{edges[-1]:03d}_up"]


def bucket_of(x: Tensor, edges: tuple[int, ...] = EDGES) -> Tensor:
    """Returns the bucket index of each value of ``x``: i where edges[i] <= x < edges[i + 1]
    (values below edges[0] go to bucket 0, values from edges[-1] on to the last)."""
    return torch.bucketize(
        x.to(torch.float64), torch.tensor(edges[1:], dtype=torch.float64), right=True
    )


def value_bias_by_position(
    values: Tensor, mc_returns: Tensor, mask: Tensor, edges: tuple[int, ...] = EDGES
) -> dict[str, float]:
    """Returns {bucket label: mean of V(s_t) − G_t over valid tokens at positions in the bucket}
    (buckets without tokens left out) and "all": the mean over every valid token.

    Args:
        values: critic values V(s_t), (B, T).
        mc_returns: realised returns G_t, (B, T).
        mask: (B, T) valid-token mask.
    """
    valid = mask.bool()
    if not valid.any():
        return {}
    err = values.double() - mc_returns.double()
    pos = torch.arange(values.shape[1]).expand_as(values)
    which = bucket_of(pos, edges)
    out = {}
    for i, label in enumerate(bucket_labels(edges)):
        sel = valid & (which == i)
        if sel.any():
            out[label] = float(err[sel].mean())
    out["all"] = float(err[valid].mean())
    return out


def value_bias_sums(
    values: Tensor, mc_returns: Tensor, mask: Tensor, edges: tuple[int, ...] = EDGES
) -> tuple[Tensor, Tensor]:
    """Returns (Σ V(s_t) − G_t, token count) per position bucket and, last, over every valid token
    (float64): the parts of ``value_bias_by_position`` that add up over ranks."""
    valid = mask.bool()
    err = values.double() - mc_returns.double()
    which = bucket_of(torch.arange(values.shape[1]).expand_as(values), edges)
    n = len(edges)
    sums = torch.zeros(n + 1, dtype=torch.float64)
    counts = torch.zeros(n + 1, dtype=torch.float64)
    for i in range(n):
        sel = valid & (which == i)
        sums[i], counts[i] = err[sel].sum(), sel.sum()
    sums[n], counts[n] = err[valid].sum(), valid.sum()
    return sums, counts


def value_bias_from_sums(
    sums: Tensor, counts: Tensor, edges: tuple[int, ...] = EDGES
) -> dict[str, float]:
    """Returns ``value_bias_by_position``'s dict from the (summed) parts ``value_bias_sums``
    returned."""
    if counts[-1] == 0:
        return {}
    out = {
        label: float(sums[i] / counts[i])
        for i, label in enumerate(bucket_labels(edges))
        if counts[i] > 0
    }
    out["all"] = float(sums[-1] / counts[-1])
    return out


def length_profile(
    lengths: Tensor, correct: Tensor, edges: tuple[int, ...] = EDGES
) -> dict[str, float]:
    """Returns per length bucket "count_<label>" (responses) and "acc_<label>" (fraction correct,
    only for non-empty buckets), and "correct_mean" / "wrong_mean" (mean length of the correct /
    wrong responses, when there are any)."""
    which = bucket_of(lengths, edges)
    ok = correct.bool()
    out: dict[str, float] = {}
    for i, label in enumerate(bucket_labels(edges)):
        sel = which == i
        out[f"count_{label}"] = float(sel.sum())
        if sel.any():
            out[f"acc_{label}"] = float(ok[sel].float().mean())
    lengths = lengths.double()
    if ok.any():
        out["correct_mean"] = float(lengths[ok].mean())
    if (~ok).any():
        out["wrong_mean"] = float(lengths[~ok].mean())
    return out


def advantage_gap_sums(
    advantages: Tensor,
    mask: Tensor,
    correct: Tensor,
    lengths: Tensor,
    min_length: int = LONG_RESPONSE,
    edges: tuple[int, ...] = EDGES,
) -> Tensor:
    """Returns the parts of :func:`advantage_gap_from_sums` that add up over ranks: a float64 (4, n)
    tensor of Σ advantage and token counts per position bucket, for the correct (rows 0, 1) and the
    wrong (rows 2, 3) responses of at least ``min_length`` tokens.

    Args:
        advantages: (B, T) the advantages the policy update uses.
        mask: (B, T) valid-token mask.
        correct: (B,) whether each response is correct.
        lengths: (B,) response lengths in tokens.
    """
    valid = mask.bool() & (lengths >= min_length).unsqueeze(1)
    which = bucket_of(torch.arange(advantages.shape[1]).expand_as(advantages), edges)
    ok = correct.bool().unsqueeze(1)
    adv = advantages.double()
    out = torch.zeros(4, len(edges), dtype=torch.float64)
    for i in range(len(edges)):
        for row, side in ((0, ok), (2, ~ok)):
            sel = valid & side & (which == i)
            out[row, i], out[row + 1, i] = adv[sel].sum(), sel.sum()
    return out


def advantage_gap_from_sums(sums: Tensor, edges: tuple[int, ...] = EDGES) -> dict[str, float]:
    """Returns {bucket label: mean advantage of correct long responses' tokens − of wrong ones'} for
    the buckets where both kinds have tokens (``sums`` from :func:`advantage_gap_sums`, summed over
    ranks); empty when a step has no correct or no wrong long response."""
    out = {}
    for i, label in enumerate(bucket_labels(edges)):
        if sums[1, i] > 0 and sums[3, i] > 0:
            out[label] = float(sums[0, i] / sums[1, i] - sums[2, i] / sums[3, i])
    return out
