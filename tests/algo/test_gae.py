"""Tests for vapo_lab.algo.gae: length_adaptive_lambda, gae, decoupled_gae.

Expected values come from hand derivations (in comments), from a plain-Python per-sequence,
per-token reverse loop kept in this file, and (for the large batches the spec names) from
``gae_reference``, the reverse-time loop over t in vapo_lab.algo, itself checked here against
the per-token loop and by hand.

Conventions (spec): δ_t = r_t + γ·V_{t+1} − V_t with V_L = 0 after the last valid token;
A_t = Σ_l (γλ)^l δ_{t+l} over valid tokens; returns_t = A_t + V_t; padding outputs 0.
"""

import sys

import pytest
import torch

from tests.algo.helpers import F32, F64, prefix_mask
from vapo_lab.algo.gae import decoupled_gae, gae, gae_reference, length_adaptive_lambda
from vapo_lab.algo.gae_cpu import scan_kernel


@pytest.fixture(params=["compiled", "torch"], autouse=True)
def scan(request, monkeypatch):
    """Every test here runs twice: gae on the compiled CPU scan and on the torch scan."""
    if request.param == "compiled" and scan_kernel() is None:
        pytest.skip("numba is not importable: no compiled CPU scan")
    if request.param == "torch":  # what gae does without numba, and on accelerators
        monkeypatch.setattr(sys.modules["vapo_lab.algo.gae"], "scan_kernel", lambda: None)
    return request.param


def ref_gae(rewards, values, mask, lam, gamma):
    """Slow reference: plain Python floats, one sequence at a time, reverse time loop."""
    B, T = rewards.shape
    r = rewards.double().tolist()
    v = values.double().tolist()
    m = mask.bool().tolist()
    lams = lam.double().tolist() if isinstance(lam, torch.Tensor) else [float(lam)] * B
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        L = sum(1 for x in m[b] if x)
        assert all(m[b][:L]) and not any(m[b][L:]), "test bug: mask must be a prefix mask"
        running = 0.0
        for t in reversed(range(L)):
            v_next = v[b][t + 1] if t + 1 < L else 0.0  # V_L = 0: terminal
            delta = r[b][t] + gamma * v_next - v[b][t]
            running = delta + gamma * lams[b] * running
            adv[b][t] = running
            ret[b][t] = running + v[b][t]
    return torch.tensor(adv, dtype=F64), torch.tensor(ret, dtype=F64)


def random_batch(B, T, dtype=F64, dense=False, min_len=0):
    """Values in [0, 1], verifier reward in {0, 1} at the last valid token (optionally dense
    noise on every valid token), garbage (large, non-zero) at padded positions."""
    lengths = torch.randint(min_len, T + 1, (B,))
    mask = prefix_mask(lengths, T)
    values = torch.rand(B, T, dtype=F64)
    rewards = torch.zeros(B, T, dtype=F64)
    score = torch.randint(0, 2, (B,)).to(F64)
    for b in range(B):
        if lengths[b] > 0:
            rewards[b, lengths[b] - 1] = score[b]
    if dense:
        rewards = rewards + 0.1 * torch.randn(B, T, dtype=F64)
    garbage_v = 100.0 * torch.randn(B, T, dtype=F64) + 50.0
    garbage_r = 100.0 * torch.randn(B, T, dtype=F64) - 50.0
    values = torch.where(mask, values, garbage_v).to(dtype)
    rewards = torch.where(mask, rewards, garbage_r).to(dtype)
    return rewards, values, mask, lengths


# ---------------------------------------------------------------------------------------
# length_adaptive_lambda
# ---------------------------------------------------------------------------------------


def test_length_adaptive_lambda_by_hand():
    torch.manual_seed(0)
    # λ = 1 − 1/(α·l), α = 0.05:
    #   l = 40:   α·l = 2   -> 1 − 1/2 = 0.5
    #   l = 100:  α·l = 5   -> 1 − 1/5 = 0.8
    #   l = 1000: α·l = 50  -> 1 − 1/50 = 0.98
    #   l = 20:   α·l = 1   -> 1 − 1 = 0
    #   l = 10:   α·l = 0.5 -> 1 − 2 = −1, clamped to 0
    #   l = 0:    spec: l ≤ 0 gives 0
    lengths = torch.tensor([40, 100, 1000, 20, 10, 0])
    lam = length_adaptive_lambda(lengths, 0.05)
    assert lam.shape == (6,)
    assert lam.dtype == F32
    expected = torch.tensor([0.5, 0.8, 0.98, 0.0, 0.0, 0.0], dtype=F32)
    torch.testing.assert_close(lam, expected, atol=1e-6, rtol=0)


