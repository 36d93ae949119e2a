"""Tests for vapo_lab.algo.value: value_loss, explained_variance.

ℓ = ½·max((V − R)², (V_clip − R)²), V_clip = V_old + clip(V − V_old, −ε_v, ε_v);
without clip_range ℓ = ½(V − R)².  explained variance = 1 − Var(R − V)/Var(R), population
variances over valid tokens.  Hand derivations are in comments.
"""

import math

import torch

from tests.algo.helpers import F64, close, prefix_mask
from vapo_lab.algo.masked import masked_var
from vapo_lab.algo.policy import LOSS_AGG_MODES
from vapo_lab.algo.value import explained_variance, value_loss

# Four valid tokens and one padded garbage token (column 4):
#   t0: V = 1.0,  V_old = 0.5, R = 0.0:  (V−R)² = 1;    V_clip = 0.5 + 0.2 = 0.7, (0.7)² = 0.49
#       -> max = 1 (unclipped), ℓ = 0.5
#   t1: V = 0.9,  V_old = 0.0, R = 1.0:  (V−R)² = 0.01; V_clip = 0.2, (0.2 − 1)² = 0.64
#       -> max = 0.64 (clipped strictly larger), ℓ = 0.32
#   t2: V = 2.0,  V_old = 2.0, R = 2.5:  (V−R)² = 0.25; V_clip = 2.0, 0.25 -> equal, ℓ = 0.125
#   t3: V = −0.5, V_old = 0.0, R = −1.0: (V−R)² = 0.25; V_clip = −0.2, (0.8)² = 0.64
#       -> clipped strictly larger, ℓ = 0.32
VALUES = [[1.0, 0.9, 2.0, -0.5, 40.0]]
OLD_VALUES = [[0.5, 0.0, 2.0, 0.0, -40.0]]
RETURNS = [[0.0, 1.0, 2.5, -1.0, 13.0]]
MASK = prefix_mask([4], 5)


def test_value_loss_without_clip_by_hand():
    torch.manual_seed(0)
    # ℓ = ½(V − R)² = [0.5, 0.005, 0.125, 0.125]; token-mean = 0.755/4 = 0.18875
    # d loss/dV = (V − R)/4 = [0.25, −0.025, −0.125, 0.125, 0]
    values = torch.tensor(VALUES, dtype=F64, requires_grad=True)
    loss, metrics = value_loss(
        values, torch.tensor(OLD_VALUES, dtype=F64), torch.tensor(RETURNS, dtype=F64), MASK
    )
    close(loss, 0.18875)
    loss.backward()
    close(values.grad, [[0.25, -0.025, -0.125, 0.125, 0.0]])
    close(metrics["clipfrac"], 0.0)


def test_value_loss_with_clip_by_hand():
    torch.manual_seed(1)
    # ℓ = [0.5, 0.32, 0.125, 0.32]; token-mean = 1.265/4 = 0.31625; clipfrac = 2/4 = 0.5
    # gradient: t0 unclipped (V − R)/4 = 0.25; t1, t3 clipped constant -> 0;
    # t2: V − V_old = 0 is inside the clip range so V_clip = V, both terms give (V − R)/4 = −0.125
    values = torch.tensor(VALUES, dtype=F64, requires_grad=True)
    loss, metrics = value_loss(
        values,
        torch.tensor(OLD_VALUES, dtype=F64),
        torch.tensor(RETURNS, dtype=F64),
        MASK,
        clip_range=0.2,
    )
    close(loss, 0.31625)
    loss.backward()
    close(values.grad, [[0.25, 0.0, -0.125, 0.0, 0.0]])
    close(metrics["clipfrac"], 0.5)
    assert metrics["clipfrac"].dim() == 0 and not metrics["clipfrac"].requires_grad


def test_value_loss_other_aggregations():
    torch.manual_seed(2)
    # Two rows: row 0 is the four tokens above (no clip: ℓ sum 0.755, mean 0.18875),
    # row 1 has L = 1: V = 1, R = 3 -> ℓ = ½·4 = 2.
    #   seq-mean-token-mean = (0.18875 + 2)/2 = 1.094375
    #   seq-mean-token-sum  = (0.755 + 2)/2 = 1.3775
    #   token-mean          = (0.755 + 2)/5 = 0.551
    values = torch.tensor(VALUES + [[1.0, 5.0, 5.0, 5.0, 5.0]], dtype=F64)
    old = torch.tensor(OLD_VALUES + [[0.0] * 5], dtype=F64)
    returns = torch.tensor(RETURNS + [[3.0, -5.0, -5.0, -5.0, -5.0]], dtype=F64)
    mask = prefix_mask([4, 1], 5)
    expected = {"seq-mean-token-mean": 1.094375, "seq-mean-token-sum": 1.3775, "token-mean": 0.551}
    for mode, value in expected.items():
        loss, _ = value_loss(values, old, returns, mask, loss_agg=mode)
        close(loss, value)


