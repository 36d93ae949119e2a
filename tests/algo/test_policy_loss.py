"""Tests for vapo_lab.algo.policy: aggregate_loss, loss_denominator, ppo_policy_loss,
LOSS_AGG_MODES.

Hand cases carry their derivation in comments; random batches are checked against a slow
per-token reference written in plain Python below (loss, analytic gradient, metrics).

ratio r = exp(logprobs − old_logprobs); ℓ = max(−A·r, −A·clip(r, 1 − ε_low, 1 + ε_high));
dual clip c (A < 0 only): ℓ = min(ℓ, −c·A).
"""

import math

import pytest
import torch

from tests.algo.helpers import F64, close, prefix_mask
from vapo_lab.algo.policy import LOSS_AGG_MODES, aggregate_loss, loss_denominator, ppo_policy_loss


def logprobs_for_ratios(ratios, old):
    """logprobs such that exp(logprobs − old) = ratios (a leaf requiring grad)."""
    old = torch.as_tensor(old, dtype=F64)
    lp = (old + torch.log(torch.as_tensor(ratios, dtype=F64))).detach().requires_grad_(True)
    return lp, old


# ---------------------------------------------------------------------------------------
# Slow per-token reference
# ---------------------------------------------------------------------------------------


def ref_ppo(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, dual_clip, mode):
    """Returns (loss, dloss/dlogprobs as a (B,T) tensor, metrics dict), all by Python loops."""
    lp = logprobs.detach().double().tolist()
    olp = old_logprobs.detach().double().tolist()
    adv = advantages.detach().double().tolist()
    m = mask.bool().tolist()
    B, T = len(lp), len(lp[0])
    lengths = [sum(1 for x in row if x) for row in m]
    n_tokens = sum(lengths)
    n_rows = sum(1 for L in lengths if L > 0)
    loss = 0.0
    grad = [[0.0] * T for _ in range(B)]
    n_low = n_high = n_dual = 0
    kl_sum = 0.0
    for b in range(B):
        for t in range(lengths[b]):
            A = adv[b][t]
            r = math.exp(lp[b][t] - olp[b][t])
            unclipped = -A * r
            clipped = -A * min(max(r, 1.0 - eps_low), 1.0 + eps_high)
            if unclipped >= clipped:
                ell, g = unclipped, -A * r  # d(−A·r)/d logprob = −A·r
            else:
                ell, g = clipped, 0.0  # clipped term is constant in logprob
            if dual_clip is not None and A < 0 and ell > -dual_clip * A:
                ell, g = -dual_clip * A, 0.0
                n_dual += 1
            if A < 0 and r < 1.0 - eps_low:
                n_low += 1
            if A > 0 and r > 1.0 + eps_high:
                n_high += 1
            kl_sum += (r - 1.0) - math.log(r)
            if mode == "token-mean":
                w = 1.0 / n_tokens
            elif mode == "seq-mean-token-mean":
                w = 1.0 / (lengths[b] * n_rows)
            elif mode == "seq-mean-token-sum":
                w = 1.0 / n_rows
            else:
                raise AssertionError(mode)
            loss += w * ell
            grad[b][t] = w * g
    metrics = {
        "clipfrac_low": n_low / n_tokens,
        "clipfrac_high": n_high / n_tokens,
        "clipfrac_dual": n_dual / n_tokens,
        "approx_kl": kl_sum / n_tokens,
    }
    return loss, torch.tensor(grad, dtype=F64), metrics


# ---------------------------------------------------------------------------------------
# aggregate_loss
# ---------------------------------------------------------------------------------------

# Three responses: row 0 has L = 1, ℓ = [4]; row 1 has L = 3, ℓ = [1, 2, 3]; row 2 is empty.
# Padding holds garbage (100).
AGG_L = torch.tensor([[4.0, 100.0, 100.0], [1.0, 2.0, 3.0], [100.0, 100.0, 100.0]], dtype=F64)
AGG_M = prefix_mask([1, 3, 0], 3)