def test_length_adaptive_lambda_float64_lengths_keep_float64():
    torch.manual_seed(1)
    lengths = torch.tensor([40.0, 100.0, 25.0, -3.0], dtype=F64)
    lam = length_adaptive_lambda(lengths, 0.05)
    assert lam.dtype == F64
    # l = 25: α·l = 1.25 -> 1 − 0.8 = 0.2; l = −3 -> 0 (l ≤ 0)
    torch.testing.assert_close(
        lam, torch.tensor([0.5, 0.8, 0.2, 0.0], dtype=F64), atol=1e-6, rtol=0
    )


def test_length_adaptive_lambda_always_in_unit_interval():
    torch.manual_seed(2)
    lengths = torch.randint(-5, 20000, (1000,))
    for alpha in [1e-4, 0.01, 0.05, 0.3, 1.0, 7.0]:
        lam = length_adaptive_lambda(lengths, alpha)
        assert torch.isfinite(lam).all()
        assert (lam >= 0).all() and (lam <= 1).all()
        # against the formula, element by element
        for length, got in zip(lengths.tolist()[:50], lam.tolist()[:50]):
            want = 0.0 if length <= 0 else min(1.0, max(0.0, 1.0 - 1.0 / (alpha * length)))
            assert abs(got - want) < 1e-6


@pytest.mark.parametrize("alpha", [0.0, -0.05])
def test_length_adaptive_lambda_bad_alpha_raises(alpha):
    torch.manual_seed(3)
    with pytest.raises(ValueError):
        length_adaptive_lambda(torch.tensor([10, 20]), alpha)


# ---------------------------------------------------------------------------------------
# gae: hand cases
# ---------------------------------------------------------------------------------------

# γ = 1, rewards [0, 0, 1], values [0.5, 0.5, 0.5], V = 0 after the last token:
#   δ_0 = 0 + 0.5 − 0.5 = 0;  δ_1 = 0 + 0.5 − 0.5 = 0;  δ_2 = 1 + 0 − 0.5 = 0.5
HAND_R = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64)
HAND_V = torch.tensor([[0.5, 0.5, 0.5]], dtype=F64)
HAND_M = torch.ones(1, 3, dtype=torch.bool)


def test_gae_hand_case_lambda_half():
    torch.manual_seed(10)
    # λ = 0.5: A_2 = 0.5; A_1 = 0 + 0.5·0.5 = 0.25; A_0 = 0 + 0.5·0.25 = 0.125
    # returns = A + V = [0.625, 0.75, 1.0]
    adv, ret = gae(HAND_R, HAND_V, HAND_M, 0.5, gamma=1.0)
    torch.testing.assert_close(
        adv, torch.tensor([[0.125, 0.25, 0.5]], dtype=F64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        ret, torch.tensor([[0.625, 0.75, 1.0]], dtype=F64), atol=1e-6, rtol=0
    )


def test_gae_hand_case_lambda_one_gives_monte_carlo_return():
    torch.manual_seed(11)
    # λ = 1: A = [0.5, 0.5, 0.5] (sum of δs to the end), returns = [1, 1, 1]
    adv, ret = gae(HAND_R, HAND_V, HAND_M, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5]], dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]], dtype=F64), atol=1e-6, rtol=0)


def test_gae_hand_case_lambda_zero_gives_td_error():
    torch.manual_seed(12)
    # λ = 0: A = δ = [0, 0, 0.5]; returns = δ + V = [0.5, 0.5, 1.0] (one-step TD targets)
    adv, ret = gae(HAND_R, HAND_V, HAND_M, 0.0)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0, 0.5]], dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[0.5, 0.5, 1.0]], dtype=F64), atol=1e-6, rtol=0)


