"""Measures the diagnostics the paper argues but does not plot, from ``diag/*`` and ``gae/*``
(``diagnostic_figures`` draws them).

Value bias and advantage gap by token position, λ_policy against response length, accuracy against
response length, and clip fractions against step (what each shows: docs/report.md). "Early" is the
first fifth of a run's training steps (at least one), "late" the last fifth; a metric not logged at
every step (a length bucket no response reached, the advantage gap of a step without long
responses of both kinds) is read at the steps of the window where it was logged. Means over seeds
are of per-run means, drawn with a seed band over those (``figures.BANDS``); accuracies per length
bucket pool the responses of all seeds (no band).
"""

from __future__ import annotations

import math
from typing import Any

from vapo_lab.report.collect import RunData

BIAS = "diag/value_bias/"
GAP = "diag/adv_gap/"
LENGTH = "diag/length/"
WINDOW = 0.2
PAPER_ALPHA, PAPER_LENGTHS = 0.05, (500, 20480)


def pretty(label: str) -> str:
    """Returns a bucket label for display: "008_015" -> "8-15", "128_up" -> "128+"."""
    lo, hi = label.split("_")
    return f"{int(lo)}+" if hi == "up" else f"{int(lo)}-{int(hi)}"


def window_steps(steps: list[int], which: str, frac: float = WINDOW) -> list[int]:
    """Returns the first (``which="early"``) or last ("late") ``frac`` of ``steps``, at least 1."""
    steps = sorted(steps)
    n = max(1, math.ceil(frac * len(steps)))
    return steps[:n] if which == "early" else steps[-n:]


def training_steps(run: RunData, key: str | None = None) -> list[int]:
    """Returns the run's training steps: those that logged a rollout reward, else ``key``'s."""
    steps = [s for s, _ in run.history.get("rollout/reward", [])]
    if not steps and key is not None:
        steps = [s for s, _ in run.history.get(key, [])]
    return steps


def in_window(run: RunData, which: str, key: str | None = None) -> set[int]:
    """Returns the training steps of window ``which``: "early", "late" or "all"."""
    steps = training_steps(run, key)
    return set(steps) if which == "all" else set(window_steps(steps, which)) if steps else set()


def windowed(run: RunData, key: str, which: str) -> list[float]:
    """Returns the values of ``key`` logged within window ``which`` of the run's training steps."""
    keep = in_window(run, which, key)
    return [v for s, v in run.history.get(key, []) if s in keep]


def buckets(runs: list[RunData], prefix: str) -> list[str]:
    """Returns the names the runs logged under ``prefix``, e.g. bucket labels "008_015", "all"."""
    return sorted({k[len(prefix) :] for r in runs for k in r.history if k.startswith(prefix)})


def bucket_start(label: str) -> int:
    """Returns where a bucket label starts: "008_015" -> 8, "256_up" -> 256."""
    return int(label.split("_")[0])


def by_position_per_run(
    runs: list[RunData], prefix: str = BIAS
) -> dict[str, dict[str, list[float]]]:
    """Returns {"early"|"late": {bucket: [each run's windowed mean]}} of a BIAS or GAP metric."""
    out: dict[str, dict[str, list[float]]] = {}
    for which in ("early", "late"):
        for label in buckets(runs, prefix):
            per_run = [sum(v) / len(v) for r in runs if (v := windowed(r, prefix + label, which))]
            if per_run:
                out.setdefault(which, {})[label] = per_run
    return out


def by_position_profile(runs: list[RunData], prefix: str = BIAS) -> dict[str, dict[str, float]]:
    """Returns {"early"|"late": {bucket label: mean over runs of the run's windowed mean}}."""
    return {
        which: {label: sum(v) / len(v) for label, v in prof.items()}
        for which, prof in by_position_per_run(runs, prefix).items()
    }


def length_accuracy(runs: list[RunData]) -> dict[str, dict[str, dict[str, float]]]:
    """Returns {"early"|"late": {bucket: {"count", "acc"}}}, every run's window pooled."""
    labels = [k[len("count_") :] for k in buckets(runs, LENGTH) if k.startswith("count_")]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for which in ("early", "late"):
        for label in labels:
            count = correct = 0.0
            for r in runs:
                counts = dict(r.history.get(f"{LENGTH}count_{label}", []))
                accs = dict(r.history.get(f"{LENGTH}acc_{label}", []))
                keep = in_window(r, which, f"{LENGTH}count_{label}")
                for s in sorted(keep & set(counts)):
                    count += counts[s]
                    correct += counts[s] * accs.get(s, 0.0)
            if count:
                out.setdefault(which, {})[label] = {"count": count, "acc": correct / count}
    return out


def length_histogram(runs: list[RunData]) -> dict[str, float]:
    """Returns {bucket: responses over all training steps and runs}."""
    out: dict[str, float] = {}
    for r in runs:
        for k, h in r.history.items():
            if k.startswith(LENGTH + "count_"):
                label = k[len(LENGTH + "count_") :]
                out[label] = out.get(label, 0.0) + sum(v for _, v in h)
    return dict(sorted(out.items()))


def lambda_policy(length: float, alpha: float) -> float:
    """Returns λ_policy = 1 − 1/(α·l) clamped to [0, 1]: the trainer's formula, in plain floats."""
    return min(1.0, max(0.0, 1.0 - 1.0 / (alpha * length))) if length > 0 else 0.0


def mean_metric(runs: list[RunData], key: str) -> float | None:
    vals = [v for r in runs for _, v in r.history.get(key, [])]
    return sum(vals) / len(vals) if vals else None


def summarize(groups: dict[str, list[RunData]]) -> dict[str, Any]:
    """Returns the numbers behind the diagnostics figures, per variant that logged them."""
    out: dict[str, Any] = {}
    for name, runs in sorted(groups.items()):
        d: dict[str, Any] = {}
        if bias := by_position_profile(runs, BIAS):
            d["value_bias"] = bias
        if gap := by_position_profile(runs, GAP):
            d["adv_gap"] = gap
        if acc := length_accuracy(runs):
            d["length_accuracy"] = acc
        for key in (
            "gae/lam_policy_mean",
            "gae/lam_policy_zero_frac",
            LENGTH + "correct_mean",
            LENGTH + "wrong_mean",
            "actor/clipfrac_low",
            "actor/clipfrac_high",
        ):
            if (m := mean_metric(runs, key)) is not None:
                d[key.split("/")[-1]] = m
        if d:
            out[name] = d
    return out
