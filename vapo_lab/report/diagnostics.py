"""Draws the diagnostics the paper argues but does not plot, from ``diag/*`` and ``gae/*``.

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
from pathlib import Path
from typing import Any

from vapo_lab.registry.table1 import row_name
from vapo_lab.report.collect import RunData
from vapo_lab.report.figures import BANDS, _save, mean_band, seeds_with, spread

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


def _mean_metric(runs: list[RunData], key: str) -> float | None:
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
            if (m := _mean_metric(runs, key)) is not None:
                d[key.split("/")[-1]] = m
        if d:
            out[name] = d
    return out


def _present(groups: dict[str, list[RunData]], names: tuple[str, ...], prefix: str) -> list[str]:
    """Returns ``names``'s variants, then any other, whose runs logged a ``prefix`` metric."""
    has = [n for n in groups if any(k.startswith(prefix) for r in groups[n] for k in r.history)]
    return [n for n in names if n in has] + sorted(set(has) - set(names))


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _dress(ax: Any, title: str, xlabel: str, **title_kw: Any) -> None:
    """Sets the axis's title, x label, grid, and a legend when it has lines."""
    ax.set_title(title, **title_kw)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)


def _write(plt: Any, fig: Any, out: Path, stem: str, suptitle: str) -> list[Path]:
    """Titles, saves (PNG and PDF) and closes ``fig``; returns the paths."""
    fig.suptitle(suptitle)
    paths = _save(fig, out, stem)
    plt.close(fig)
    return paths


def figure_value_bias(
    groups: dict[str, list[RunData]], out: Path, band: str = "minmax"
) -> tuple[list[Path], dict[str, Any]]:
    """Writes diag_value_bias: V(s_t) − G_t by position bucket, (a) early, (b) late; one line per
    critic-based variant (mean over seeds, ``band`` over the per-run means). Returns (paths,
    {variant: profile}); no file when no run logged it."""
    names = _present(
        groups,
        (
            row_name("vapo"),
            row_name("value_pretraining"),
            row_name("ppo"),
            row_name("decoupled_gae"),
        ),
        BIAS,
    )
    return _by_position(
        groups,
        names,
        BIAS,
        out,
        band,
        "diag_value_bias",
        "mean V(s_t) − G_t (value bias)",
        "Value bias by token position: critic value minus realised return",
    )


def figure_adv_gap(
    groups: dict[str, list[RunData]], out: Path, band: str = "minmax"
) -> tuple[list[Path], dict[str, Any]]:
    """Writes diag_adv_gap: correct minus wrong responses' mean advantage by position over 64+-token
    responses, (a) early, (b) late; VAPO, w/o length-adaptive GAE, vanilla PPO and DAPO (mean over
    seeds, ``band``). Returns (paths, {variant: profile})."""
    names = _present(
        groups,
        (row_name("vapo"), row_name("length_adaptive_gae"), row_name("ppo"), row_name("dapo")),
        GAP,
    )
    return _by_position(
        groups,
        names,
        GAP,
        out,
        band,
        "diag_adv_gap",
        "advantage gap: correct − wrong (64+-token responses)",
        "How much of the outcome reaches each position of long responses",
    )


def _by_position(
    groups: dict[str, list[RunData]],
    names: list[str],
    prefix: str,
    out: Path,
    band: str,
    stem: str,
    ylabel: str,
    suptitle: str,
) -> tuple[list[Path], dict[str, Any]]:
    """Draws a by-position metric early and late, a line a variant; no figure without a value."""
    if not any(
        k != "all"
        for name in names
        for per_run in by_position_per_run(groups[name], prefix).values()
        for k in per_run
    ):
        return [], {}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    plotted = {}
    for ax, which, title in zip(
        axes,
        ("early", "late"),
        ("(a) early: first fifth of training", "(b) late: last fifth of training"),
    ):
        for name in names:
            per_run = by_position_per_run(groups[name], prefix).get(which, {})
            prof = {k: sum(v) / len(v) for k, v in per_run.items()}
            labels = [k for k in prof if k != "all"]
            if labels:
                xs = [pretty(k) for k in labels]
                (line,) = ax.plot(
                    xs,
                    [prof[k] for k in labels],
                    marker="o",
                    label=f"{name} (n={max(len(per_run[k]) for k in labels)})",
                )
                lows, highs = zip(*(spread(per_run[k], band) for k in labels))
                ax.fill_between(xs, lows, highs, alpha=0.15, color=line.get_color())
                plotted.setdefault(name, {})[which] = prof
        ax.axhline(0, color="grey", lw=0.8)
        _dress(ax, title, "token position in the response")
    axes[0].set_ylabel(ylabel)
    return _write(
        plt, fig, out, stem, f"{suptitle} (mean over seeds; band: {BANDS[band]})"
    ), plotted


