"""Tests for vapo_lab.algo.lm: positive_nll_loss, entropy_from_logits, masked_entropy,
token_logprobs.  Hand derivations are in comments; random cases use explicit loops.
"""

import math

import pytest
import torch

from tests.algo.helpers import F64, close, prefix_mask
from vapo_lab.algo.lm import entropy_from_logits, masked_entropy, positive_nll_loss, token_logprobs

# ---------------------------------------------------------------------------------------
# positive_nll_loss
# ---------------------------------------------------------------------------------------


def test_positive_nll_loss_by_hand():
    torch.manual_seed(0)
    # row 0: correct, L = 2, log π = [−1, −2 | garbage]
    # row 1: wrong,   L = 3, log π = [−5, −5, −5]           (ignored: not correct)
    # row 2: correct, L = 1, log π = [−0.5 | garbage]
    # row 3: correct, L = 0                                 (no tokens)
    # loss = −(−1 − 2 − 0.5)/3 correct tokens = 3.5/3 ≈ 1.1666667
    # d loss/d log π = −1/3 on the three correct valid tokens, 0 elsewhere
    logprobs = torch.tensor(
        [[-1.0, -2.0, -9.0], [-5.0, -5.0, -5.0], [-0.5, -9.0, -9.0], [-9.0, -9.0, -9.0]],
        dtype=F64,
        requires_grad=True,
    )
    mask = prefix_mask([2, 3, 1, 0], 3)
    correct = torch.tensor([True, False, True, True])
    loss = positive_nll_loss(logprobs, mask, correct)
    assert loss.dim() == 0
    close(loss, 3.5 / 3)
    loss.backward()
    t = -1 / 3
    close(logprobs.grad, [[t, t, 0], [0, 0, 0], [t, 0, 0], [0, 0, 0]])
    # normalizer replaces the count of correct tokens: 3.5/7 = 0.5
    close(positive_nll_loss(logprobs, mask, correct, normalizer=7.0), 0.5)


def test_positive_nll_loss_no_correct_is_zero_and_backward_works():
    torch.manual_seed(1)
    logprobs = (-torch.rand(3, 4, dtype=F64)).requires_grad_(True)
    mask = prefix_mask([4, 2, 1], 4)
    for correct in [torch.zeros(3, dtype=torch.bool), torch.tensor([False, True, False])]:
        m = mask.clone()
        if correct.any():
            m[1] = False  # the only correct response is empty: still no correct tokens
        loss = positive_nll_loss(logprobs, m, correct)
        assert torch.isfinite(loss)
        close(loss, 0.0)
        loss.backward()
        assert logprobs.grad is not None
        close(logprobs.grad, torch.zeros(3, 4))
        logprobs.grad = None


def test_positive_nll_loss_random_vs_loop():
    torch.manual_seed(2)
    B, T = 9, 11
    mask = prefix_mask(torch.randint(0, T + 1, (B,)), T)
    logprobs = -torch.rand(B, T, dtype=F64) * 4
    correct = torch.rand(B) < 0.5
    correct[0] = True
    num, den = 0.0, 0
    for b in range(B):
        if correct[b]:
            for t in range(T):
                if mask[b, t]:
                    num -= logprobs[b, t].item()
                    den += 1
    assert den > 0
    close(positive_nll_loss(logprobs, mask, correct), num / den, atol=1e-9)


