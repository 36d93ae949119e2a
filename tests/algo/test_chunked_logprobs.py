"""Tests for vapo_lab.algo.lm.head_logprobs_and_entropy: the LM head's log-probs and entropy
computed chunk by chunk, against a hand-worked case and against the unchunked path the trainer
runs today (``lm_head`` over every token, widened to float32, divided by τ, then
``token_logprobs_and_entropy``).
"""

import json
import math
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.algo.helpers import F32, F64, close
from vapo_lab.algo.lm import (
    default_chunk_tokens,
    head_logprobs_and_entropy,
    token_logprobs_and_entropy,
    weight_block_rows,
)
from vapo_lab.models.activations import chunked_logprob_bytes

LN3 = math.log(3.0)


def _problem(n, hidden, vocab, dtype, seed, scale=1.0, bias=True):
    """h (N, H), W (V, H), b (V,) or None, y (N,), and the loss weights g_lp, g_H (N,), seeded.

    h·Wᵀ has entries of order ``scale`` (h ~ N(0, 1), W ~ N(0, scale²/H)). The loss weights are
    those of a token-mean loss, N(0, 1) / N (as A_t / N in PPO's), so gradients are of order 1.
    """
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=gen, dtype=dtype).requires_grad_(True)
    w = (
        torch.randn(vocab, hidden, generator=gen, dtype=dtype) * scale / math.sqrt(hidden)
    ).requires_grad_(True)
    b = (
        (torch.randn(vocab, generator=gen, dtype=dtype) * 0.1).requires_grad_(True)
        if bias
        else None
    )
    y = torch.randint(0, vocab, (n,), generator=gen)
    mean = 1.0 / max(n, 1)
    g_lp = torch.randn(n, generator=gen, dtype=dtype) * mean
    g_h = torch.randn(n, generator=gen, dtype=dtype) * mean
    return h, w, b, y, g_lp, g_h


def _reference(h, w, b, y, tau, entropy_grad, autocast=False):
    """The trainer's unchunked path: z = wide(lm_head(h)) / τ, then token_logprobs_and_entropy."""
    head = torch.nn.Linear(h.shape[1], w.shape[0], bias=b is not None, dtype=w.dtype)
    head.weight = torch.nn.Parameter(w.detach().clone())
    if b is not None:
        head.bias = torch.nn.Parameter(b.detach().clone())
    hr = h.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = head(hr)
        logits = logits.float() if logits.element_size() < 4 else logits
        if tau != 1.0:
            logits = logits / tau
        logprobs, entropy = token_logprobs_and_entropy(logits, y, entropy_grad)
    params = [hr, head.weight] + ([head.bias] if b is not None else [])
    return logprobs, entropy, params


def _grads(logprobs, entropy, params, g_lp, g_h, entropy_grad):
    """Gradients of L = Σ g_lp·log π (+ Σ g_H·H with entropy_grad) with respect to ``params``."""
    loss = (logprobs * g_lp.to(logprobs.dtype)).sum()
    if entropy_grad:
        loss = loss + (entropy * g_h.to(entropy.dtype)).sum()
    return torch.autograd.grad(loss, params)


def _chunked(h, w, b, y, tau, entropy_grad, chunk):
    """(log π, H, [h, W(, b)]) from head_logprobs_and_entropy on fresh leaves."""
    hc = h.detach().clone().requires_grad_(True)
    wc = w.detach().clone().requires_grad_(True)
    bc = b.detach().clone().requires_grad_(True) if b is not None else None
    logprobs, entropy = head_logprobs_and_entropy(hc, wc, y, bc, tau, True, entropy_grad, chunk)
    return logprobs, entropy, [hc, wc] + ([bc] if bc is not None else [])