def figure_lambda(
    groups: dict[str, list[RunData]], out: Path, band: str = "minmax"
) -> tuple[list[Path], dict[str, Any]]:
    """Writes diag_lambda: (a) λ_policy(l) with our α over our policy's lengths (bars: share of
    responses per length bucket, all seeds pooled), (b) the paper's α = 0.05 over its lengths. No
    per-run means, so no seed band (``band`` is taken for the common signature)."""
    names = _present(groups, (row_name("vapo"), row_name("dapo")), LENGTH + "count_")
    if not names:
        return [], {}
    runs = groups[names[0]]
    alpha = float(runs[0].params.get("gae.alpha", "nan"))
    max_len = int(runs[0].params.get("rollout.max_new_tokens", 160))
    hist = length_histogram(runs)
    total = sum(hist.values()) or 1.0
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"wspace": 0.35})
    ax = axes[0]
    info: dict[str, Any] = {
        "variant": names[0],
        "alpha": alpha,
        "length_share": {k: v / total for k, v in hist.items()},
    }
    bars = ax.twinx()
    for label, count in hist.items():
        lo, hi = label.split("_")
        lo_f, hi_f = float(lo), (float(max_len) if hi == "up" else float(hi) + 1)
        bars.bar(
            lo_f,
            count / total,
            width=hi_f - lo_f,
            align="edge",
            alpha=0.25,
            color="tab:grey",
            edgecolor="tab:grey",
        )
    bars.set_ylabel(f"share of {names[0]}'s responses per length bucket")
    if math.isfinite(alpha):
        ls = list(range(1, max_len + 1))
        ax.plot(
            ls,
            [lambda_policy(length, alpha) for length in ls],
            color="tab:blue",
            label=f"length-adaptive, α = {alpha:g}",
        )
        info["lambda_at"] = {
            length: lambda_policy(length, alpha)
            for length in (5, 10, 20, 50, 100)
            if length <= max_len
        }
    fixed = next(
        (
            float(r.params["gae.lam_policy"])
            for n in groups
            for r in groups[n]
            if r.params.get("gae.lam_policy_mode") == "fixed" and "gae.lam_policy" in r.params
        ),
        None,
    )
    if fixed is not None:
        ax.axhline(
            fixed,
            color="tab:orange",
            ls="--",
            label=f"fixed λ = {fixed:g} (w/o length-adaptive GAE)",
        )
    for key, name in (("gae/lam_policy_mean", "mean"), ("gae/lam_policy_zero_frac", "zero_frac")):
        if (m := _mean_metric(runs, key)) is not None:
            info[name] = m
    ax.set_zorder(bars.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("response length l (tokens)")
    ax.set_ylabel("λ_policy")
    ax.set_title(
        f"(a) ours: λ_policy over our lengths (mean λ {info.get('mean', float('nan')):.3f}, "
        f"λ = 0 for {100 * info.get('zero_frac', float('nan')):.1f}%)",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax = axes[1]
    ls = list(range(PAPER_LENGTHS[0], PAPER_LENGTHS[1] + 1, 100))
    ax.plot(
        ls,
        [lambda_policy(length, PAPER_ALPHA) for length in ls],
        color="tab:blue",
        label=f"α = {PAPER_ALPHA}",
    )
    ax.set_xscale("log")
    ax.set_ylim(0.9, 1.002)
    ax.set_xlabel("response length l (tokens)")
    ax.set_title("(b) the paper: α = 0.05 over 500-20,480-token responses", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _write(
        plt,
        fig,
        out,
        "diag_lambda",
        "Length-adaptive GAE: λ_policy = 1 − 1/(α·l) against response length",
    ), info


def figure_length(
    groups: dict[str, list[RunData]], out: Path, band: str = "minmax"
) -> tuple[list[Path], dict[str, Any]]:
    """Writes diag_length: (a) accuracy per length bucket, early vs late, per variant (responses of
    all seeds pooled: no band); (b) mean length of correct and of wrong responses against step
    (mean over seeds with ``band``)."""
    names = _present(groups, (row_name("vapo"), row_name("dapo")), LENGTH + "count_")[:2]
    if not names:
        return [], {}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    info: dict[str, Any] = {}
    labels = sorted({k for n in names for w in length_accuracy(groups[n]).values() for k in w})
    width = 0.8 / (2 * len(names))
    for i, name in enumerate(names):
        prof = length_accuracy(groups[name])
        info[name] = prof
        for j, which in enumerate(("early", "late")):
            xs = [
                labels.index(k) + (2 * i + j - len(names) + 0.5) * width
                for k in prof.get(which, {})
            ]
            axes[0].bar(
                xs,
                [d["acc"] for d in prof.get(which, {}).values()],
                width=width,
                color=f"C{i}",
                label=f"{name}, {which}",
                alpha=0.4 if which == "early" else 0.9,
            )
    axes[0].set_xticks(range(len(labels)), [pretty(k) for k in labels])
    axes[0].set_xlabel("response length (tokens)")
    axes[0].set_ylabel("fraction correct")
    axes[0].set_title("(a) accuracy by response length, early vs late in training", fontsize=9)
    axes[0].grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    for i, name in enumerate(names):
        for key, style in (("correct_mean", "-"), ("wrong_mean", "--")):
            steps, mean, low, high = mean_band(groups[name], LENGTH + key, band=band)
            if steps:
                axes[1].plot(
                    steps,
                    mean,
                    ls=style,
                    color=f"C{i}",
                    label=f"{name}: {key.split('_')[0]} "
                    f"(n={seeds_with(groups[name], LENGTH + key)})",
                )
                axes[1].fill_between(steps, low, high, alpha=0.12, color=f"C{i}")
    axes[1].set_ylabel("mean response length (tokens)")
    _dress(
        axes[1],
        f"(b) length of correct (solid) and wrong (dashed) responses; band: {BANDS[band]}",
        "training step",
        fontsize=9,
    )
    return _write(
        plt,
        fig,
        out,
        "diag_length",
        "Response length against correctness (rollouts at temperature 1)",
    ), info


def figure_clip(
    groups: dict[str, list[RunData]], out: Path, band: str = "minmax"
) -> tuple[list[Path], dict[str, Any]]:
    """Writes diag_clip: clip fractions (a) low and (b) high against step, with and without
    clip-higher (and DAPO, which has it); mean over seeds with ``band``."""
    names = [
        n
        for n in (row_name("vapo"), row_name("clip_higher"), row_name("dapo"), row_name("ppo"))
        if n in groups and any("actor/clipfrac_low" in r.history for r in groups[n])
    ]
    if not names:
        return [], {}
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    info: dict[str, Any] = {}
    for ax, key, title in zip(
        axes,
        ("actor/clipfrac_low", "actor/clipfrac_high"),
        ("(a) low: ratio < 1 − ε_low, A < 0", "(b) high: ratio > 1 + ε_high, A > 0"),
    ):
        for name in names:
            steps, mean, low, high = mean_band(groups[name], key, band=band)
            if steps:
                (line,) = ax.plot(steps, mean, label=name)
                ax.fill_between(steps, low, high, alpha=0.15, color=line.get_color())
                info.setdefault(name, {})[key.split("/")[-1]] = sum(mean) / len(mean)
        _dress(ax, title, "training step", fontsize=9)
    axes[0].set_ylabel("fraction of tokens clipped")
    return _write(
        plt,
        fig,
        out,
        "diag_clip",
        f"Clip fractions with and without clip-higher (mean over seeds; band: {BANDS[band]})",
    ), info
