"""Tests for vapo_lab.algo.kl: kl_estimate, KL_ESTIMATORS.

Log ratio ℓ = log π − log π_ref on tokens sampled from π:
k1 = ℓ; k2 = ½ℓ²; k3 = exp(−ℓ) − 1 + ℓ (Schulman 2020).
"""

import math

import pytest
import torch

from tests.algo.helpers import F64, close
from vapo_lab.algo.kl import KL_ESTIMATORS, kl_estimate


def test_estimators_exported():
    torch.manual_seed(0)
    assert isinstance(KL_ESTIMATORS, tuple)
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_k1_k2_k3_by_hand():
    torch.manual_seed(1)
    # columns: π = 0.5, π_ref = 0.25 -> ℓ = ln 2 ≈ 0.6931472
    #            k1 = 0.6931472; k2 = ½(ln 2)² ≈ 0.2402265; k3 = ½ − 1 + ln 2 ≈ 0.1931472
    #          π = 0.25, π_ref = 0.5 -> ℓ = −ln 2
    #            k1 = −0.6931472; k2 = 0.2402265; k3 = 2 − 1 − ln 2 ≈ 0.3068528
    #          π = π_ref -> ℓ = 0: all three are 0
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), -1.3]], dtype=F64)
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -1.3]], dtype=F64)
    ln2 = math.log(2)
    close(kl_estimate(logprobs, ref, "k1"), [[ln2, -ln2, 0.0]])
    close(kl_estimate(logprobs, ref, "k2"), [[0.5 * ln2**2, 0.5 * ln2**2, 0.0]])
    close(kl_estimate(logprobs, ref, "k3"), [[0.5 - 1 + ln2, 2 - 1 - ln2, 0.0]])
    close(kl_estimate(logprobs, ref), kl_estimate(logprobs, ref, "k3"), atol=0)  # default k3
    close(kl_estimate(logprobs, ref, "k3"), [[0.1931472, 0.3068528, 0.0]])


def test_k3_nonnegative_and_shape_on_random_input():
    torch.manual_seed(2)
    logprobs = torch.randn(16, 33, dtype=F64) * 3
    ref = torch.randn(16, 33, dtype=F64) * 3
    k3 = kl_estimate(logprobs, ref, "k3")
    assert k3.shape == (16, 33) and k3.dtype == F64
    assert (k3 >= 0).all()
    # element-wise formula
    for b in range(0, 16, 5):
        for t in range(0, 33, 4):
            log_ratio = logprobs[b, t].item() - ref[b, t].item()
            assert abs(k3[b, t].item() - (math.exp(-log_ratio) - 1 + log_ratio)) < 1e-9


def test_sample_mean_approximates_true_kl():
    torch.manual_seed(3)
    # π = [0.5, 0.3, 0.2], π_ref = [0.2, 0.3, 0.5]
    # KL(π‖π_ref) = 0.5·ln(2.5) + 0.3·ln 1 + 0.2·ln(0.4) = 0.3·ln 2.5 ≈ 0.2748872
    # k3 per token: x=0: 0.4 − 1 + ln 2.5 ≈ 0.3162907; x=1: 0; x=2: 2.5 − 1 − ln 2.5 ≈ 0.5837093
    #   (mean 0.2748872 = the KL: unbiased), std ≈ 0.2064, so over n = 200,000 samples the
    #   standard error is ≈ 4.6e-4; tolerance 3e-3 (≈ 6.5 standard errors).
    # k1 is unbiased too but noisier: std ≈ 0.716, SE ≈ 1.6e-3; tolerance 1e-2 (≈ 6 SE).
    p = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    true_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist()))
    assert abs(true_kl - 0.3 * math.log(2.5)) < 1e-12
    gen = torch.Generator().manual_seed(1234)
    n = 200_000
    x = torch.multinomial(p, n, replacement=True, generator=gen).reshape(400, 500)
    logprobs = torch.log(p)[x]
    ref_logprobs = torch.log(q)[x]
    k3_mean = kl_estimate(logprobs, ref_logprobs, "k3").mean().item()
    k1_mean = kl_estimate(logprobs, ref_logprobs, "k1").mean().item()
    assert abs(k3_mean - true_kl) < 3e-3
    assert abs(k1_mean - true_kl) < 1e-2


def test_unknown_estimator_raises():
    torch.manual_seed(4)
    z = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError):
        kl_estimate(z, z, "k4")
    with pytest.raises(ValueError):
        kl_estimate(z, z, "")