def test_value_loss_random_vs_per_token_loop_and_micro_batches():
    torch.manual_seed(3)
    B, T, eps_v = 7, 8, 0.3
    mask = prefix_mask([5, 0, 8, 1, 3, 6, 2], T)
    old = torch.randn(B, T, dtype=F64)
    values = (old + 0.5 * torch.randn(B, T, dtype=F64)).requires_grad_(True)
    returns = torch.randn(B, T, dtype=F64)
    for mode in LOSS_AGG_MODES:
        loss, metrics = value_loss(values, old, returns, mask, clip_range=eps_v, loss_agg=mode)
        # slow reference
        V, Vo, R, m = values.tolist(), old.tolist(), returns.tolist(), mask.tolist()
        lengths = [sum(row) for row in m]
        n_tok, n_rows = sum(lengths), sum(1 for L in lengths if L > 0)
        total, n_clip = 0.0, 0
        grad = torch.zeros(B, T, dtype=F64)
        for b in range(B):
            for t in range(lengths[b]):
                v_clip = Vo[b][t] + min(max(V[b][t] - Vo[b][t], -eps_v), eps_v)
                un, cl = (V[b][t] - R[b][t]) ** 2, (v_clip - R[b][t]) ** 2
                if cl > un:
                    ell, g = 0.5 * cl, 0.0
                    n_clip += 1
                else:
                    ell, g = 0.5 * un, V[b][t] - R[b][t]
                w = {
                    "token-mean": 1 / n_tok,
                    "seq-mean-token-mean": 1 / (lengths[b] * n_rows),
                    "seq-mean-token-sum": 1 / n_rows,
                }[mode]
                total += w * ell
                grad[b, t] = w * g
        close(loss, total, atol=1e-9)
        (g,) = torch.autograd.grad(loss, values)
        close(g, grad, atol=1e-9)
        close(metrics["clipfrac"], n_clip / n_tok, atol=1e-9)
        # micro-batches of 2, 1, 4 rows with the mini-batch normalizer
        N = float(mask.sum()) if mode == "token-mean" else float((mask.sum(1) > 0).sum())
        split = sum(
            value_loss(
                values[s],
                old[s],
                returns[s],
                mask[s],
                clip_range=eps_v,
                loss_agg=mode,
                normalizer=N,
            )[0]
            for s in [slice(0, 2), slice(2, 3), slice(3, 7)]
        )
        (g_split,) = torch.autograd.grad(split, values)
        close(split, loss, atol=1e-12)
        close(g_split, g, atol=1e-12)


# ---------------------------------------------------------------------------------------
# explained_variance
# ---------------------------------------------------------------------------------------


def test_explained_variance_by_hand():
    torch.manual_seed(10)
    # R = [1, 2, 3, 4], V = [1, 2, 3, 3] (+ padded garbage):
    #   R − V = [0, 0, 0, 1]: mean 0.25, Var = (3·0.0625 + 0.5625)/4 = 0.75/4 = 0.1875
    #   Var(R): mean 2.5, squared deviations 2.25, 0.25, 0.25, 2.25 -> 5/4 = 1.25
    #   EV = 1 − 0.1875/1.25 = 1 − 0.15 = 0.85
    returns = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, -9.0]], dtype=F64)
    values = torch.tensor([[1.0, 2.0, 50.0], [3.0, 3.0, 50.0]], dtype=F64)
    mask = prefix_mask([2, 2], 3)
    ev = explained_variance(values, returns, mask)
    assert ev.dim() == 0
    close(ev, 0.85)


def test_explained_variance_perfect_prediction_is_one():
    torch.manual_seed(11)
    returns = torch.randn(4, 6, dtype=F64)
    mask = prefix_mask([6, 3, 0, 2], 6)
    values = torch.where(mask, returns, torch.randn(4, 6, dtype=F64))  # wrong only in padding
    close(explained_variance(values, returns, mask), 1.0)


def test_explained_variance_constant_returns_is_nan():
    torch.manual_seed(12)
    # all-correct / all-wrong batch with λ = 1: returns are all 1 (or all 0), Var(R) = 0 exactly
    values = torch.randn(2, 3, dtype=F64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    for const in [1.0, 0.0]:
        returns = torch.full((2, 3), const, dtype=F64)
        assert math.isnan(explained_variance(values, returns, mask).item())
    # an all-wrong batch's returns A + V of λ = 1 as a compiled scan rounds them: ±1e-9, not 0
    # (logged: EV −1.3e14 at a step with accuracy 0); Var(R) ~1e-18 against values ~0.04
    v32 = torch.tensor([[0.041, 0.043, 0.039], [0.044, 0.040, 0.042]])
    r32 = torch.tensor([[1e-9, -2e-9, 0.0], [3e-9, 0.0, -1e-9]])
    assert masked_var(r32, mask) > 0
    assert math.isnan(explained_variance(v32, r32, mask).item())
    # a real spread of the same returns is kept: one right response in six (Var(R) = 5/36)
    r_real = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert not math.isnan(explained_variance(v32, r_real, mask).item())
    # constant over the valid tokens only (padding holds other values)
    returns = torch.tensor([[1.0, 1.0, 5.0], [1.0, -2.0, 3.0]], dtype=F64)
    assert math.isnan(explained_variance(values, returns, prefix_mask([2, 1], 3)).item())
    # no valid tokens: NaN as well
    assert math.isnan(
        explained_variance(
            values, torch.randn(2, 3, dtype=F64), torch.zeros(2, 3, dtype=torch.bool)
        ).item()
    )


def test_explained_variance_random_vs_loop_and_metric():
    torch.manual_seed(13)
    B, T = 5, 7
    mask = prefix_mask([7, 2, 0, 5, 1], T)
    returns = torch.randn(B, T, dtype=F64)
    values = returns + 0.4 * torch.randn(B, T, dtype=F64)
    R = [returns[b, t].item() for b in range(B) for t in range(T) if mask[b, t]]
    V = [values[b, t].item() for b in range(B) for t in range(T) if mask[b, t]]
    n = len(R)

    def pvar(xs):
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / len(xs)

    expected = 1.0 - pvar([r - v for r, v in zip(R, V)]) / pvar(R)
    close(explained_variance(values, returns, mask), expected, atol=1e-9)
    assert n == 15
    # value_loss reports the same explained variance as a metric
    _, metrics = value_loss(values, values.detach(), returns, mask)
    close(metrics["explained_variance"], expected, atol=1e-9)