def test_gae_hand_case_gamma_not_one():
    torch.manual_seed(13)
    # γ = 0.9, λ = 0.5, same rewards/values:
    #   δ_0 = 0 + 0.9·0.5 − 0.5 = −0.05; δ_1 = −0.05; δ_2 = 1 + 0.9·0 − 0.5 = 0.5
    #   γλ = 0.45: A_2 = 0.5; A_1 = −0.05 + 0.45·0.5 = 0.175; A_0 = −0.05 + 0.45·0.175 = 0.02875
    #   returns = A + V = [0.52875, 0.675, 1.0]
    adv, ret = gae(HAND_R, HAND_V, HAND_M, 0.5, gamma=0.9)
    torch.testing.assert_close(
        adv, torch.tensor([[0.02875, 0.175, 0.5]], dtype=F64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        ret, torch.tensor([[0.52875, 0.675, 1.0]], dtype=F64), atol=1e-6, rtol=0
    )
    # γ = 0.9, λ = 1: returns = discounted Monte-Carlo return Σ γ^(s−t) r_s = [0.81, 0.9, 1.0]
    _, ret1 = gae(HAND_R, HAND_V, HAND_M, 1.0, gamma=0.9)
    torch.testing.assert_close(ret1, torch.tensor([[0.81, 0.9, 1.0]], dtype=F64), atol=1e-6, rtol=0)


def test_gae_hand_case_with_padding_and_terminal_value_zero():
    torch.manual_seed(14)
    # Row 0, L = 2 of T = 4: rewards [0, 1 | 7, −3], values [0.3, 0.6 | 9, 9] (| = padding).
    #   δ_0 = 0 + 0.6 − 0.3 = 0.3; δ_1 = 1 + 0 − 0.6 = 0.4 (V_2 = 0, NOT the garbage 9)
    #   λ = 0.5: A_1 = 0.4; A_0 = 0.3 + 0.5·0.4 = 0.5; returns = [0.8, 1.0]; padding 0.
    # Row 1, L = 0: everything 0 whatever the garbage.
    # Row 2, L = 1: rewards [1 | ...], values [0.3 | ...]: δ_0 = 0.7 = A_0; returns 1.0.
    rewards = torch.tensor(
        [[0.0, 1.0, 7.0, -3.0], [5.0, 5.0, 5.0, 5.0], [1.0, 4.0, 4.0, 4.0]], dtype=F64
    )
    values = torch.tensor(
        [[0.3, 0.6, 9.0, 9.0], [-8.0, 8.0, -8.0, 8.0], [0.3, 6.0, 6.0, 6.0]], dtype=F64
    )
    mask = prefix_mask([2, 0, 1], 4)
    adv, ret = gae(rewards, values, mask, 0.5)
    exp_adv = torch.tensor([[0.5, 0.4, 0, 0], [0, 0, 0, 0], [0.7, 0, 0, 0]], dtype=F64)
    exp_ret = torch.tensor([[0.8, 1.0, 0, 0], [0, 0, 0, 0], [1.0, 0, 0, 0]], dtype=F64)
    torch.testing.assert_close(adv, exp_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret, exp_ret, atol=1e-6, rtol=0)
    # padded positions are exactly 0
    assert (adv[~mask] == 0).all() and (ret[~mask] == 0).all()


def test_gae_length_one_response_T1_B1():
    torch.manual_seed(15)
    # single token: δ_0 = r_0 − V_0 = 1 − 0.3 = 0.7 = A_0 for every λ; returns = 1
    for lam in [0.0, 0.5, 0.95, 1.0]:
        adv, ret = gae(
            torch.tensor([[1.0]], dtype=F64),
            torch.tensor([[0.3]], dtype=F64),
            torch.ones(1, 1, dtype=torch.bool),
            lam,
        )
        assert adv.shape == (1, 1) and ret.shape == (1, 1)
        torch.testing.assert_close(adv, torch.tensor([[0.7]], dtype=F64), atol=1e-6, rtol=0)
        torch.testing.assert_close(ret, torch.tensor([[1.0]], dtype=F64), atol=1e-6, rtol=0)


def test_gae_fully_masked_rows_are_zero():
    torch.manual_seed(16)
    B, T = 4, 9
    rewards = torch.randn(B, T, dtype=F64) * 10
    values = torch.randn(B, T, dtype=F64) * 10
    mask = torch.zeros(B, T, dtype=torch.bool)
    adv, ret = gae(rewards, values, mask, 0.9)
    assert (adv == 0).all() and (ret == 0).all()
    # and one empty row among non-empty ones
    mask = prefix_mask([3, 0, 9, 1], T)
    adv, ret = gae(rewards, values, mask, torch.tensor([0.9, 0.5, 0.0, 1.0], dtype=F64))
    assert (adv[1] == 0).all() and (ret[1] == 0).all()


def test_gae_keeps_dtype_and_shape():
    torch.manual_seed(17)
    for dtype in [F32, F64]:
        r, v, m, _ = random_batch(3, 5, dtype=dtype)
        adv, ret = gae(r, v, m, 0.95)
        assert adv.dtype == dtype and ret.dtype == dtype
        assert adv.shape == (3, 5) and ret.shape == (3, 5)


def test_gae_float_mask_equals_bool_mask():
    torch.manual_seed(18)
    r, v, m, _ = random_batch(5, 13)
    a1, r1 = gae(r, v, m, 0.9)
    a2, r2 = gae(r, v, m.to(F64), 0.9)
    torch.testing.assert_close(a1, a2, atol=1e-12, rtol=0)
    torch.testing.assert_close(r1, r2, atol=1e-12, rtol=0)


# ---------------------------------------------------------------------------------------
# gae: properties and random batches vs the slow reference
# ---------------------------------------------------------------------------------------


def test_gae_garbage_in_padding_does_not_change_outputs():
    torch.manual_seed(20)
    B, T = 7, 33
    r, v, m, _ = random_batch(B, T)
    clean_r = torch.where(m, r, torch.zeros_like(r))
    clean_v = torch.where(m, v, torch.zeros_like(v))
    lam = torch.rand(B, dtype=F64)
    for lam_arg in [0.95, lam]:
        a_g, r_g = gae(r, v, m, lam_arg)
        a_c, r_c = gae(clean_r, clean_v, m, lam_arg)
        torch.testing.assert_close(a_g, a_c, atol=1e-9, rtol=0)
        torch.testing.assert_close(r_g, r_c, atol=1e-9, rtol=0)
        assert (a_g[~m] == 0).all() and (r_g[~m] == 0).all()


def test_gae_nonfinite_garbage_in_padding_does_not_leak():
    # Padding read from a model's output may be inf or nan; a masked multiply (inf·0 = nan)
    # would leak it, so padded positions must be ignored by selection.
    torch.manual_seed(21)
    B, T = 5, 40
    r, v, m, _ = random_batch(B, T, min_len=0)
    m[0] = False
    m[1, :3], m[1, 3:] = True, False
    clean_a, clean_r = gae(torch.where(m, r, 0.0), torch.where(m, v, 0.0), m, 0.9)
    bad = torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=F64)
    idx = torch.randint(0, 3, (B, T))
    a, ret = gae(torch.where(m, r, bad[idx]), torch.where(m, v, bad[idx.flip(1)]), m, 0.9)
    torch.testing.assert_close(a, clean_a, atol=1e-9, rtol=0)
    torch.testing.assert_close(ret, clean_r, atol=1e-9, rtol=0)


