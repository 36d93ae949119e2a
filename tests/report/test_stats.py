"""Table 1's seed statistics against values worked out by hand and by enumerating every resample.

With n seeds there are n^n equally likely bootstrap resamples, so for a few seeds the bootstrap
distribution is known exactly: its percentile interval is the (1 − 95%)/2 and (1 + 95%)/2
quantiles of those n^n values. Where every value has probability above 2.5% (2 or 3 seeds),
scipy's 9999 random resamples land both percentiles on the exact values.
"""

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from vapo_lab.report import stats
from vapo_lab.report.collect import RunData
from vapo_lab.report.figures import mean_band
from vapo_lab.report.table import Row, to_csv, to_latex, to_markdown


def exact_percentile(values: list[float], q: float) -> float:
    """The q-quantile of equally likely ``values``: the smallest v with P(X <= v) >= q."""
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


def exact_interval(values: list[float]) -> tuple[float, float]:
    tail = (1 - stats.CONFIDENCE) / 2
    return exact_percentile(values, tail), exact_percentile(values, 1 - tail)


def resample_means(seeds: list[float]) -> list[float]:
    """The mean of every one of the n^n resamples (with replacement, order kept) of ``seeds``."""
    return [sum(pick) / len(pick) for pick in itertools.product(seeds, repeat=len(seeds))]


def test_three_seed_interval_is_the_exact_percentile_of_all_27_resamples():
    seeds = [50.0, 56.0, 53.0]
    means = resample_means(seeds)
    assert len(means) == 27
    # (50, 50, 50) alone has probability 1/27 = 3.7% >= 2.5%: the lower end is 50; every mean
    # below 56 has P(X <= v) <= 26/27 = 96.3% < 97.5%: the upper end is 56
    assert exact_interval(means) == (50.0, 56.0)
    assert stats.mean_interval(seeds) == pytest.approx((50.0, 56.0), abs=1e-6)
    # skewed seeds: still the range (BCa would move the lower end to 50.33, see stats' docstring)
    skewed = [50.0, 51.0, 56.0]
    assert stats.mean_interval(skewed) == pytest.approx(
        exact_interval(resample_means(skewed)), abs=1e-6
    )
    assert stats.mean_interval(skewed) == pytest.approx((50.0, 56.0), abs=1e-6)


def test_two_seed_interval_and_degenerate_cases():
    # 4 resamples: means 40, 42, 42, 44 -> each end has probability 1/4
    assert exact_interval(resample_means([40.0, 44.0])) == (40.0, 44.0)
    assert stats.mean_interval([40.0, 44.0]) == pytest.approx((40.0, 44.0), abs=1e-6)
    # BCa: NaN
    assert stats.mean_interval([50.0, 50.0, 50.0]) == pytest.approx((50.0, 50.0), abs=1e-6)
    assert stats.mean_interval([50.0]) is None and stats.mean_interval([]) is None


def test_the_interval_is_deterministic():
    seeds = [47.1, 49.3, 52.8, 50.2, 48.8]
    assert stats.mean_interval(seeds) == stats.mean_interval(seeds)


def test_difference_interval_of_two_by_two_seeds_is_the_exact_percentile_of_all_16_resamples():
    row, vapo = [40.0, 44.0], [50.0, 52.0]
    diffs = [a - b for a in resample_means(row) for b in resample_means(vapo)]
    assert len(diffs) == 16
    # each extreme (row 40, VAPO 52: -12; row 44, VAPO 50: -6) has probability 1/16 >= 2.5%
    assert exact_interval(diffs) == (-12.0, -6.0)
    assert stats.difference_interval(row, vapo) == pytest.approx((-12.0, -6.0), abs=1e-6)
    assert stats.separable(stats.difference_interval(row, vapo)) is True