def test_loss_agg_modes_exported():
    torch.manual_seed(0)
    assert isinstance(LOSS_AGG_MODES, tuple)
    # the spec's three
    assert set(LOSS_AGG_MODES) == {
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
    }


def test_aggregate_loss_three_modes_by_hand():
    torch.manual_seed(1)
    # token-mean: (4 + 1 + 2 + 3) / 4 valid tokens = 2.5
    # seq-mean-token-mean: row means 4 and (1+2+3)/3 = 2, over 2 non-empty rows: 3.0
    # seq-mean-token-sum: row sums 4 and 6, over 2 non-empty rows: 5.0
    expected = {"token-mean": 2.5, "seq-mean-token-mean": 3.0, "seq-mean-token-sum": 5.0}
    for mode, value in expected.items():
        ell = AGG_L.clone().requires_grad_(True)
        loss = aggregate_loss(ell, AGG_M, mode)
        assert loss.dim() == 0
        close(loss, value)


def test_token_mean_weights_long_response_tokens_more():
    torch.manual_seed(2)
    # d loss / d ℓ:
    #   token-mean: every valid token 1/4 (the long response holds 3/4 of the weight)
    #   seq-mean-token-mean: short row's token 1/(1·2) = 1/2; long row's tokens 1/(3·2) = 1/6
    #   seq-mean-token-sum: every valid token 1/2
    # Padding and the empty row get 0.
    expected = {
        "token-mean": [[0.25, 0, 0], [0.25, 0.25, 0.25], [0, 0, 0]],
        "seq-mean-token-mean": [[0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6], [0, 0, 0]],
        "seq-mean-token-sum": [[0.5, 0, 0], [0.5, 0.5, 0.5], [0, 0, 0]],
    }
    grads = {}
    for mode, g in expected.items():
        ell = AGG_L.clone().requires_grad_(True)
        aggregate_loss(ell, AGG_M, mode).backward()
        close(ell.grad, g)
        grads[mode] = ell.grad
    # a long response's token weighs more under token-mean than under sample-level loss
    assert grads["token-mean"][1, 0] > grads["seq-mean-token-mean"][1, 0]
    # and the short response's token weighs less
    assert grads["token-mean"][0, 0] < grads["seq-mean-token-mean"][0, 0]


def test_aggregate_loss_float_mask_equals_bool_mask():
    torch.manual_seed(3)
    for mode in LOSS_AGG_MODES:
        close(
            aggregate_loss(AGG_L, AGG_M.to(F64), mode),
            aggregate_loss(AGG_L, AGG_M, mode),
            atol=1e-12,
        )


def test_aggregate_loss_normalizer_replaces_denominator():
    torch.manual_seed(4)
    # token-mean: 10 / 10 = 1; seq-mean-token-mean: (4 + 2) / 4 = 1.5;
    # seq-mean-token-sum: 10 / 5 = 2
    close(aggregate_loss(AGG_L, AGG_M, "token-mean", normalizer=10.0), 1.0)
    close(aggregate_loss(AGG_L, AGG_M, "seq-mean-token-mean", normalizer=4.0), 1.5)
    close(aggregate_loss(AGG_L, AGG_M, "seq-mean-token-sum", normalizer=torch.tensor(5.0)), 2.0)


def test_loss_denominator_by_hand_and_as_the_default():
    # AGG_M: rows of 1, 3 and 0 valid tokens: 4 tokens, 2 non-empty rows
    expected = {"token-mean": 4, "seq-mean-token-mean": 2, "seq-mean-token-sum": 2}
    for mode, n in expected.items():
        assert loss_denominator(mode, AGG_M).item() == n
        assert loss_denominator(mode, AGG_M.to(F64)).item() == n
        # passed as the normalizer it gives the default loss bit for bit, gradient included
        a, b = AGG_L.clone().requires_grad_(True), AGG_L.clone().requires_grad_(True)
        la, lb = (
            aggregate_loss(a, AGG_M, mode),
            aggregate_loss(b, AGG_M, mode, float(loss_denominator(mode, AGG_M))),
        )
        la.backward()
        lb.backward()
        assert torch.equal(la, lb) and torch.equal(a.grad, b.grad)
    with pytest.raises(ValueError, match="is not a loss aggregation mode"):
        loss_denominator("mean", AGG_M)