@pytest.mark.parametrize("T", [1, 2, 7, 33, 64, 65, 200, 1000])
def test_gae_random_float64_vs_slow_loop(T):
    torch.manual_seed(100 + T)
    B = 6 if T <= 200 else 3
    r, v, m, _ = random_batch(B, T, dense=True)
    for lam in [0.0, 0.5, 0.95, 1.0]:
        for gamma in [1.0, 0.97]:
            adv, ret = gae(r, v, m, lam, gamma=gamma)
            ea, er = ref_gae(r, v, m, lam, gamma)
            torch.testing.assert_close(adv, ea, atol=1e-9, rtol=0)
            torch.testing.assert_close(ret, er, atol=1e-9, rtol=0)


@pytest.mark.parametrize("T", [1, 7, 33, 200, 517])
def test_gae_random_float32_vs_slow_loop(T):
    torch.manual_seed(200 + T)
    B = 8
    r, v, m, lengths = random_batch(B, T, dtype=F32)
    lam = length_adaptive_lambda(lengths, 0.05)
    adv, ret = gae(r, v, m, lam)
    assert adv.dtype == F32
    ea, er = ref_gae(r, v, m, lam, 1.0)
    torch.testing.assert_close(adv.double(), ea, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret.double(), er, atol=1e-5, rtol=0)


