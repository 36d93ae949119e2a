"""avg@k, its standard error and bootstrap CI, pass@k, maj@k: hand-worked numbers and brute
force."""

import itertools
import math

import pytest

from vapo_lab.eval.metrics import (
    avg_at_k,
    avg_at_k_se,
    bootstrap_ci,
    maj_at_k,
    majority_index,
    pass_at_k,
    pass_at_k_ks,
    pass_at_k_table,
)


def brute_pass_at_k(n, c, k):
    """The fraction of the k-subsets of n samples (c correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_brute_force_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (
                    n,
                    c,
                    k,
                )


def test_pass_at_k_is_stable_for_large_n():
    # one correct of 1024: C(1023, 512)/C(1024, 512) = (1024 − 512)/1024, so pass@512 = 0.5 exactly;
    # the binomials themselves (~10^306) would overflow a float product of factorials
    assert pass_at_k(1024, 1, 512) == pytest.approx(0.5, abs=1e-12)
    assert pass_at_k(1024, 0, 512) == 0.0 and pass_at_k(1024, 600, 512) == 1.0
    assert pass_at_k(32, 8, 1) == pytest.approx(8 / 32, abs=1e-12)  # pass@1 = c/n


def test_pass_at_k_rejects_impossible_counts():
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_pass_at_k_table_by_hand():
    # problem 1: 1 of 4 correct; pass@1 = 1/4, pass@2 = 1 − C(3,2)/C(4,2) = 1 − 3/6 = 1/2,
    # pass@4 = 1
    # problem 2: 4 of 4 correct; pass@k = 1 for all k
    table = pass_at_k_table([[True, False, False, False], [True, True, True, True]])
    assert table == pytest.approx({1: 0.625, 2: 0.75, 4: 1.0}, abs=1e-12)
    assert pass_at_k_ks(1) == [1] and pass_at_k_ks(5) == [1, 2, 4, 5]
    assert pass_at_k_ks(32) == [1, 2, 4, 8, 16, 32]


# three problems with accuracies a = [2/4, 1/4, 0/4] = [0.5, 0.25, 0]
RESULTS = [[True, True, False, False], [False, True, False, False], [False, False, False, False]]


def test_avg_at_k_and_its_standard_error_by_hand():
    # ā = 0.75/3 = 0.25; deviations [0.25, 0, −0.25], s² = 0.125/2 = 0.0625, s = 0.25, SE = 0.25/√3
    assert avg_at_k(RESULTS) == pytest.approx(0.25, abs=1e-12)
    assert avg_at_k_se(RESULTS) == pytest.approx(0.25 / math.sqrt(3), abs=1e-12)
    assert math.isnan(avg_at_k_se([[True, False]]))  # one problem: no spread to estimate


def test_avg_at_k_weights_problems_not_samples():
    # (1/1 + 1/2)/2 = 0.75, not the pooled 2/3
    assert avg_at_k([[True], [True, False]]) == pytest.approx(0.75, abs=1e-12)


def test_bootstrap_ci_contains_the_mean_shrinks_and_is_seeded():
    # 3 problems: a resample is all-0 or all-0.5 with probability 1/27 = 3.7% each (> 2.5%), so
    # the 95% interval is exactly the extremes [0, 0.5]
    assert bootstrap_ci(RESULTS, seed=0) == (0.0, 0.5)
    lo, hi = bootstrap_ci(RESULTS * 10, seed=0)  # 30 problems, the same accuracies
    assert lo <= 0.25 <= hi and hi - lo < 0.5 / 2  # width ∝ 1/√P: ~0.5/√10
    # 3000 problems, drawn in blocks of 4M indices: SE = 0.2041/√3000 = 0.0037, width ≈ 4·SE
    big = bootstrap_ci(RESULTS * 1000, resamples=2000, seed=0)
    assert big[0] < 0.25 < big[1] and big[1] - big[0] < 0.02
    # the same seed, the same interval
    assert bootstrap_ci(RESULTS * 1000, resamples=2000, seed=0) == big
    assert bootstrap_ci(RESULTS * 1000, resamples=2000, seed=1) != big


def test_bootstrap_ci_by_hand():
    # a = [0, 1]: a resample's mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4, so the 2.5%
    # and 97.5% quantiles of 10,000 resampled means are 0 and 1
    assert bootstrap_ci([[False], [True]]) == (0.0, 1.0)
    # all problems alike: every resample has the same mean
    assert bootstrap_ci([[True, False]] * 5) == pytest.approx((0.5, 0.5), abs=1e-12)


def test_majority_ties_go_to_the_earliest_answer():
    assert majority_index(["3", "5", "5", "3"]) == 0  # 2 votes each: "3" appeared first
    assert majority_index(["5", "3", "3", "5"]) == 0
    assert majority_index(["7", "3", "5", "5"]) == 2  # the most votes wins over first place
    assert majority_index([None, None, "4"]) == 2  # no answer never votes
    assert majority_index([None, None]) is None


def test_maj_at_k():
    answers = [
        ["025", "25", "7"],  # "025" and "25" vote together in an integer set: majority 25, correct
        ["3", "5", "5"],  # majority 5, wrong; with k = 1 only "3" votes: correct
        [None, None, None],  # no answer: wrong
        ["1", "2", "2"],  # majority 2, correct; with k = 1 only "1" votes: wrong
    ]
    correct = [
        [True, True, False],
        [True, False, False],
        [False, False, False],
        [False, True, True],
    ]
    assert maj_at_k(answers, correct, integer=True) == pytest.approx(2 / 4, abs=1e-12)
    # 1, 2 right
    assert maj_at_k(answers, correct, k=1, integer=True) == pytest.approx(2 / 4, abs=1e-12)
    # without integer keys "025" and "25" vote apart; the tie goes to "025", also correct
    assert maj_at_k(answers, correct) == pytest.approx(2 / 4, abs=1e-12)
    with pytest.raises(ValueError):
        maj_at_k(answers[:1], correct)


def test_metrics_reject_empty_input():
    for metric in (avg_at_k, avg_at_k_se, pass_at_k_table):
        with pytest.raises(ValueError):
            metric([])
        with pytest.raises(ValueError):
            metric([[True], []])
