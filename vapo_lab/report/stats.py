"""Seed statistics for Table 1: bootstrap intervals, t-tests with Holm, and rank agreement.

Every interval is a percentile bootstrap over seeds (``scipy.stats.bootstrap``) at ``CONFIDENCE``
with ``N_RESAMPLES`` resamples drawn from a generator seeded with ``RNG_SEED``: the same scores
give the same interval. With 2 or 3 seeds it is the seeds' range (why percentile, not BCa:
docs/report.md#statistics). A row needs 2 seeds for an interval: scipy refuses one observation,
and one seed has no spread.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 9999
RNG_SEED = 0
METHOD = "percentile"  # why not BCa: docs/report.md#statistics
# row means within this relative distance rank as one (a tie): float noise between equal means is
# ~1e-15, a true difference one held-out sample or more
TIE_RTOL = 1e-9
_TIE_TEXT = f"{TIE_RTOL:.0e}".replace("e-0", "e-")  # as the note prints it: "1e-9"
LEVEL = f"{100 * CONFIDENCE:g}%"  # as printed: "95%"


def _bootstrap(samples: Sequence[Sequence[float]], statistic: Any) -> np.ndarray | None:
    """Returns the (low, high) percentile-bootstrap interval of ``statistic`` over ``samples``,
    each sample resampled independently (``paired=False``); None when any end is NaN."""
    with warnings.catch_warnings():  # NaN ends are reported as None, not as a warning
        warnings.simplefilter("ignore")
        res = stats.bootstrap(
            [np.asarray(s, dtype=float) for s in samples],
            statistic,
            n_resamples=N_RESAMPLES,
            vectorized=True,
            paired=False,
            axis=-1,
            confidence_level=CONFIDENCE,
            method=METHOD,
            rng=np.random.default_rng(RNG_SEED),
        )
    ci = np.stack(
        [np.asarray(res.confidence_interval.low), np.asarray(res.confidence_interval.high)], axis=-1
    )
    return None if np.isnan(ci).any() else ci


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def _mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def mean_interval(scores: Sequence[float]) -> tuple[float, float] | None:
    """Returns the percentile-bootstrap interval of the mean over seeds; None under 2 seeds."""
    if len(scores) < 2:
        return None
    ci = _bootstrap([scores], _mean)
    return None if ci is None else (float(ci[0]), float(ci[1]))


def difference_interval(
    scores: Sequence[float], reference: Sequence[float]
) -> tuple[float, float] | None:
    """Returns the bootstrap interval of mean(scores) − mean(reference), each side's seeds resampled
    on their own (different runs, not pairs); None under 2 seeds a side."""
    if len(scores) < 2 or len(reference) < 2:
        return None
    ci = _bootstrap([scores, reference], _mean_difference)
    return None if ci is None else (float(ci[0]), float(ci[1]))


def separable(interval: tuple[float, float] | None) -> bool | None:
    """Returns True when a difference interval excludes 0, False when it holds 0, None without one.

    Not a test corrected for Table 1's several comparisons against VAPO: a screen for which gaps
    the seeds can resolve at all.
    """
    if interval is None:
        return None
    return interval[0] > 0 or interval[1] < 0


def rank_correlations(
    ours: Sequence[float], paper: Sequence[float]
) -> tuple[float | None, float | None]:
    """Returns (Spearman ρ, Kendall τ-b) of ``ours`` against ``paper``; None for a constant side."""
    x, y = np.asarray(ours, dtype=float), np.asarray(paper, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant side: scipy warns and returns NaN
        rho, tau = float(spearman_rows(x, y)), float(kendall_rows(x, y))
    return (None if np.isnan(rho) else rho), (None if np.isnan(tau) else tau)


def pair_signs(x: np.ndarray) -> np.ndarray:
    """Returns sgn(x_i − x_j) over the ordered pairs i ≠ j of the last axis, i-major (shape
    (..., k·(k−1))): 0 for a tie, two values within ``TIE_RTOL`` of each other (relative)."""
    i, j = np.where(~np.eye(x.shape[-1], dtype=bool))
    d = x[..., i] - x[..., j]
    tie = np.abs(d) <= TIE_RTOL * np.maximum(np.abs(x[..., i]), np.abs(x[..., j]))
    return np.where(tie, 0.0, np.sign(d))


def tied_ranks(x: np.ndarray) -> np.ndarray:
    """Returns the ranks along the last axis, ties (``pair_signs``) sharing their average rank, as
    ``scipy.stats.rankdata``: 1 + the values below + half the others tied with it."""
    k = x.shape[-1]
    s = pair_signs(x).reshape(*x.shape[:-1], k, k - 1)
    return 1 + (s > 0).sum(axis=-1) + 0.5 * (s == 0).sum(axis=-1)


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Returns Spearman's ρ along the last axis, batched: Pearson's r of the average-tie ranks."""
    rx, ry = np.broadcast_arrays(tied_ranks(x), tied_ranks(y))
    return stats.pearsonr(rx, ry, axis=-1).statistic