def test_aggregate_loss_fully_masked():
    torch.manual_seed(5)
    ell = (torch.randn(3, 4, dtype=F64) * 5).requires_grad_(True)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for mode in LOSS_AGG_MODES:
        loss = aggregate_loss(ell, mask, mode)
        assert torch.isfinite(loss)
        close(loss, 0.0)
    # a fully masked row among others contributes nothing (checked by hand above: row 2 of AGG_L)


def test_aggregate_loss_unknown_mode_raises():
    torch.manual_seed(6)
    with pytest.raises(ValueError) as err:
        aggregate_loss(AGG_L, AGG_M, "token_mean")
    # the message names the valid modes
    assert "token-mean" in str(err.value)
    with pytest.raises(ValueError):
        aggregate_loss(AGG_L, AGG_M, "seq-mean")


def micro_slices():
    # a mini-batch of 7 rows split into micro-batches of unequal sizes 1, 4, 2
    return [slice(0, 1), slice(1, 5), slice(5, 7)]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregate_loss_micro_batch_property(mode):
    torch.manual_seed(7)
    B, T = 7, 6
    mask = prefix_mask([3, 0, 6, 1, 4, 2, 5], T)
    ell = torch.randn(B, T, dtype=F64, requires_grad=True)
    full = aggregate_loss(ell, mask, mode)
    (g_full,) = torch.autograd.grad(full, ell)
    N = float(loss_denominator(mode, mask))  # the whole mini-batch's, as the trainer passes it
    split = sum(aggregate_loss(ell[s], mask[s], mode, normalizer=N) for s in micro_slices())
    (g_split,) = torch.autograd.grad(split, ell)
    close(split, full, atol=1e-12)
    close(g_split, g_full, atol=1e-12)


# ---------------------------------------------------------------------------------------
# ppo_policy_loss: hand cases
# ---------------------------------------------------------------------------------------


def test_clip_higher_token_not_clipped_with_eps_high_028():
    torch.manual_seed(10)
    # One response, L = 2 of T = 3.  t0: A = 1, r = 1.25;  t1: A = 0.5, r = 1;  t2 padding.
    # ε_high = 0.28: clip(1.25, 0.8, 1.28) = 1.25, so ℓ0 = −1.25 (unclipped); ℓ1 = −0.5.
    #   token-mean loss = (−1.25 − 0.5) / 2 = −0.875
    #   gradient = −A·r/N: t0: −1.25/2 = −0.625, t1: −0.5/2 = −0.25, padding 0
    lp, old = logprobs_for_ratios([[1.25, 1.0, 1.0]], [[-1.0, -2.0, -0.5]])
    adv = torch.tensor([[1.0, 0.5, 7.0]], dtype=F64)
    mask = prefix_mask([2], 3)
    loss, metrics = ppo_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    close(loss, -0.875)
    loss.backward()
    close(lp.grad, [[-0.625, -0.25, 0.0]])
    close(metrics["clipfrac_high"], 0.0)
    close(metrics["clipfrac_low"], 0.0)


def test_clip_higher_token_clipped_with_eps_high_02():
    torch.manual_seed(11)
    # Same tokens, ε_high = 0.2: ℓ0 = max(−1.25, −1·1.2) = −1.2, the clipped constant,
    # so its gradient is 0.  loss = (−1.2 − 0.5)/2 = −0.85; gradient [0, −0.25, 0];
    # clipfrac_high = 1 of 2 valid tokens = 0.5.
    lp, old = logprobs_for_ratios([[1.25, 1.0, 1.0]], [[-1.0, -2.0, -0.5]])
    adv = torch.tensor([[1.0, 0.5, 7.0]], dtype=F64)
    mask = prefix_mask([2], 3)
    loss, metrics = ppo_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    close(loss, -0.85)
    loss.backward()
    close(lp.grad, [[0.0, -0.25, 0.0]])
    close(metrics["clipfrac_high"], 0.5)