# ---------------------------------------------------------------------------------------
# by hand
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_head_logprobs_by_hand(tau):
    torch.manual_seed(0)
    # V = 2, H = 1, W = [[1], [0]], h = τ·ln 3, y = 0: z = h·Wᵀ / τ = [ln 3, 0], p = [3/4, 1/4]
    # log π(0) = ln 3 − ln 4 = ln(3/4) ≈ −0.2876821
    # H = lse(z) − Σ p·z = ln 4 − (3/4)·ln 3 ≈ 0.5623351
    # ∂log π/∂z = onehot − p = [1/4, −1/4]
    #   ∂/∂h = (1/4·1 − 1/4·0) / τ = 1/(4τ);  ∂/∂W = [[1/4], [−1/4]]·h / τ = ±(ln 3)/4 ≈ ±0.2746531
    # ∂H/∂z = −p ⊙ (log p + H): log p + H = [(1/4)·ln 3, −(3/4)·ln 3], so ∂H/∂z = ∓(3/16)·ln 3
    #   ∂H/∂h = −(3/16)·ln 3 / τ;  ∂H/∂W = ∓(3/16)·ln 3·h / τ = ∓(3/16)·(ln 3)² ≈ ∓0.2263029
    h = torch.tensor([[tau * LN3]], dtype=F64, requires_grad=True)
    w = torch.tensor([[1.0], [0.0]], dtype=F64, requires_grad=True)
    y = torch.tensor([0])
    logprobs, entropy = head_logprobs_and_entropy(
        h, w, y, temperature=tau, entropy_grad=True, chunk_tokens=1
    )
    close(logprobs, [math.log(0.75)])
    close(entropy, [math.log(4.0) - 0.75 * LN3])
    gh, gw = torch.autograd.grad(logprobs.sum(), [h, w], retain_graph=True)
    close(gh, [[1 / (4 * tau)]])
    close(gw, [[LN3 / 4], [-LN3 / 4]])
    gh, gw = torch.autograd.grad(entropy.sum(), [h, w])
    close(gh, [[-(3 / 16) * LN3 / tau]])
    close(gw, [[-(3 / 16) * LN3**2], [(3 / 16) * LN3**2]])


def test_default_chunk_tokens_by_hand():
    # 2^28 / (4·152,064) = 268,435,456 / 608,256 = 441.3 → 441 tokens (Qwen2's vocabulary)
    assert default_chunk_tokens(152_064) == 441
    # 2^28 / (4·2^26) = 1 → 1;  a vocabulary past 2^26 still takes one token at a time
    assert default_chunk_tokens(1 << 26) == 1
    assert default_chunk_tokens(1 << 27) == 1


# ---------------------------------------------------------------------------------------
# against the unchunked path
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 4, 7, 13, 20, None])  # 4 and 7 do not divide N = 13
def test_matches_unchunked_float32(chunk, tau, entropy_grad):
    torch.manual_seed(1)
    # logits of order 1, as an LM's: log π ≈ −ln V ≈ −4, so 1e-6 is a few float32 ulps
    h, w, b, y, g_lp, g_h = _problem(13, 16, 61, F32, seed=1)
    ref_lp, ref_h, ref_params = _reference(h, w, b, y, tau, entropy_grad)
    lp, ent, params = _chunked(h, w, b, y, tau, entropy_grad, chunk)
    assert lp.dtype == ent.dtype == F32
    close(lp, ref_lp)
    close(ent, ref_h)
    for got, want in zip(
        _grads(lp, ent, params, g_lp, g_h, entropy_grad),
        _grads(ref_lp, ref_h, ref_params, g_lp, g_h, entropy_grad),
    ):
        close(got, want)


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, 13, None])
def test_matches_unchunked_float64(chunk, tau, entropy_grad):
    torch.manual_seed(2)
    # float64 leaves only summation order between the two paths: 1e-12 on values of order 10
    h, w, b, y, g_lp, g_h = _problem(13, 16, 61, F64, seed=2, scale=5.0)
    ref_lp, ref_h, ref_params = _reference(h, w, b, y, tau, entropy_grad)
    lp, ent, params = _chunked(h, w, b, y, tau, entropy_grad, chunk)
    assert lp.dtype == ent.dtype == F64
    close(lp, ref_lp, atol=1e-12)
    close(ent, ref_h, atol=1e-12)
    for got, want in zip(
        _grads(lp, ent, params, g_lp, g_h, entropy_grad),
        _grads(ref_lp, ref_h, ref_params, g_lp, g_h, entropy_grad),
    ):
        close(got, want, atol=1e-12)


def test_entropy_without_entropy_grad_is_detached():
    torch.manual_seed(3)
    h, w, b, y, g_lp, _ = _problem(9, 8, 31, F64, seed=3)
    lp, ent = head_logprobs_and_entropy(h, w, y, b, entropy_grad=False, chunk_tokens=4)
    assert lp.requires_grad and not ent.requires_grad and ent.grad_fn is None
    # H joins no graph, so a loss with it has log π's gradient alone
    (lp * g_lp + ent).sum().backward()
    ref_lp, _, ref_params = _reference(h, w, b, y, 1.0, False)
    for got, want in zip(
        [h.grad, w.grad, b.grad], _grads(ref_lp, None, ref_params, g_lp, None, False)
    ):
        close(got, want, atol=1e-12)