def kendall_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Returns Kendall's τ-b along the last axis, batched, with ties as ``pair_signs`` finds them:
    the Pearson correlation of the pair-sign vectors (docs/report.md#statistics)."""
    sx, sy = np.broadcast_arrays(pair_signs(x), pair_signs(y))
    return stats.pearsonr(sx, sy, axis=-1).statistic


def rank_interval(
    rows: Sequence[Sequence[float]], paper: Sequence[float]
) -> dict[str, tuple[float, float] | None] | None:
    """Returns the bootstrap intervals of Spearman ρ and Kendall τ-b of the row means and ``paper``,
    each row's seeds resampled on their own (one-seed rows and the paper's scores held fixed); None
    under 2 rows or without a row of 2 seeds."""
    if len(rows) < 2 or all(len(r) < 2 for r in rows):
        return None
    varied = [k for k, r in enumerate(rows) if len(r) >= 2]
    fixed = {k: float(np.mean(r)) for k, r in enumerate(rows) if len(r) < 2}
    paper_arr = np.asarray(paper, dtype=float)

    def both(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        means = dict(zip(varied, (np.mean(s, axis=axis) for s in samples)))
        batch = np.broadcast_shapes(*(m.shape for m in means.values()))
        # (batch, rows)
        x = np.stack(
            [
                np.broadcast_to(means[k], batch) if k in means else np.full(batch, fixed[k])
                for k in range(len(rows))
            ],
            axis=-1,
        )
        return np.stack([spearman_rows(x, paper_arr), kendall_rows(x, paper_arr)])

    # a resample with all means equal gives NaN: None
    ci = _bootstrap([rows[k] for k in varied], both)
    if ci is None:
        return {"spearman": None, "kendall": None}
    return {
        "spearman": (float(ci[0, 0]), float(ci[0, 1])),
        "kendall": (float(ci[1, 0]), float(ci[1, 1])),
    }


ALPHA = 0.05  # the tests' level, Holm-corrected over a family


@dataclass(frozen=True)
class Test:
    """A two-sided test of mean(x) − mean(y) = 0 over seeds, or of a per-seed contrast's mean."""

    name: str  # "paired t" (seeds matched) or "Welch t" (the sides' own seeds)
    n: int  # pairs, or the smaller side's seeds
    difference: float  # mean of the paired differences, or difference of the means
    p: float  # two-sided
    ci95: tuple[float, float]  # t interval of the difference
    ci90: tuple[float, float]  # the interval TOST reads (equivalence at ALPHA)
    df: float
    se: float
    sign_flip_p: float | None = None  # exact sign-flip permutation p of the paired differences


def paired(diffs: Sequence[float]) -> Test | None:
    """Returns the paired t-test of per-seed differences, with the exact sign-flip p, or None."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # identical differences: scipy warns, se = 0
        res = stats.ttest_1samp(d, 0.0)
    se = float(np.std(d, ddof=1) / np.sqrt(d.size))
    return _test(
        "paired t",
        int(d.size),
        float(d.mean()),
        float(res.pvalue),
        se,
        d.size - 1.0,
        sign_flip_p(d),
    )


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Returns the exact two-sided sign-flip p of mean(diffs) = 0: the share of the 2^n sign
    patterns whose |sum| reaches the observed one, sums within ``TIE_RTOL`` of Σ|d| below it
    included (why not scipy's permutation_test: docs/report.md#statistics)."""
    d = np.asarray(diffs, dtype=float)
    reach = abs(d.sum()) - TIE_RTOL * np.abs(d).sum()
    hits, patterns, chunk = 0, 1 << d.size, 1 << 16
    for start in range(0, patterns, chunk):  # chunks: 2^n x n signs in bounded memory
        codes = np.arange(start, min(start + chunk, patterns))
        signs = 1.0 - 2.0 * ((codes[:, None] >> np.arange(d.size)) & 1)
        hits += int(np.count_nonzero(np.abs(signs @ d) >= reach))
    return hits / patterns


def welch(x: Sequence[float], y: Sequence[float]) -> Test | None:
    """Returns Welch's t-test of mean(x) − mean(y); None when a side has under 2 values."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size < 2 or b.size < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.ttest_ind(a, b, equal_var=False)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = float(np.sqrt(va + vb))
    df = (
        float((va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1)))
        if se > 0
        else a.size + b.size - 2.0
    )
    return _test(
        "Welch t", int(min(a.size, b.size)), float(a.mean() - b.mean()), float(res.pvalue), se, df
    )


def _test(
    name: str, n: int, diff: float, p: float, se: float, df: float, flip: float | None = None
) -> Test:
    def interval(level: float) -> tuple[float, float]:
        h = float(stats.t.ppf(0.5 + level / 2, df)) * se
        return diff - h, diff + h

    if se == 0:  # every seed moved by the same amount: p is 0 unless that amount is 0
        p = 1.0 if diff == 0 else 0.0
    return Test(
        name,
        n,
        diff,
        1.0 if np.isnan(p) else p,
        interval(1 - ALPHA),
        interval(1 - 2 * ALPHA),
        df,
        se,
        flip,
    )


def compare(x: dict[int, float], y: dict[int, float]) -> Test | None:
    """Returns the test of x − y over {seed: value}: paired when both have the same seeds (one
    grid's cells share a seed's base, data order and held-out samples), else Welch's."""
    if set(x) == set(y):
        return paired([x[s] - y[s] for s in sorted(x)])
    return welch(list(x.values()), list(y.values()))


def tost_p(test: Test, margin: float) -> float:
    """Returns the TOST equivalence p that |difference| < ``margin``: the larger of P(T ≥ (d +
    m)/se) and P(T ≤ (d − m)/se); below ALPHA exactly when ``ci90`` lies inside ±margin."""
    if test.se == 0:
        return 0.0 if abs(test.difference) < margin else 1.0
    lower = stats.t.sf((test.difference + margin) / test.se, test.df)
    upper = stats.t.cdf((test.difference - margin) / test.se, test.df)
    return float(max(lower, upper))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Returns Holm's step-down adjusted p-values in the input's order: the k-th smallest (from 0)
    times (m − k), made non-decreasing along that order, capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out, running = [0.0] * m, 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * pvalues[i]))
        out[i] = running
    return out