def test_negative_advantage_below_one_minus_eps_low_is_clipped():
    torch.manual_seed(12)
    # t0: A = −1, r = 0.7 < 0.8: ℓ = max(0.7, 1·0.8) = 0.8, clipped, gradient 0.
    # t1: A = −1, r = 0.9 (inside): ℓ = max(0.9, 0.9) = 0.9, gradient −A·r/N = 0.9/2 = 0.45.
    # loss = (0.8 + 0.9)/2 = 0.85; clipfrac_low = 1/2.
    lp, old = logprobs_for_ratios([[0.7, 0.9]], [[-0.3, -1.7]])
    adv = torch.tensor([[-1.0, -1.0]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, metrics = ppo_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    close(loss, 0.85)
    loss.backward()
    close(lp.grad, [[0.0, 0.45]])
    close(metrics["clipfrac_low"], 0.5)
    close(metrics["clipfrac_high"], 0.0)


def test_clipfracs_and_approx_kl_counted_by_hand():
    torch.manual_seed(13)
    # ε_low = ε_high = 0.2, five valid tokens (A, r) and one padded garbage token:
    #   a (+1, 1.5): ℓ = max(−1.5, −1.2) = −1.2  clipped high  (grad 0)
    #   b (+1, 0.5): ℓ = max(−0.5, −0.8) = −0.5  unclipped     (grad −A·r = −0.5)
    #   c (−1, 0.5): ℓ = max( 0.5,  0.8) =  0.8  clipped low   (grad 0)
    #   d (−1, 1.5): ℓ = max( 1.5,  1.2) =  1.5  unclipped     (grad −A·r = 1.5)
    #   e (+2, 1.0): ℓ = −2                      unclipped     (grad −2)
    #   padding (A = +1, r = 5): ignored
    # loss = (−1.2 − 0.5 + 0.8 + 1.5 − 2)/5 = −1.4/5 = −0.28
    # grad = [0, −0.5, 0, 1.5, −2, 0]/5 = [0, −0.1, 0, 0.3, −0.4, 0]
    # clipfrac_high = 1/5 (only a), clipfrac_low = 1/5 (only c), clipfrac_dual = 0
    # approx_kl = mean of (r − 1) − ln r:
    #   a, d: 0.5 − ln 1.5 ≈ 0.0945349;  b, c: −0.5 − ln 0.5 ≈ 0.1931472;  e: 0
    #   = 2·(0.5 − ln 1.5 − 0.5 + ln 2)/5 = 2·ln(4/3)/5 ≈ 0.1150728
    ratios = [[1.5, 0.5, 0.5, 1.5, 1.0, 5.0]]
    lp, old = logprobs_for_ratios(ratios, [[-1.0, -0.5, -2.0, -3.0, -0.1, -1.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0, 1.0]], dtype=F64)
    mask = prefix_mask([5], 6)
    loss, metrics = ppo_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    close(loss, -0.28)
    loss.backward()
    close(lp.grad, [[0.0, -0.1, 0.0, 0.3, -0.4, 0.0]])
    close(metrics["clipfrac_high"], 0.2)
    close(metrics["clipfrac_low"], 0.2)
    close(metrics["clipfrac_dual"], 0.0)
    close(metrics["approx_kl"], 2 * math.log(4 / 3) / 5)
    for key in ["clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl"]:
        assert metrics[key].dim() == 0
        assert not metrics[key].requires_grad


def test_dual_clip_bounds_loss_for_negative_advantage():
    torch.manual_seed(14)
    # c = 3, ε = 0.2, four tokens (A, r):
    #   (−1, 5):   standard ℓ = max(5, 1.2) = 5; dual: min(5, −c·A = 3) = 3  (active, grad 0)
    #   (−1, 2):   ℓ = max(2, 1.2) = 2; min(2, 3) = 2                         (grad −A·r = 2)
    #   (+1, 5):   ℓ = max(−5, −1.2) = −1.2 (clipped high); A > 0, no dual    (grad 0)
    #   (−1, 0.5): ℓ = max(0.5, 0.8) = 0.8 (clipped low); min(0.8, 3) = 0.8  (grad 0)
    # loss = (3 + 2 − 1.2 + 0.8)/4 = 4.6/4 = 1.15; grad = [0, 2, 0, 0]/4 = [0, 0.5, 0, 0]
    # clipfrac_dual = 1/4, clipfrac_high = 1/4, clipfrac_low = 1/4
    lp, old = logprobs_for_ratios([[5.0, 2.0, 5.0, 0.5]], [[-2.0, -1.0, -3.0, -0.2]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, -1.0]], dtype=F64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, metrics = ppo_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    close(loss, 1.15)
    loss.backward()
    close(lp.grad, [[0.0, 0.5, 0.0, 0.0]])
    close(metrics["clipfrac_dual"], 0.25)
    close(metrics["clipfrac_high"], 0.25)
    close(metrics["clipfrac_low"], 0.25)
    # without dual clip the first token's loss is the unbounded 5: (5 + 2 − 1.2 + 0.8)/4 = 1.65
    loss_nodual, metrics_nodual = ppo_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    close(loss_nodual, 1.65)
    close(metrics_nodual["clipfrac_dual"], 0.0)


def test_ratio_one_gives_minus_mean_advantage():
    torch.manual_seed(15)
    # r = 1 everywhere: ℓ = −A, token-mean loss = −mean of valid A; gradient −A/N.
    B, T = 4, 6
    mask = prefix_mask([6, 2, 0, 3], T)
    old = torch.randn(B, T, dtype=F64)
    lp = old.clone().requires_grad_(True)
    adv = torch.randn(B, T, dtype=F64)
    valid = [adv[b, t].item() for b in range(B) for t in range(T) if mask[b, t]]
    N = len(valid)
    loss, metrics = ppo_policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    close(loss, -sum(valid) / N)
    loss.backward()
    close(lp.grad, torch.where(mask, -adv / N, torch.zeros_like(adv)))
    close(metrics["approx_kl"], 0.0)
    close(metrics["clipfrac_low"], 0.0)
    close(metrics["clipfrac_high"], 0.0)


def test_ppo_fully_masked_batch_is_zero():
    torch.manual_seed(16)
    old = torch.randn(2, 3, dtype=F64)
    lp = (old + torch.randn(2, 3, dtype=F64)).requires_grad_(True)
    adv = torch.randn(2, 3, dtype=F64)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    for mode in LOSS_AGG_MODES:
        loss, metrics = ppo_policy_loss(lp, old, adv, mask, loss_agg=mode)
        assert torch.isfinite(loss)
        close(loss, 0.0)
        for value in metrics.values():
            assert torch.isfinite(value)


@pytest.mark.parametrize(
    "kwargs",
    [dict(eps_low=-0.1), dict(eps_high=-0.01), dict(dual_clip=1.0), dict(dual_clip=0.5)],
)
def test_ppo_bad_arguments_raise(kwargs):
    torch.manual_seed(17)
    lp = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError):
        ppo_policy_loss(
            lp, lp, torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=torch.bool), **kwargs
        )