def test_separability_on_a_clearly_separated_and_a_clearly_overlapping_case():
    vapo = [50.0, 51.0, 52.0]
    # every resampled difference lies in [40 - 52, 42 - 50] = [-12, -8]: the interval excludes 0
    apart = stats.difference_interval([40.0, 41.0, 42.0], vapo)
    assert -12.0 <= apart[0] <= apart[1] <= -8.0 and stats.separable(apart) is True
    above = stats.difference_interval([60.0, 61.0, 62.0], vapo)
    assert 8.0 <= above[0] <= above[1] <= 12.0 and stats.separable(above) is True
    # same mean, wider spread: resampled differences on both sides of 0
    overlap = stats.difference_interval([48.0, 51.0, 54.0], vapo)
    assert overlap[0] < 0 < overlap[1] and stats.separable(overlap) is False
    # one seed on either side: not determinable
    assert (
        stats.difference_interval([40.0], vapo) is None
        and stats.difference_interval(vapo, [50.0]) is None
    )
    assert stats.separable(None) is None


def test_rank_correlations_are_the_hand_computed_values():
    # ours ranks [1, 2, 3.5, 3.5], paper ranks [1, 3, 2, 4]; centred [-1.5, -0.5, 1, 1] and
    # [-1.5, 0.5, -0.5, 1.5]: covariance 3, variances 4.5 and 5 -> ρ = 3 / √22.5 = 0.632
    # pairs: 4 concordant, 1 discordant, 1 tied in ours -> τ-b = (4 - 1) / √(5·6) = 0.548
    rho, tau = stats.rank_correlations([30, 46, 53, 53], [5, 50, 46, 60])
    assert rho == pytest.approx(3 / math.sqrt(22.5), abs=1e-6)
    assert tau == pytest.approx(3 / math.sqrt(30), abs=1e-6)
    # one adjacent swap of 4: ρ = 1 − 6·2 / (4·15) = 0.8, τ = (5 − 1) / 6
    assert stats.rank_correlations([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(
        (0.8, 4 / 6), abs=1e-6
    )
    assert stats.rank_correlations([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(
        (-1.0, -1.0), abs=1e-6
    )
    assert stats.rank_correlations([5, 5, 5], [1, 2, 3]) == (None, None)  # a constant side


def test_batched_rank_statistics_match_scipy_one_vector_at_a_time():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, size=(200, 6)).astype(float)  # few values: many ties
    y = np.array([3.0, 1.0, 1.0, 4.0, 0.0, 2.0])  # a tie on the paper's side too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant rows: NaN on both sides
        slow_rho = [sps.spearmanr(row, y).statistic for row in x]
        slow_tau = [sps.kendalltau(row, y).statistic for row in x]
        fast_rho, fast_tau = stats.spearman_rows(x, y), stats.kendall_rows(x, y)
    np.testing.assert_allclose(fast_rho, slow_rho, atol=1e-6)
    np.testing.assert_allclose(fast_tau, slow_tau, atol=1e-6)


def test_means_apart_only_in_their_last_bits_rank_as_tied():
    # 0.1 + 0.2 is 0.30000000000000004: one mean summed in another order, not a higher one
    assert stats.rank_correlations([0.1 + 0.2, 0.3, 0.5], [1, 2, 3]) == stats.rank_correlations(
        [0.3, 0.3, 0.5], [1, 2, 3]
    )
    assert stats.rank_correlations([0.1 + 0.2, 0.3, 0.5], [1, 2, 3]) == pytest.approx(
        (math.sqrt(3) / 2, 2 / math.sqrt(6))
    )
    np.testing.assert_array_equal(
        stats.tied_ranks(np.array([[0.1 + 0.2, 0.3, 0.5], [3.0, 1.0, 2.0]])),
        [[1.5, 1.5, 3.0], [3.0, 1.0, 2.0]],
    )
    # scores in steps of 100/1024 whose resampled row means often tie: moving each row's scores in
    # their last bits, up or down, would break those ties one way (ρ's lower end -1.0, not -0.95)
    rows = [
        [43.26171875, 43.84765625, 43.9453125],
        [43.84765625, 42.96875, 43.84765625],
        [43.45703125, 43.06640625, 43.06640625],
        [43.26171875, 43.84765625, 43.359375],
    ]
    nudged = [[x * (1 + k * 2.0**-52) for x in r] for r, k in zip(rows, (1, -1, 2, -2))]
    ci = stats.rank_interval(rows, [1.0, 2.0, 3.0, 4.0])
    assert stats.rank_interval(nudged, [1.0, 2.0, 3.0, 4.0]) == ci
    assert ci["spearman"] == pytest.approx((-0.9486833, 0.4)) and ci["kendall"] == pytest.approx(
        (-0.9128709, 1 / 3)
    )


def test_rank_interval_is_the_exact_percentile_of_all_16_resamples():
    """Rows A (seeds 10, 30), B (20, 40), C (one seed, 25) against the paper's order 1, 2, 3."""
    rows, paper = [[10.0, 30.0], [20.0, 40.0], [25.0]], [1.0, 2.0, 3.0]
    rhos, taus = [], []
    for a in itertools.product(rows[0], repeat=2):  # slow: every resample, scipy per resample
        for b in itertools.product(rows[1], repeat=2):
            means = [sum(a) / 2, sum(b) / 2, 25.0]
            rhos.append(sps.spearmanr(means, paper).statistic)
            taus.append(sps.kendalltau(means, paper).statistic)
    # lowest: A = 30, B = 30 (probability 1/4 · 1/2): ranks (2.5, 2.5, 1),
    # ρ = -1.5 / √(1.5·2) = -√3/2, τ-b = -2 / √(2·3); highest: A = 10, B = 20 (1/16): ranks
    # (1, 2, 3), ρ = τ = 1
    assert exact_interval(rhos) == pytest.approx((-math.sqrt(3) / 2, 1.0), abs=1e-6)
    assert exact_interval(taus) == pytest.approx((-2 / math.sqrt(6), 1.0), abs=1e-6)
    ci = stats.rank_interval(rows, paper)
    assert ci["spearman"] == pytest.approx(exact_interval(rhos), abs=1e-6)
    assert ci["kendall"] == pytest.approx(exact_interval(taus), abs=1e-6)
    assert stats.rank_interval([[10.0], [20.0]], [1.0, 2.0]) is None  # nothing to resample


def _rows(vapo: list[float], dapo: list[float]) -> list[Row]:
    return [
        Row(
            variant="DAPO",
            scores=dapo,
            run_ids=["d"] * len(dapo),
            state="",
            paper=50.0,
            other=dapo,
            seeds=list(range(len(dapo))),
        ),
        Row(
            variant="VAPO",
            scores=vapo,
            run_ids=["v"] * len(vapo),
            state="",
            paper=60.0,
            other=vapo,
            seeds=list(range(len(vapo))),
        ),
    ]


def test_one_seed_rows_print_no_spread_and_no_separability():
    md = to_markdown(_rows(vapo=[50.0], dapo=[46.0, 48.0]), "avg@4 final")
    assert "| VAPO | 50.0 | n=1, no interval | 1 | +0.0 | reference | 60.0 | +0.0 | 50.0 |" in md
    # DAPO has 2 seeds, but VAPO has one: its difference has no interval, separability "—"
    assert "| DAPO | 47.0 ± 1.4 | [46.0, 48.0] | 2 | -3.0 | — | 50.0 | -10.0 | 47.0 ± 1.4 |" in md
    assert "± 0.0" not in md
    tex = to_latex(_rows(vapo=[50.0], dapo=[46.0, 48.0]), "avg@4 final")
    assert (
        r"VAPO & $50.0$ & n=1, no interval & 1 & +0.0 & reference" in tex and r"\pm 0.0" not in tex
    )
    assert "DAPO & $47.0 \\pm 1.4$ & [46.0, 48.0] & 2 & -3.0 & --- &" in tex
    csv = to_csv(_rows(vapo=[50.0], dapo=[46.0, 48.0])).splitlines()
    assert csv[2].startswith("VAPO,50.0000,,,,1,,0.0000,,,,")  # no std, interval or separability


def test_rows_with_seeds_on_both_sides_say_yes_or_no():
    md = to_markdown(_rows(vapo=[50.0, 51.0, 52.0], dapo=[40.0, 41.0, 42.0]), "avg@4 final")
    # every seed 10 below VAPO's: the paired differences have no spread, p = 0
    assert (
        "| DAPO | 41.0 ± 1.0 | [40.0, 42.0] | 3 | -10.0 [" in md
        and "] | yes (paired t, Holm p <0.0001; sign-flip p 0.25) |" in md
    )
    # every resample keeps DAPO below VAPO, as the paper has it (50 < 60): ρ = 1, interval [1, 1]
    assert (
        "over 2 rows: Spearman ρ = 1.00 [95% interval 1.00, 1.00], "
        "Kendall τ-b = 1.00 [95% interval 1.00, 1.00]" in md
    )
    md = to_markdown(_rows(vapo=[50.0, 51.0, 52.0], dapo=[48.0, 51.0, 54.0]), "avg@4 final")
    # paired differences -2, 0, +2: mean 0, p = 1
    assert (
        "| DAPO | 51.0 ± 3.0 | [48.0, 54.0] | 3 | +0.0 [" in md
        and "] | no (paired t, Holm p 1; sign-flip p 1) |" in md
    )
    # equal means: no ranking on our side
    assert "Spearman ρ = undefined (one side is constant)" in md


def _run(seed: int, values: list[float]) -> RunData:
    return RunData(
        run_id=f"r{seed}",
        variant="VAPO",
        seed=seed,
        status="FINISHED",
        tags={},
        history={"m": list(enumerate(values, start=1))},
    )


def test_seed_bands_are_min_max_or_one_std_over_seeds():
    runs = [_run(0, [1.0, 2.0]), _run(1, [3.0, 2.0]), _run(2, [5.0, 2.0])]
    steps, mean, low, high = mean_band(runs, "m")
    assert steps == [1, 2] and mean == pytest.approx([3.0, 2.0])
    assert low == pytest.approx([1.0, 2.0]) and high == pytest.approx([5.0, 2.0])
    # step 1: values 1, 3, 5 -> sample std √((4 + 0 + 4) / 2) = 2
    _, _, low, high = mean_band(runs, "m", band="std")
    assert low == pytest.approx([1.0, 2.0]) and high == pytest.approx([5.0, 2.0])
    _, mean, low, high = mean_band(runs[:1], "m", band="std")  # one seed: no band
    assert low == mean == high


def test_the_ci_band_is_the_bootstrap_interval_of_the_mean_at_each_step():
    # step 1: ten seeds of 0 or 1, five each. A resample's mean is k/10 with k ~ Binomial(10, 1/2):
    # P(k <= 1) = 0.011 < 0.025 < P(k <= 2) = 0.055, so the percentile interval is (0.2, 0.8).
    # Step 2: every seed 2, no spread: the band is the mean.
    runs = [_run(s, [float(s % 2), 2.0]) for s in range(10)]
    steps, mean, low, high = mean_band(runs, "m", band="ci")
    assert steps == [1, 2] and mean == pytest.approx([0.5, 2.0])
    assert low == pytest.approx([0.2, 2.0]) and high == pytest.approx([0.8, 2.0])
    _, mean, low, high = mean_band(runs[:1], "m", band="ci")  # one seed: no band
    assert low == mean == high


def test_a_smoothed_line_is_drawn_over_the_raw_band():
    # seed means 1, 3, 1, 3: a zig-zag
    runs = [
        _run(0, [0.0, 2.0, 0.0, 2.0]),
        _run(1, [2.0, 4.0, 2.0, 4.0]),
    ]
    steps, line, low, high = mean_band(runs, "m", smooth=0.5)
    # EMA α 0.5 of the means by hand: 1, 0.5·3 + 0.5·1 = 2, 0.5·1 + 0.5·2 = 1.5,
    # 0.5·3 + 0.5·1.5 = 2.25
    assert line == pytest.approx([1.0, 2.0, 1.5, 2.25])
    assert low == pytest.approx([0.0, 2.0, 0.0, 2.0]) and high == pytest.approx(
        [2.0, 4.0, 2.0, 4.0]
    )