@pytest.mark.parametrize("T", [1, 7, 33, 200])
def test_gae_lambda_one_is_monte_carlo_return(T):
    torch.manual_seed(300 + T)
    B = 5
    r, v, m, _ = random_batch(B, T, dense=True)
    for gamma in [1.0, 0.9]:
        _, ret = gae(r, v, m, 1.0, gamma=gamma)
        # returns_t = Σ_{s=t}^{L−1} γ^(s−t) r_s, written out directly
        expected = torch.zeros(B, T, dtype=F64)
        for b in range(B):
            L = int(m[b].sum())
            for t in range(L):
                expected[b, t] = sum(gamma ** (s - t) * r[b, s].item() for s in range(t, L))
        torch.testing.assert_close(ret, expected, atol=1e-9, rtol=0)


@pytest.mark.parametrize("T", [1, 7, 33, 200])
def test_gae_lambda_zero_is_td_error(T):
    torch.manual_seed(400 + T)
    B = 5
    r, v, m, _ = random_batch(B, T, dense=True)
    for gamma in [1.0, 0.9]:
        adv, _ = gae(r, v, m, 0.0, gamma=gamma)
        delta = torch.zeros(B, T, dtype=F64)
        for b in range(B):
            L = int(m[b].sum())
            for t in range(L):
                v_next = v[b, t + 1].item() if t + 1 < L else 0.0
                delta[b, t] = r[b, t].item() + gamma * v_next - v[b, t].item()
        torch.testing.assert_close(adv, delta, atol=1e-9, rtol=0)


def test_gae_per_sequence_lambda_equals_each_row_alone():
    torch.manual_seed(500)
    B, T = 9, 70
    r, v, m, lengths = random_batch(B, T, dense=True)
    # include the edge values λ = 0 (0^0 = 1 pitfall) and λ = 1
    lam = torch.tensor([0.0, 1.0, 0.5, 0.95, 0.3, 0.99, 0.0, 0.7, 1.0], dtype=F64)
    for gamma in [1.0, 0.95]:
        adv, ret = gae(r, v, m, lam, gamma=gamma)
        for b in range(B):
            a_b, r_b = gae(r[b : b + 1], v[b : b + 1], m[b : b + 1], float(lam[b]), gamma=gamma)
            torch.testing.assert_close(adv[b : b + 1], a_b, atol=1e-9, rtol=0)
            torch.testing.assert_close(ret[b : b + 1], r_b, atol=1e-9, rtol=0)
        ea, er = ref_gae(r, v, m, lam, gamma)
        torch.testing.assert_close(adv, ea, atol=1e-9, rtol=0)
        torch.testing.assert_close(ret, er, atol=1e-9, rtol=0)


def test_gae_scalar_lambda_equals_constant_lambda_tensor():
    torch.manual_seed(501)
    r, v, m, _ = random_batch(6, 45)
    a1, r1 = gae(r, v, m, 0.95)
    a2, r2 = gae(r, v, m, torch.full((6,), 0.95, dtype=F64))
    torch.testing.assert_close(a1, a2, atol=1e-9, rtol=0)
    torch.testing.assert_close(r1, r2, atol=1e-9, rtol=0)


def test_the_reference_loop_by_hand_and_against_the_per_token_loop():
    # γ = 1, rewards [0, 0, 1], values [0.5, 0.5, 0.5], λ = 0.5: δ = [0, 0, 0.5], A = [0.125, 0.25,
    # 0.5], returns = A + V = [0.625, 0.75, 1.0]; a padded fourth token stays 0
    r = torch.tensor([[0.0, 0.0, 1.0, 7.0]], dtype=F64)
    v = torch.tensor([[0.5, 0.5, 0.5, 9.0]], dtype=F64)
    m = torch.tensor([[True, True, True, False]])
    adv, ret = gae_reference(r, v, m, 0.5, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.125, 0.25, 0.5, 0.0]], dtype=F64))
    torch.testing.assert_close(ret, torch.tensor([[0.625, 0.75, 1.0, 0.0]], dtype=F64))
    torch.manual_seed(550)
    r, v, m, lengths = random_batch(12, 60, dense=True)
    lam = length_adaptive_lambda(lengths.double(), 0.1)
    for gamma in [1.0, 0.9]:
        ea, er = ref_gae(r, v, m, lam, gamma)
        adv, ret = gae_reference(r, v, m, lam, gamma)
        torch.testing.assert_close(adv, ea, atol=1e-12, rtol=0)
        torch.testing.assert_close(ret, er, atol=1e-12, rtol=0)


