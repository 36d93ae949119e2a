r"""Evaluation metrics over P problems with n_i graded samples each: avg@k, pass@k, maj@k.

``correct`` is a per-problem list of per-sample bools (c_i of the n_i are correct):

* avg@n = (1/P)·Σ_i c_i/n_i: the mean per-sample accuracy, i.e. pass@1 estimated from n samples
  per problem (the paper's AIME avg@32). Not the chance that one of n samples is right.
* pass@k = (1/P)·Σ_i [1 − C(n_i − c_i, k)/C(n_i, k)]: the unbiased estimate of the chance that
  at least one of k samples is right (Chen et al. 2021, "Evaluating Large Language Models
  Trained on Code").
* maj@k: the fraction of problems whose most frequent answer among k samples is right.

Pure functions of Python lists / numpy arrays: no config, no logging.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vapo_lab.grading import normalize_answer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Returns the unbiased pass@k of one problem, 1 − C(n−c, k)/C(n, k), in product form.

    C(n−c, k)/C(n, k) = Π_{i=n−c+1}^{n} (1 − k/i), which never forms the huge binomials
    (C(1024, 512) overflows a float).

    Args:
        n: samples drawn, n ≥ 1.
        c: correct samples, 0 ≤ c ≤ n.
        k: 1 ≤ k ≤ n.

    Returns:
        1.0 when n − c < k (every k-subset holds a correct sample), 0.0 when c = 0.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 − Π_{i=n−c+1}^{n} (1 − k/i)
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_ks(n: int) -> list[int]:
    """Returns the k reported for n samples: the powers of 2 up to n, and n (1, 2, 4, 5 for 5)."""
    ks = [1 << j for j in range(n.bit_length()) if 1 << j <= n]
    return ks if ks[-1] == n else ks + [n]


def pass_at_k_table(correct: Sequence[Sequence[bool]]) -> dict[int, float]:
    """Returns {k: mean over problems of pass@k} for k in ``pass_at_k_ks(N)``.

    N is the smallest sample count over problems (every problem must support every k).
    """
    _check(correct)
    n_min = min(len(row) for row in correct)
    return {
        k: float(np.mean([pass_at_k(len(row), sum(map(bool, row)), k) for row in correct]))
        for k in pass_at_k_ks(n_min)
    }


def per_problem_accuracy(correct: Sequence[Sequence[bool]]) -> np.ndarray:
    """Returns a_i = c_i/n_i for each problem, shape (P,), float64."""
    _check(correct)
    return np.array([sum(map(bool, row)) / len(row) for row in correct], dtype=np.float64)


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """Returns avg@n = (1/P)·Σ_i c_i/n_i, the mean per-sample accuracy (pass@1 from n samples)."""
    return float(per_problem_accuracy(correct).mean())


def avg_at_k_se(correct: Sequence[Sequence[bool]]) -> float:
    """Returns the standard error of avg@n over problems, s/√P with s² = Σ_i (a_i − ā)²/(P − 1).

    Problems are the sampling unit (a benchmark is a sample of problems; the n samples of one
    problem are not independent evidence about the benchmark). NaN when P = 1.
    """
    a = per_problem_accuracy(correct)
    if len(a) < 2:
        return float("nan")
    return float(a.std(ddof=1) / np.sqrt(len(a)))


def bootstrap_ci(
    correct: Sequence[Sequence[bool]], level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Returns the percentile bootstrap interval of avg@n, resampling problems with replacement.

    Draws B = ``resamples`` sets of P problem indices (seeded numpy PCG64, so the same inputs and
    seed give the same interval), takes each set's mean a_i, and returns the (1 − level)/2 and
    (1 + level)/2 quantiles of the B means (numpy's linear interpolation), in blocks of about 4M
    indices to bound memory.
    """
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(
            f"bootstrap_ci needs 0 < level < 1 and resamples >= 1, got {level}, {resamples}"
        )
    a = per_problem_accuracy(correct)
    rng = np.random.Generator(np.random.PCG64(seed))
    block = max(1, (1 << 22) // len(a))
    means = np.concatenate(
        [
            a[rng.integers(0, len(a), size=(min(block, resamples - start), len(a)))].mean(axis=1)
            for start in range(0, resamples, block)
        ]
    )
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def majority_index(keys: Sequence[str | None]) -> int | None:
    """Returns the index of the first sample holding the most frequent key, None if all are None.

    Ties are broken by first appearance: among the most frequent keys, the one whose first
    sample comes earliest wins (deterministic, and independent of hashing or sort order).
    None (no answer) never votes.
    """
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, i)
    if not counts:
        return None
    best = max(counts, key=lambda key: (counts[key], -first[key]))
    return first[best]


def maj_at_k(
    answers: Sequence[Sequence[str | None]],
    correct: Sequence[Sequence[bool]],
    k: int | None = None,
    integer: bool = False,
) -> float:
    r"""Returns maj@k: the fraction of problems whose majority answer over k samples is correct.

    Answers vote by ``normalize_answer(answer, integer)`` key, so "025" and "25" (integer sets),
    or "\dfrac12" and "\frac{1}{2}", vote together; answers equal only symbolically (0.5 vs
    1/2) vote apart. The majority answer is judged by the correctness of its first sample (all
    samples with one key grade alike). A problem with no answer at all counts wrong. Ties: see
    ``majority_index``. k defaults to all samples.
    """
    _check(correct)
    if len(answers) != len(correct) or any(len(a) != len(c) for a, c in zip(answers, correct)):
        raise ValueError("answers and correct must have the same shape")
    hits = 0
    for row_answers, row_correct in zip(answers, correct):
        top = k or len(row_answers)
        keys = [None if a is None else normalize_answer(a, integer) for a in row_answers[:top]]
        winner = majority_index(keys)
        hits += winner is not None and bool(row_correct[winner])
    return hits / len(correct)


def _check(correct: Sequence[Sequence[bool]]) -> None:
    """Raises ValueError unless there is at least one problem and every problem has a sample."""
    if len(correct) == 0 or any(len(row) == 0 for row in correct):
        raise ValueError("metrics need at least one problem, each with at least one sample")


__all__ = [
    "avg_at_k",
    "avg_at_k_se",
    "bootstrap_ci",
    "maj_at_k",
    "majority_index",
    "pass_at_k",
    "pass_at_k_ks",
    "pass_at_k_table",
    "per_problem_accuracy",
]