def test_positive_nll_micro_batch_property():
    # Mini-batch of 7 split into micro-batches of 3, 2, 2 rows; the middle one has no
    # correct response.  Each micro loss uses the mini-batch normalizer (valid tokens of all
    # correct responses of the mini-batch); the sum and its gradient equal the unsplit loss's.
    torch.manual_seed(3)
    B, T = 7, 6
    mask = prefix_mask([4, 0, 6, 3, 5, 2, 1], T)
    correct = torch.tensor([True, True, False, False, False, True, True])
    logprobs = (-torch.rand(B, T, dtype=F64) * 3).requires_grad_(True)
    full = positive_nll_loss(logprobs, mask, correct)
    (g_full,) = torch.autograd.grad(full, logprobs)
    # N = 4 + 0 + 2 + 1 = 7 correct valid tokens
    N = float((mask & correct[:, None]).sum())
    assert N == 7.0
    slices = [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert not correct[slices[1]].any()
    split = sum(positive_nll_loss(logprobs[s], mask[s], correct[s], normalizer=N) for s in slices)
    (g_split,) = torch.autograd.grad(split, logprobs)
    close(split, full, atol=1e-12)
    close(g_split, g_full, atol=1e-12)


# ---------------------------------------------------------------------------------------
# entropy_from_logits, masked_entropy
# ---------------------------------------------------------------------------------------


def explicit_entropy(logits):
    """−Σ p log p, one position at a time, in plain Python."""
    B, T, V = logits.shape
    out = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        for t in range(T):
            z = logits[b, t].tolist()
            zmax = max(z)
            exps = [math.exp(x - zmax) for x in z]
            s = sum(exps)
            out[b, t] = -sum((e / s) * math.log(e / s) for e in exps if e > 0)
    return out


def test_entropy_uniform_logits_is_log_vocab():
    torch.manual_seed(10)
    # uniform p = 1/V: H = −V·(1/V)·log(1/V) = log V (any constant logit value)
    for V in [1, 2, 7, 50]:
        logits = torch.full((2, 3, V), 3.7, dtype=F64)
        close(entropy_from_logits(logits), torch.full((2, 3), math.log(V)))


def test_entropy_random_vs_explicit():
    torch.manual_seed(11)
    logits = torch.randn(3, 5, 13, dtype=F64) * 2
    h = entropy_from_logits(logits)
    assert h.shape == (3, 5)
    close(h, explicit_entropy(logits), atol=1e-9)


def test_entropy_numerically_stable_for_large_logits():
    torch.manual_seed(12)
    # logits shifted by a huge constant give the same entropy; near one-hot gives ≈ 0
    logits = torch.randn(2, 4, 9, dtype=F64)
    close(entropy_from_logits(logits + 1e4), explicit_entropy(logits), atol=1e-9)
    one_hot = torch.tensor([[[1e4, 0.0, 0.0]]], dtype=F64)
    h = entropy_from_logits(one_hot)
    assert torch.isfinite(h).all()
    close(h, [[0.0]])
    # float32 with large logits must not give nan/inf either
    big = (torch.randn(2, 3, 11) * 100).float()
    h32 = entropy_from_logits(big)
    assert torch.isfinite(h32).all() and (h32 >= -1e-5).all()


def test_masked_entropy_by_hand_ignores_padding():
    torch.manual_seed(13)
    # row 0: t0 uniform over 4 -> log 4; t1 mass split on 2 of 4 tokens -> log 2; t2 padding
    # row 1: padding only.  masked mean = (log 4 + log 2)/2 = 1.5·log 2
    logits = torch.zeros(2, 3, 4, dtype=F64)
    logits[0, 1] = torch.tensor([0.0, 0.0, -1e4, -1e4], dtype=F64)
    logits[0, 2] = torch.tensor([50.0, -3.0, 8.0, 1.0], dtype=F64)  # garbage in padding
    logits[1] = torch.randn(3, 4, dtype=F64) * 10
    mask = prefix_mask([2, 0], 3)
    h = masked_entropy(logits, mask)
    assert h.dim() == 0
    close(h, 1.5 * math.log(2))


def test_masked_entropy_random_vs_loop():
    torch.manual_seed(14)
    logits = torch.randn(4, 6, 5, dtype=F64) * 3
    mask = prefix_mask([6, 1, 0, 3], 6)
    ent = explicit_entropy(logits)
    vals = [ent[b, t].item() for b in range(4) for t in range(6) if mask[b, t]]
    close(masked_entropy(logits, mask), sum(vals) / len(vals), atol=1e-9)


# ---------------------------------------------------------------------------------------
# token_logprobs
# ---------------------------------------------------------------------------------------


def test_token_logprobs_by_hand():
    torch.manual_seed(20)
    # logits [0, log 3]: softmax = [1/4, 3/4]; token 1 -> log 0.75, token 0 -> log 0.25
    logits = torch.tensor([[[0.0, math.log(3)], [0.0, math.log(3)]]], dtype=F64)
    tokens = torch.tensor([[1, 0]])
    close(token_logprobs(logits, tokens), [[math.log(0.75), math.log(0.25)]])


def test_token_logprobs_vs_log_softmax_gather_and_loop():
    torch.manual_seed(21)
    B, T, V = 3, 7, 17
    logits = torch.randn(B, T, V, dtype=F64) * 3
    tokens = torch.randint(0, V, (B, T))
    out = token_logprobs(logits, tokens)
    assert out.shape == (B, T) and out.dtype == F64
    ref = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    close(out, ref, atol=1e-9)
    for b in range(B):
        for t in range(T):
            z = logits[b, t].tolist()
            lse = math.log(sum(math.exp(x) for x in z))
            assert abs(out[b, t].item() - (z[tokens[b, t]] - lse)) < 1e-9
    # gradient flows to the logits
    logits.requires_grad_(True)
    token_logprobs(logits, tokens).sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_token_logprobs_and_entropy_match_the_separate_functions():
    from vapo_lab.algo import entropy_from_logits, token_logprobs, token_logprobs_and_entropy

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11) * 4
    logits[0, 1, 3] = float("-inf")  # a masked vocabulary entry: 0·(−inf) must not give nan
    logits[2, 4, :5] = float("-inf")
    tokens = torch.randint(5, 11, (3, 5))
    lp, h = token_logprobs_and_entropy(logits, tokens)
    torch.testing.assert_close(lp, token_logprobs(logits, tokens), rtol=0, atol=1e-5)
    torch.testing.assert_close(h, entropy_from_logits(logits), rtol=0, atol=1e-5)
    assert not h.requires_grad
    # by hand: uniform over 4 entries -> H = log 4, log π = -log 4
    lp, h = token_logprobs_and_entropy(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long))
    assert h.item() == pytest.approx(math.log(4)) and lp.item() == pytest.approx(-math.log(4))
    z = logits.clone().requires_grad_(True)
    _, h = token_logprobs_and_entropy(z, tokens, entropy_grad=True)
    h.sum().backward()
    assert torch.isfinite(z.grad).all()