@pytest.mark.parametrize("B,T", [(512, 4096), (8192, 1024)])
def test_gae_large_float32_vs_the_reference_loop(B, T):
    # The spec's scale targets: agree with the plain reverse-time loop to 1e-5 in float32,
    # with the length-adaptive per-sequence λ (up to 1 − 1/(0.05·4096) ≈ 0.995).
    torch.manual_seed(600 + B)
    lengths = torch.randint(0, T + 1, (B,))
    lengths[0], lengths[1], lengths[2] = 0, T, 1
    mask = prefix_mask(lengths, T)
    values = torch.rand(B, T)
    rewards = torch.zeros(B, T)
    rows = torch.nonzero(lengths > 0).squeeze(1)
    rewards[rows, lengths[rows] - 1] = torch.randint(0, 2, (len(rows),)).float()
    values = torch.where(mask, values, torch.full_like(values, 3.0))
    rewards = torch.where(mask, rewards, torch.full_like(rewards, -2.0))
    lam = length_adaptive_lambda(lengths, 0.05)
    adv, ret = gae(rewards, values, mask, lam)
    assert adv.dtype == F32 and ret.dtype == F32
    ea, er = gae_reference(rewards.double(), values.double(), mask, lam.double(), 1.0)
    assert (adv.double() - ea).abs().max().item() < 1e-5
    assert (ret.double() - er).abs().max().item() < 1e-5
    # λ_critic = 1: returns are exactly the terminal reward on every valid token
    _, ret1 = gae(rewards, values, mask, 1.0)
    terminal = torch.where(mask, rewards, torch.zeros_like(rewards)).sum(1, keepdim=True)
    mc = torch.where(mask, terminal.expand(B, T), torch.zeros_like(rewards))
    assert (ret1 - mc).abs().max().item() < 1e-5


# ---------------------------------------------------------------------------------------
# decoupled_gae
# ---------------------------------------------------------------------------------------


def test_decoupled_gae_hand_case():
    torch.manual_seed(700)
    # λ_policy = 0.5 -> A = [0.125, 0.25, 0.5]; λ_critic = 1 -> returns = [1, 1, 1]
    adv, ret = decoupled_gae(HAND_R, HAND_V, HAND_M, 0.5, 1.0)
    torch.testing.assert_close(
        adv, torch.tensor([[0.125, 0.25, 0.5]], dtype=F64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0]], dtype=F64), atol=1e-6, rtol=0)


def test_decoupled_gae_equals_two_gae_calls():
    torch.manual_seed(701)
    B, T = 7, 41
    r, v, m, lengths = random_batch(B, T, dense=True)
    lam_p_tensor = length_adaptive_lambda(lengths.double(), 0.05)
    for lam_p, lam_c in [
        (0.95, 1.0),
        (lam_p_tensor, 1.0),
        (0.9, torch.rand(B, dtype=F64)),
        (0.0, 0.5),
    ]:
        for gamma in [1.0, 0.9]:
            adv, ret = decoupled_gae(r, v, m, lam_p, lam_c, gamma=gamma)
            a_p, _ = gae(r, v, m, lam_p, gamma=gamma)
            _, r_c = gae(r, v, m, lam_c, gamma=gamma)
            torch.testing.assert_close(adv, a_p, atol=1e-12, rtol=0)
            torch.testing.assert_close(ret, r_c, atol=1e-12, rtol=0)
            # and against the slow loop, independently of gae()
            torch.testing.assert_close(adv, ref_gae(r, v, m, lam_p, gamma)[0], atol=1e-9, rtol=0)
            torch.testing.assert_close(ret, ref_gae(r, v, m, lam_c, gamma)[1], atol=1e-9, rtol=0)


# ---------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------