def test_without_entropy_returns_none_and_same_logprobs():
    torch.manual_seed(4)
    h, w, b, y, _, _ = _problem(9, 8, 31, F64, seed=4)
    lp, ent = head_logprobs_and_entropy(h, w, y, b, with_entropy=False, chunk_tokens=2)
    assert ent is None
    close(lp, _reference(h, w, b, y, 1.0, False)[0], atol=1e-12)


def test_frozen_head_gives_hidden_gradient_only():
    torch.manual_seed(5)
    h, w, b, y, g_lp, _ = _problem(7, 8, 31, F64, seed=5, bias=False)
    w = w.detach()  # no gradient wanted for W: backward skips its accumulation
    lp, _ = head_logprobs_and_entropy(h, w, y, chunk_tokens=3)
    (lp * g_lp).sum().backward()
    assert w.grad is None
    ref_lp, _, ref_params = _reference(h, w, None, y, 1.0, False)
    close(h.grad, _grads(ref_lp, None, ref_params, g_lp, None, False)[0], atol=1e-12)


def test_no_tokens():
    torch.manual_seed(6)
    h, w, b, y, _, _ = _problem(0, 8, 31, F32, seed=6)
    lp, ent = head_logprobs_and_entropy(h, w, y, b, entropy_grad=True)
    assert lp.shape == ent.shape == (0,)
    (lp.sum() + ent.sum()).backward()  # L = 0 over no tokens: every gradient is 0
    close(h.grad, torch.zeros(0, 8))
    close(w.grad, torch.zeros(31, 8))
    close(b.grad, torch.zeros(31))


