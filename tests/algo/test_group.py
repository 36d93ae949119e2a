"""Tests for vapo_lab.algo.group: group_advantages, dynamic_sampling_keep, overlong_penalty.

Hand derivations are in comments; the random case uses an explicit per-group loop.
"""

import math

import pytest
import torch

from tests.algo.helpers import F64, close
from vapo_lab.algo.group import dynamic_sampling_keep, group_advantages, overlong_penalty

# ---------------------------------------------------------------------------------------
# group_advantages
# ---------------------------------------------------------------------------------------


def test_group_advantages_by_hand():
    torch.manual_seed(0)
    # group [1, 0, 0, 1]: mean 0.5, deviations ±0.5,
    # unbiased variance = 4·0.25/(4 − 1) = 1/3, std = √(1/3) ≈ 0.5773503
    # Â = ±0.5/(0.5773503 + 1e-6) ≈ ±0.8660239 (±0.8660254 without eps)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(group_advantages(scores, 4), [a, -a, -a, a])
    close(group_advantages(scores, 4, eps=0.0), [0.8660254, -0.8660254, -0.8660254, 0.8660254])


def test_group_advantages_two_groups_one_constant():
    torch.manual_seed(1)
    # group 2 is all ones: deviations 0, std 0 -> 0/(0 + eps) = 0 (no nan)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=F64)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    out = group_advantages(scores, 4)
    assert torch.isfinite(out).all()
    close(out, [a, -a, -a, a, 0, 0, 0, 0])


def test_group_advantages_without_std_normalisation():
    torch.manual_seed(2)
    # Dr. GRPO: r − mean_g.  groups (G = 2): [1, 0] -> [0.5, −0.5]; [3, 5] -> [−1, 1]
    scores = torch.tensor([1.0, 0.0, 3.0, 5.0], dtype=F64)
    close(group_advantages(scores, 2, norm_std=False), [0.5, -0.5, -1.0, 1.0])
    # with std: each group has unbiased std |a − b|/√2: [1,0] -> 0.5/(1/√2) = 0.7071;
    # [3,5] -> 1/(2/√2) = 0.7071
    s = 1 / math.sqrt(2)
    close(group_advantages(scores, 2, eps=0.0), [s, -s, -s, s])


def test_group_size_one_gives_zero():
    torch.manual_seed(3)
    scores = torch.tensor([1.0, 0.0, 0.3], dtype=F64)
    for norm_std in [True, False]:
        out = group_advantages(scores, 1, norm_std=norm_std)
        assert torch.isfinite(out).all()
        close(out, [0.0, 0.0, 0.0])


def test_group_advantages_random_vs_loop():
    torch.manual_seed(4)
    G, n_groups = 5, 6
    scores = torch.randn(G * n_groups, dtype=F64)
    out = group_advantages(scores, G, eps=1e-6)
    expected = []
    for g in range(n_groups):
        group = scores[g * G : (g + 1) * G].tolist()
        mu = sum(group) / G
        std = math.sqrt(sum((x - mu) ** 2 for x in group) / (G - 1))  # Bessel
        expected += [(x - mu) / (std + 1e-6) for x in group]
    close(out, expected, atol=1e-9)


@pytest.mark.parametrize("B,G", [(5, 2), (7, 4), (3, 0), (4, -1)])
def test_group_advantages_bad_group_size_raises(B, G):
    torch.manual_seed(5)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(B, dtype=F64), G)


# ---------------------------------------------------------------------------------------
# dynamic_sampling_keep
# ---------------------------------------------------------------------------------------


def test_dynamic_sampling_keep_by_hand():
    torch.manual_seed(10)
    # G = 3: [0, 0, 0] all wrong -> drop; [1, 1, 1] all correct -> drop; [0, 1, 0] -> keep
    scores = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    keep = dynamic_sampling_keep(scores, 3)
    assert keep.dtype == torch.bool and keep.shape == (9,)
    assert keep.tolist() == [False] * 6 + [True] * 3


def test_dynamic_sampling_keep_other_scores():
    torch.manual_seed(11)
    # ±1 rewards and non-binary scores: any group with two distinct values is kept
    scores = torch.tensor([-1.0, -1.0, 0.5, 0.5, 0.5, 0.25, 1.0, -1.0])
    assert dynamic_sampling_keep(scores, 2).tolist() == [
        False,
        False,
        False,
        False,
        True,
        True,
        True,
        True,
    ]
    # G = 1: a single sample never has differing scores
    assert dynamic_sampling_keep(torch.tensor([0.0, 1.0]), 1).tolist() == [False, False]


# ---------------------------------------------------------------------------------------
# overlong_penalty
# ---------------------------------------------------------------------------------------


def test_overlong_penalty_boundaries():
    torch.manual_seed(20)
    # l_max = 20, l_cache = 4: free up to l_max − l_cache = 16; linear in (16, 20]; −1 beyond
    #   l = 0, 16 -> 0;  l = 17 -> (16 − 17)/4 = −0.25;  l = 18 -> −0.5;  l = 20 -> −1;
    #   l = 21, 100 -> −1
    lengths = torch.tensor([0, 16, 17, 18, 20, 21, 100])
    out = overlong_penalty(lengths, 20, 4)
    assert out.shape == (7,) and out.is_floating_point()
    close(out, [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])


def test_overlong_penalty_scale_and_full_cache():
    torch.manual_seed(21)
    # penalty = 2: l = 18 -> (16 − 18)/4·2 = −1;  l = 25 -> −2
    close(overlong_penalty(torch.tensor([18, 25, 3]), 20, 4, penalty=2.0), [-1.0, -2.0, 0.0])
    # l_cache = l_max = 4 (allowed): threshold 0; l = 2 -> −2/4 = −0.5; l = 4 -> −1; l = 5 -> −1
    close(overlong_penalty(torch.tensor([0, 2, 4, 5]), 4, 4), [0.0, -0.5, -1.0, -1.0])


@pytest.mark.parametrize("l_max,l_cache", [(20, 0), (20, -4), (5, 6)])
def test_overlong_penalty_bad_args_raise(l_max, l_cache):
    torch.manual_seed(22)
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([3, 4]), l_max, l_cache)
