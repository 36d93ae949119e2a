"""Draws the diagnostics that :mod:`vapo_lab.report.diagnostics` measures, one figure each:
``diag_value_bias``, ``diag_adv_gap``, ``diag_lambda``, ``diag_length`` and ``diag_clip`` (what
each shows: docs/report.md). Each returns its paths and what it plotted, for report.json and
index.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vapo_lab.registry.table1 import row_name
from vapo_lab.report.collect import RunData
from vapo_lab.report.diagnostics import (
    BIAS,
    GAP,
    LENGTH,
    PAPER_ALPHA,
    PAPER_LENGTHS,
    by_position_per_run,
    lambda_policy,
    length_accuracy,
    length_histogram,
    mean_metric,
    pretty,
)
from vapo_lab.report.figures import BANDS, _save, mean_band, seeds_with, spread


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
        if (m := mean_metric(runs, key)) is not None:
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