def test_ppo_unknown_loss_agg_raises():
    torch.manual_seed(18)
    lp = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError):
        ppo_policy_loss(
            lp, lp, torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=torch.bool), loss_agg="sum"
        )


# ---------------------------------------------------------------------------------------
# ppo_policy_loss: random batches vs the slow reference; micro-batch property
# ---------------------------------------------------------------------------------------


def random_ppo_batch(B, T, spread=0.8):
    lengths = torch.randint(0, T + 1, (B,))
    lengths[0] = 0
    lengths[-1] = T
    mask = prefix_mask(lengths, T)
    old = -torch.rand(B, T, dtype=F64) * 3
    # log-ratio spread so that some tokens fall in every clip region (and r > 3 sometimes)
    lp = (old + spread * torch.randn(B, T, dtype=F64)).requires_grad_(True)
    adv = torch.randn(B, T, dtype=F64)
    # garbage in padding: huge ratios / advantages must not matter
    garbage = (~mask).to(F64)
    adv = adv + 50.0 * garbage
    old = old - 10.0 * garbage
    return lp, old, adv, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize(
    "eps_low,eps_high,dual_clip", [(0.2, 0.2, None), (0.2, 0.28, None), (0.2, 0.28, 3.0)]
)
def test_ppo_random_vs_slow_reference(mode, eps_low, eps_high, dual_clip):
    torch.manual_seed(20)
    lp, old, adv, mask = random_ppo_batch(8, 13)
    loss, metrics = ppo_policy_loss(
        lp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip, loss_agg=mode
    )
    e_loss, e_grad, e_metrics = ref_ppo(lp, old, adv, mask, eps_low, eps_high, dual_clip, mode)
    close(loss, e_loss, atol=1e-9)
    (grad,) = torch.autograd.grad(loss, lp)
    close(grad, e_grad, atol=1e-9)
    for key, value in e_metrics.items():
        close(metrics[key], value, atol=1e-9)
    if dual_clip is not None:
        assert e_metrics["clipfrac_dual"] > 0, "test bug: batch should exercise the dual clip"
    assert e_metrics["clipfrac_high"] > 0 and e_metrics["clipfrac_low"] > 0