def test_gae_shape_errors_raise():
    torch.manual_seed(800)
    r = torch.zeros(2, 3, dtype=F64)
    v = torch.zeros(2, 3, dtype=F64)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError):
        gae(r, torch.zeros(2, 4, dtype=F64), m, 0.5)
    with pytest.raises(ValueError):
        gae(torch.zeros(3, 3, dtype=F64), v, m, 0.5)
    with pytest.raises(ValueError):
        gae(r, v, torch.ones(2, 4, dtype=torch.bool), 0.5)
    with pytest.raises(ValueError):
        gae(r, v, m, torch.full((3,), 0.5, dtype=F64))  # lam not (B,)
    with pytest.raises(ValueError):
        gae(r, v, m, torch.full((2, 1), 0.5, dtype=F64))  # lam not (B,)
    with pytest.raises(ValueError):
        decoupled_gae(r, torch.zeros(2, 4, dtype=F64), m, 0.5, 1.0)
    with pytest.raises(ValueError):
        decoupled_gae(r, v, m, torch.full((5,), 0.5, dtype=F64), 1.0)


def test_gae_compiled_scan_rejects_a_mask_with_holes(scan):
    r = torch.zeros(3, 5, dtype=F64)
    v = torch.zeros(3, 5, dtype=F64)
    m = prefix_mask([2, 5, 3], 5)
    m[2, 4] = True  # row 2: ones, zeros, then a one
    if scan == "compiled":
        with pytest.raises(ValueError, match="row 2 is not a prefix mask"):
            gae(r, v, m, 0.5)
    else:  # the torch scan does not check; asking for the compiled one where it is missing fails
        with pytest.raises(ValueError, match="scan='compiled' needs"):
            gae(r, v, m, 0.5, scan="compiled")


def test_gae_unknown_scan_raises():
    r, v, m, _ = random_batch(2, 3)
    with pytest.raises(ValueError, match="is not one of"):
        gae(r, v, m, 0.5, scan="fast")


def test_gae_out_writes_into_the_given_tensors():
    torch.manual_seed(802)
    r, v, m, lengths = random_batch(5, 17, dtype=F32)
    lam = length_adaptive_lambda(lengths, 0.05)
    out = (torch.full((5, 17), 7.0), torch.full((5, 17), 7.0))  # stale contents must not survive
    adv, ret = gae(r, v, m, lam, out=out)
    assert adv is out[0] and ret is out[1]
    fresh = gae(r, v, m, lam)
    torch.testing.assert_close(adv, fresh[0], atol=0, rtol=0)
    torch.testing.assert_close(ret, fresh[1], atol=0, rtol=0)
    with pytest.raises(ValueError, match="out's returns"):
        gae(r, v, m, lam, out=(torch.empty(5, 17), torch.empty(5, 17, dtype=F64)))
    with pytest.raises(ValueError, match="out's advantages"):
        gae(r, v, m, lam, out=(torch.empty(5, 16), torch.empty(5, 17)))


def test_gae_half_precision_values_computed_in_float32():
    torch.manual_seed(803)
    r, v, m, lengths = random_batch(4, 29, dtype=F32)
    lam = length_adaptive_lambda(lengths, 0.05)
    adv, ret = gae(r.bfloat16(), v.bfloat16(), m, lam)
    assert adv.dtype == torch.bfloat16 and ret.dtype == torch.bfloat16
    ea, er = ref_gae(r.bfloat16(), v.bfloat16(), m, lam, 1.0)  # same bf16 inputs, float64 maths
    torch.testing.assert_close(adv.double(), ea, atol=2e-2, rtol=1e-2)  # bf16 output rounding
    torch.testing.assert_close(ret.double(), er, atol=2e-2, rtol=1e-2)


def test_the_two_scans_agree_on_a_large_float32_batch(scan):
    if scan == "torch":
        pytest.skip("compares both scans: run once, with the compiled one available")
    torch.manual_seed(804)
    r, v, m, lengths = random_batch(64, 3000, dtype=F32)
    lam = length_adaptive_lambda(lengths, 0.05 * 512 / 3000)
    compiled = gae(r, v, m, lam, scan="compiled")
    scanned = gae(r, v, m, lam, scan="torch")
    for a, b in zip(compiled, scanned):
        assert (a - b).abs().max().item() < 1e-5
