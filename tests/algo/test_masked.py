"""Tests for vapo_lab.algo.masked: masked_sum, masked_mean, masked_var.

Expected values are worked out by hand (derivations in comments) or by a slow
explicit loop written here, independent of the implementation.
"""

import types

import torch

from tests.algo.helpers import F64, prefix_mask
from vapo_lab.algo.masked import masked_mean, masked_sum, masked_var


def test_masked_sum_and_mean_by_hand():
    torch.manual_seed(0)
    # x = [[1, 2, 3, 99], [4, -7, -7, -7]], mask keeps 3 then 1 entries
    # masked_sum = 1 + 2 + 3 + 4 = 10; count = 4; masked_mean = 2.5
    x = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, -7.0, -7.0, -7.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(
        masked_sum(x, mask), torch.tensor(10.0, dtype=F64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        masked_mean(x, mask), torch.tensor(2.5, dtype=F64), atol=1e-6, rtol=0
    )
    # per row (dim=1): sums [6, 4], means [2, 4]
    torch.testing.assert_close(
        masked_sum(x, mask, dim=1), torch.tensor([6.0, 4.0], dtype=F64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        masked_mean(x, mask, dim=1), torch.tensor([2.0, 4.0], dtype=F64), atol=1e-6, rtol=0
    )


def test_float_mask_equals_bool_mask():
    torch.manual_seed(1)
    x = torch.randn(5, 7, dtype=F64)
    lengths = torch.tensor([0, 1, 3, 7, 5])
    mask_b = prefix_mask(lengths, 7)
    mask_f = mask_b.to(F64)
    torch.testing.assert_close(masked_mean(x, mask_b), masked_mean(x, mask_f), atol=1e-12, rtol=0)
    torch.testing.assert_close(masked_sum(x, mask_b), masked_sum(x, mask_f), atol=1e-12, rtol=0)
    torch.testing.assert_close(masked_var(x, mask_b), masked_var(x, mask_f), atol=1e-12, rtol=0)


def test_masked_mean_empty_mask_is_zero_not_nan():
    torch.manual_seed(2)
    x = torch.randn(3, 4, dtype=F64)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    out = masked_mean(x, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor(0.0, dtype=F64), atol=1e-6, rtol=0)
    # per-row: the empty middle row gives 0, the others their own mean
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    rows = masked_mean(x, mask, dim=1)
    expected = torch.stack([(x[0, 0] + x[0, 1]) / 2, torch.tensor(0.0, dtype=F64), x[2, 0]])
    assert torch.isfinite(rows).all()
    torch.testing.assert_close(rows, expected, atol=1e-6, rtol=0)


def test_masked_var_population_by_hand():
    torch.manual_seed(3)
    # entries 1, 2, 3 (the 10 is masked): mean 2, deviations -1, 0, 1,
    # population variance (1 + 0 + 1) / 3 = 2/3 (not the unbiased 1.0)
    x = torch.tensor([[1.0, 2.0], [3.0, 10.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    torch.testing.assert_close(
        masked_var(x, mask), torch.tensor(2.0 / 3.0, dtype=F64), atol=1e-6, rtol=0
    )


def test_masked_var_fewer_than_two_entries():
    torch.manual_seed(4)
    x = torch.tensor([[5.0, -3.0]], dtype=F64)
    # no entries -> 0 (spec); one entry -> population variance of one value = 0
    none = masked_var(x, torch.tensor([[0, 0]], dtype=torch.bool))
    one = masked_var(x, torch.tensor([[1, 0]], dtype=torch.bool))
    assert torch.isfinite(none) and torch.isfinite(one)
    torch.testing.assert_close(none, torch.tensor(0.0, dtype=F64), atol=1e-6, rtol=0)
    torch.testing.assert_close(one, torch.tensor(0.0, dtype=F64), atol=1e-6, rtol=0)


def test_random_against_python_loop():
    torch.manual_seed(5)
    B, T = 6, 11
    x = torch.randn(B, T, dtype=F64) * 3 + 1
    lengths = torch.randint(0, T + 1, (B,))
    lengths[0] = 0
    mask = prefix_mask(lengths, T)
    x = torch.where(mask, x, torch.full_like(x, 1e4))  # garbage in padding
    vals = [x[b, t].item() for b in range(B) for t in range(T) if mask[b, t]]
    n = len(vals)
    s = sum(vals)
    mean = s / n
    var = sum((v - mean) ** 2 for v in vals) / n
    torch.testing.assert_close(masked_sum(x, mask), torch.tensor(s, dtype=F64), atol=1e-9, rtol=0)
    torch.testing.assert_close(
        masked_mean(x, mask), torch.tensor(mean, dtype=F64), atol=1e-9, rtol=0
    )
    torch.testing.assert_close(masked_var(x, mask), torch.tensor(var, dtype=F64), atol=1e-9, rtol=0)
    row_means = []
    for b in range(B):
        row = [x[b, t].item() for t in range(T) if mask[b, t]]
        row_means.append(sum(row) / len(row) if row else 0.0)
    torch.testing.assert_close(
        masked_mean(x, mask, dim=1), torch.tensor(row_means, dtype=F64), atol=1e-9, rtol=0
    )


def test_algo_package_reexports():
    torch.manual_seed(6)
    import vapo_lab.algo as algo

    names = [
        "masked_sum",
        "masked_mean",
        "masked_var",
        "length_adaptive_lambda",
        "gae",
        "decoupled_gae",
        "aggregate_loss",
        "ppo_policy_loss",
        "LOSS_AGG_MODES",
        "value_loss",
        "explained_variance",
        "positive_nll_loss",
        "entropy_from_logits",
        "masked_entropy",
        "token_logprobs",
        "group_advantages",
        "dynamic_sampling_keep",
        "overlong_penalty",
        "kl_estimate",
        "KL_ESTIMATORS",
    ]
    # (a submodule such as vapo_lab.algo.gae is an attribute too: the function must shadow it)
    missing = [
        n for n in names if isinstance(getattr(algo, n, None), (types.ModuleType, type(None)))
    ]
    assert not missing, f"vapo_lab.algo does not re-export {missing}"