def test_ppo_float32_random_vs_slow_reference():
    torch.manual_seed(21)
    lp, old, adv, mask = random_ppo_batch(64, 100, spread=0.3)
    lp32 = lp.detach().float().requires_grad_(True)
    loss, _ = ppo_policy_loss(lp32, old.float(), adv.float(), mask, eps_low=0.2, eps_high=0.28)
    assert loss.dtype == torch.float32
    e_loss, e_grad, _ = ref_ppo(lp32, old.float(), adv.float(), mask, 0.2, 0.28, None, "token-mean")
    close(loss.double(), e_loss, atol=1e-5)
    (grad,) = torch.autograd.grad(loss, lp32)
    close(grad.double(), e_grad, atol=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_ppo_micro_batch_property(mode, dual_clip):
    # Split a mini-batch of 7 into micro-batches of 1, 4, 2 rows; each micro loss uses the
    # mini-batch normalizer; the sum equals the unsplit loss, and so do the gradients.
    torch.manual_seed(22)
    B, T = 7, 9
    mask = prefix_mask([4, 0, 9, 1, 7, 3, 5], T)
    old = -torch.rand(B, T, dtype=F64) * 3
    lp = (old + 0.8 * torch.randn(B, T, dtype=F64)).requires_grad_(True)
    adv = torch.randn(B, T, dtype=F64)
    kw = dict(eps_low=0.2, eps_high=0.28, dual_clip=dual_clip, loss_agg=mode)
    full, _ = ppo_policy_loss(lp, old, adv, mask, **kw)
    (g_full,) = torch.autograd.grad(full, lp)
    N = float(loss_denominator(mode, mask))  # the whole mini-batch's, as the trainer passes it
    split = sum(
        ppo_policy_loss(
            lp[s], old[s], adv[s], mask[s], normalizer=torch.tensor(N, dtype=F64), **kw
        )[0]
        for s in micro_slices()
    )
    (g_split,) = torch.autograd.grad(split, lp)
    close(split, full, atol=1e-12)
    close(g_split, g_full, atol=1e-12)
    # and both agree with the slow reference
    e_loss, e_grad, _ = ref_ppo(lp, old, adv, mask, 0.2, 0.28, dual_clip, mode)
    close(full, e_loss, atol=1e-9)
    close(g_full, e_grad, atol=1e-9)