def test_large_logits_stay_finite():
    torch.manual_seed(7)
    # logits of order 1000: exp(z) overflows float32 and float64 without the max shift
    h, w, b, y, g_lp, g_h = _problem(6, 8, 31, F32, seed=7, scale=1000.0)
    lp, ent, params = _chunked(h, w, b, y, 1.0, True, 4)
    grads = _grads(lp, ent, params, g_lp, g_h, True)
    assert all(torch.isfinite(t).all() for t in [lp, ent, *grads])
    # the float64 reference on the same numbers; |log π| reaches ~1e3, so 1e-6 relative
    h64, w64, b64 = (t.detach().double() for t in (h, w, b))
    ref_lp, ref_h, _ = _reference(h64, w64, b64, y, 1.0, True)
    torch.testing.assert_close(lp.double(), ref_lp.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent.double(), ref_h.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("chunk", [5, 16, 37])
def test_bf16_autocast_matches_linear_under_autocast(chunk, entropy_grad):
    torch.manual_seed(8)
    # Both paths compute h·Wᵀ + b in bf16 (fp32 master W cast by autocast, or by the function),
    # then widen to float32. Stated tolerances, from bf16's unit roundoff u = 2^-8:
    # * log π and H: 2u·max|z|, one bf16 ulp of the largest logit (a GEMM of another row count may
    #   round a logit the other way); here the logits agree and the difference is float32's.
    # * gradients: 4u·max|∂L/∂θ| of the reference. nn.Linear rounds ∂L/∂W (and ∂L/∂b) to bf16 once;
    #   the chunked path rounds each chunk's share to bf16 and sums them in float32.
    h, w, b, y, g_lp, g_h = _problem(37, 64, 300, F32, seed=8, scale=1.0)
    tau = 0.8
    ref_lp, ref_h, ref_params = _reference(h, w, b, y, tau, entropy_grad, autocast=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent, params = _chunked(h, w, b, y, tau, entropy_grad, chunk)
    assert lp.dtype == ent.dtype == F32
    u = 2.0**-8
    z_max = float((torch.nn.functional.linear(h, w, b) / tau).detach().abs().max())
    close(lp, ref_lp, atol=2 * u * z_max)
    close(ent, ref_h, atol=2 * u * z_max)
    got = _grads(lp, ent, params, g_lp, g_h, entropy_grad)
    want = _grads(ref_lp, ref_h, ref_params, g_lp, g_h, entropy_grad)
    for g, r, p in zip(got, want, params):
        assert g.dtype == p.dtype == F32  # master-weight gradients in float32
        close(g, r, atol=4 * u * float(r.abs().max()))


def test_bad_arguments():
    h, w, _, y, _, _ = _problem(3, 4, 5, F32, seed=9)
    with pytest.raises(ValueError, match="chunk_tokens=0"):
        head_logprobs_and_entropy(h, w, y, chunk_tokens=0)
    with pytest.raises(ValueError, match="temperature=0"):
        head_logprobs_and_entropy(h, w, y, temperature=0.0)


# ---------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------


class _LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_no_op_returns_a_tensor_of_all_logits(entropy_grad):
    torch.manual_seed(10)
    # N = 64 tokens, V = 97, H = 8, chunk 10: the (N, V) logits are 6,208 elements; a chunk's are
    # 970, W and its gradient 776, h 512. No op of forward or backward may return more than 970.
    h, w, b, y, g_lp, g_h = _problem(64, 8, 97, F32, seed=10)
    mode = _LargestTensor()
    with mode:
        lp, ent = head_logprobs_and_entropy(h, w, y, b, entropy_grad=entropy_grad, chunk_tokens=10)
        loss = (lp * g_lp).sum() + ((ent * g_h).sum() if entropy_grad else 0.0)
        loss.backward()
    assert h.grad is not None and w.grad is not None
    assert mode.largest == 10 * 97
    # the unchunked path does return them
    mode = _LargestTensor()
    with mode:
        _reference(h, w, b, y, 1.0, entropy_grad)
    assert mode.largest == 64 * 97


def test_weight_block_rows_by_hand():
    # ⌊4·c·V / ((p + 4)·h)⌋: c = 441, V = 152,064, h = 896, bf16:
    #   268,240,896 / 5,376 = 49,896.0 → 49,896
    assert weight_block_rows(441, 152_064, 896, 2) == 49_896
    assert weight_block_rows(1, 10, 1000, 2) == 1  # never 0 rows


def test_chunked_logprob_bytes_by_hand():
    # The footprint formula of this function (vapo_lab.models.footprint), t = 10, V = 100, h = 8,
    # chunk 4.
    # bf16 (p = p' = 2): W copy V·h·2 = 1,600; forward 1,600 + 8·4·100 = 4,800;
    #   backward 4·V·h = 3,200 + 1,600
    #   + max(6·4·100 = 2,400, 2·4·100 + min(1,600, 6·800 = 4,800) = 2,400)
    #   = 7,200; per token 10·(16 + 8·2) = 320: 7,520
    assert chunked_logprob_bytes(10, 100, 8, 4) == 7_520
    # with entropy_grad, k = 8: backward 3,200 + 1,600 + max(3,200, 2,400) = 8,000: 8,320
    assert chunked_logprob_bytes(10, 100, 8, 4, entropy_grad=True) == 8_320
    # float32 (p = 4, p' = 0): no copies; forward 3,200; backward 3,200 + 4·4·100 = 4,800;
    #   10·(16 + 32) = 480
    assert chunked_logprob_bytes(10, 100, 8, 4, compute_bytes=4) == 5_280
    # t = 3 < chunk: c = 3; forward 1,600 + 2,400 = 4,000;
    #   backward 3,200 + 1,600 + max(1,800, 600 + 1,200)
    #   = 6,600; per token 3·32 = 96: 6,696
    assert chunked_logprob_bytes(3, 100, 8, 4) == 6_696


@pytest.mark.slow
def test_peak_memory_chunked_is_4x_lower():
    # Peak RSS of forward + backward in fresh subprocesses (vapo_lab.bench.logits_memory), a small
    # setup: T = 1024, V = 32,768, h = 256, chunks of 128: the fp32 logits are 134 MB; measured on
    # a 2-core AMD EPYC: 554 MB unchunked, 76 MB chunked (the formula: 76 MB).
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "vapo_lab.bench.logits_memory",
            "--tokens",
            "1024",
            "--vocab",
            "32768",
            "--hidden",
            "256",
            "--chunk",
            "128",
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    rows = json.loads(out.stdout)
    before = next(r for r in rows if r["case"] == "unchunked")
    after = next(r for r in rows if r["case"] == "chunked")
    assert before["peak_bytes"] >= 4 * after["peak_bytes"]
    assert abs(after["peak_bytes"] / after["predicted_bytes"] - 1) <= 0.15
