"""Draws Figure 2 (length, reward, entropy against step) and Figure 1 (held-out score by step).

Curves are the mean over a variant's seeds at each step, smoothed by an EMA named in the caption
(Figure 1's held-out curves are not smoothed), drawn over a band of the seeds' raw values at each
step (``BANDS``: min-max, the default, or mean ± 1 sample std), as the paper's Figure 2 draws its
curves. With 2 or 3 seeds the min-max band is also the percentile-bootstrap interval of the mean
(``stats``); a variant with one seed has no band. Written as PNG and PDF with matplotlib's Agg
backend (no display needed).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vapo_lab.registry.table1 import row_name
from vapo_lab.report.collect import RunData
from vapo_lab.report.stats import LEVEL, mean_interval

# Figure 2's per-step curves zig-zag by ±0.2 reward between steps: an EMA of α 0.2 (~9-step memory)
FIG2_EMA = 0.2
FIG2_PANELS = [
    ("rollout/response_length", "(a) mean response length (tokens)"),
    ("rollout/reward", "(b) reward score"),
    ("actor/entropy", "(c) generation entropy"),
]


def ema(values: list[float], alpha: float) -> list[float]:
    """Returns the exponential moving average (alpha in (0, 1]; 1 = no smoothing)."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else alpha * v + (1 - alpha) * out[-1])
    return out


# the seed bands a figure can draw, as the report's text names them
BANDS = {
    "minmax": "min–max over seeds",
    "std": "mean ± 1 sample std over seeds",
    "ci": f"the {LEVEL} percentile-bootstrap interval of the mean over seeds",
}


def band_text(band: str) -> str:
    """Returns a sentence on what a figure's shaded band is, for index.md."""
    extra = (
        f", which with 2 or 3 seeds is also the {LEVEL} percentile-bootstrap interval of the mean"
        if band == "minmax"
        else ""
    )
    return f"Shaded: {BANDS[band]} at each point{extra}; a variant with one seed has no band."


def spread(vals: list[float], band: str = "minmax") -> tuple[float, float]:
    """Returns the (low, high) of ``band`` over one value per seed; (v, v) for one seed."""
    if band == "ci":  # the interval the tables give a mean (stats.mean_interval)
        m = sum(vals) / len(vals)
        return mean_interval(vals) or (m, m)
    if band == "std":
        m = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        return m - sd, m + sd
    return min(vals), max(vals)


def seeds_with(runs: list[RunData], key: str) -> int:
    """Returns how many of ``runs`` logged ``key``: the n behind a curve."""
    return sum(1 for r in runs if r.history.get(key))


def mean_band(
    runs: list[RunData], key: str, smooth: float = 1.0, band: str = "minmax"
) -> tuple[list[int], list[float], list[float], list[float]]:
    """Returns (steps, line, low, high) of ``key`` over ``runs`` at the steps every run logged.

    The line is the mean over seeds, smoothed by ``ema`` (``smooth`` 1: none); low and high are
    ``spread`` over the seeds' raw values: the band shows the step-to-step noise the line smooths.
    """
    series = [dict(h) for r in runs if (h := r.history.get(key, []))]
    if not series:
        return [], [], [], []
    steps = sorted(set.intersection(*(set(s) for s in series)))
    mean, low, high = [], [], []
    for s in steps:
        vals = [d[s] for d in series]
        mean.append(sum(vals) / len(vals))
        lo, hi = spread(vals, band)
        low.append(lo)
        high.append(hi)
    return steps, ema(mean, smooth), low, high


def smoothing_text(smooth: float) -> str:
    """Returns the caption's words for a line's smoothing."""
    if smooth >= 1:
        return "no smoothing"
    return (
        f"EMA with α = {smooth:g} (each point {smooth:g} of its step's value "
        f"plus {1 - smooth:g} of the line's last)"
    )


def _save(fig: Any, out: Path, stem: str) -> list[Path]:
    # no creation date in the files: the same runs give byte-identical figures
    fig.savefig(out / f"{stem}.png", dpi=130, bbox_inches="tight")
    fig.savefig(out / f"{stem}.pdf", bbox_inches="tight", metadata={"CreationDate": None})
    return [out / f"{stem}.png", out / f"{stem}.pdf"]


def figure2(
    groups: dict[str, list[RunData]],
    variants: list[str],
    out: Path,
    smooth: float = 1.0,
    band: str = "minmax",
) -> tuple[list[Path], dict[str, Any]]:
    """Writes Figure 2 (three panels, one line per variant); returns (paths, what was plotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    plotted: dict[str, Any] = {}
    for ax, (key, title) in zip(axes, FIG2_PANELS):
        for name in variants:
            steps, mean, low, high = mean_band(groups.get(name, []), key, smooth, band)
            if not steps:
                continue
            (line,) = ax.plot(steps, mean, label=f"{name} (n={seeds_with(groups[name], key)})")
            ax.fill_between(steps, low, high, alpha=0.2, color=line.get_color())
            plotted.setdefault(key, {})[name] = len(steps)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(
        "Figure 2: "
        + " vs ".join(variants)
        + f" (line: mean over seeds, {smoothing_text(smooth)}; "
        f"band: {BANDS[band]}, unsmoothed)",
        fontsize=9,
    )
    paths = _save(fig, out, "figure2")
    plt.close(fig)
    return paths, plotted


def first_reach(steps: list[int], values: list[float], target: float) -> int | None:
    """Returns the first step whose value reaches ``target``, None if never."""
    return next((s for s, v in zip(steps, values) if v >= target), None)


def figure1(
    groups: dict[str, list[RunData]], variants: list[str], key: str, out: Path, band: str = "minmax"
) -> tuple[list[Path], dict[str, Any]]:
    """Writes Figure 1 (held-out score, 90% of VAPO's final marked); returns (paths, info)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    curves = {name: mean_band(groups.get(name, []), key, 1.0, band) for name in variants}
    vapo = curves.get(row_name("vapo"))
    target = 0.9 * vapo[1][-1] if vapo and vapo[1] else None
    info: dict[str, Any] = {}
    for name, (steps, mean, low, high) in curves.items():
        if not steps:
            continue
        y = [100 * v for v in mean]
        (line,) = ax.plot(
            steps, y, marker="o", ms=3, label=f"{name} (n={seeds_with(groups[name], key)})"
        )
        ax.fill_between(
            steps,
            [100 * v for v in low],
            [100 * v for v in high],
            alpha=0.15,
            color=line.get_color(),
        )
        reach = first_reach(steps, mean, target) if target is not None else None
        info[name] = {"final": 100 * mean[-1], "reach_90": reach}
        if reach is not None:
            ax.axvline(reach, color=line.get_color(), ls=":", lw=1)
    if target is not None:
        ax.axhline(100 * target, color="grey", ls="--", lw=0.8, label="90% of VAPO's final")
    ax.set_xlabel("training step")
    ax.set_ylabel(f"held-out {key.split('/')[-1].replace('_at_', '@')} (x100)")
    ax.set_title(
        "Figure 1: held-out score against step (dotted: first step at 90% of VAPO's final)\n"
        f"mean over seeds; band: {BANDS[band]}",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    paths = _save(fig, out, "figure1")
    plt.close(fig)
    return paths, info