def settings() -> dict[str, Any]:
    """Returns the bootstrap's settings, for report.json."""
    return {
        "confidence": CONFIDENCE,
        "n_resamples": N_RESAMPLES,
        "method": METHOD,
        "rng_seed": RNG_SEED,
        "over": "seeds",
        "rank_tie_rtol": TIE_RTOL,
    }


NOTE = (
    f"How to read it. Mean ± std: over a row's finished seeds, sample standard deviation (n−1). "
    f"{LEVEL} interval: {METHOD} bootstrap of the mean over seeds (scipy.stats.bootstrap, "
    f"{N_RESAMPLES} resamples, generator seed {RNG_SEED}); with 2 or 3 seeds it is exactly the "
    f"seeds' range, which covers the mean of a symmetric seed-to-seed spread only 50% (2 seeds) "
    f"or 75% (3 seeds) of the time: read it as the spread seen, not as a guarantee. A row with "
    f"one seed has no spread and no interval. Δ vs our VAPO: the {LEVEL} {METHOD}-bootstrap "
    f"interval of (row mean − VAPO mean), each side's seeds resampled on their own: a description "
    f"of the spread, which decides nothing (with 3 seeds it covered the true difference about 79% "
    f"of the time in simulation, not 95%). Separable from VAPO: a two-sided t-test of the row "
    f"against VAPO, paired by seed when both have the same seeds (cells of one grid share a "
    f"seed's base model, data order and held-out samples), else Welch's; its p Holm-adjusted over "
    f"every row tested against VAPO; yes when the adjusted p < {ALPHA:g}; — when the row or VAPO "
    f"has fewer than 2 seeds. Beside a paired test, the exact sign-flip permutation p of the same "
    f"differences, which decides nothing: with n seeds it cannot go below 2/2^n (0.25 for 3), so "
    f"a paired t p far below it rests on the t distribution's tails. Rank agreement: Spearman ρ "
    f"and Kendall τ-b (as scipy defines them, counting row means within a relative {_TIE_TEXT} of "
    f"each other as tied) between our row means and the paper's scores, over the rows that have "
    f"both; its interval resamples each row's seeds, recomputes the row means and the correlation "
    f"({N_RESAMPLES} times; rows with one seed and the paper's scores held fixed)."
)
