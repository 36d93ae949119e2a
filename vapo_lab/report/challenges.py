"""Draws the paper's three challenges over training, where a task logs them (``task=arithfree``).

``challenges.png``: one panel a measure, one line a variant (mean over seeds, the seed band around
it), x the training step. (a) long responses: the held-out response length and the share of
held-out answers given at once, without working (``eval/mode_share_direct``); (b) a sparse
start: the held-out accuracy of the hardest digit-count stratum (``eval/acc_d17_32``); (c) a
biased critic: the value bias at tokens 0-7 (``diag/value_bias/000_007``, V(s_t) - G_t), in critic
runs only, its line an EMA (α 0.2) of the per-step means. Drawn only where the runs log the
direct-answer share (``SIGN``: the embedded default does not, so its reports stay as they are); a
panel whose measure no run logged is left out. docs/cpu-task-design.md has what each shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vapo_lab.registry.table1 import row_name
from vapo_lab.report import precision
from vapo_lab.report.collect import RunData
from vapo_lab.report.figures import BANDS, _save, mean_band, seeds_with

# (metric, panel title, y label, how index.md shows a value, EMA α of the line: the value bias is
# logged every step and noisy, the held-out measures at each eval)
PANELS = (
    ("eval/response_length", "(a) held-out response length", "tokens", "tokens", 1.0),
    ("eval/mode_share_direct", "(a) held-out answers given at once", "share", "percent", 1.0),
    ("eval/acc_d17_32", "(b) held-out accuracy, 17-32 digits", "accuracy", "percent", 1.0),
    ("diag/value_bias/000_007", "(c) value bias at tokens 0-7", "V − G", "signed", 0.2),
)
SIGN = "eval/mode_share_direct"  # logged by a task whose responses choose their length
# the variants drawn, in this order, where present: the ones the challenges separate
VARIANTS = ("vapo", "value_pretraining", "length_adaptive_gae", "dapo", "ppo")


def figure_challenges(
    groups: dict[str, list[RunData]], out: Path, band: str = "minmax"
) -> tuple[list[Path], dict[str, Any]]:
    """Writes challenges.png/.pdf (see the module docstring); returns (paths, {metric: {variant:
    (first step, its mean, last step, its mean)}}). No file when no run logged any panel's
    measure."""
    names = [row_name(v) for v in VARIANTS if row_name(v) in groups]
    # drawn for a task that measures the challenges: its sign, the held-out direct-answer share
    # (every critic run logs the value bias, every task the held-out length)
    if not any(seeds_with(groups[n], SIGN) for n in names):
        return [], {}
    panels = [p for p in PANELS if any(seeds_with(groups[n], p[0]) for n in names)]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    colours = {name: f"C{i}" for i, name in enumerate(names)}  # one colour a variant throughout
    info: dict[str, Any] = {}
    for ax, (key, title, ylabel, _, smooth) in zip(axes[0], panels, strict=True):
        info[key] = {}
        for name in names:
            steps, line, low, high = mean_band(groups[name], key, smooth=smooth, band=band)
            if not steps:
                continue
            n = seeds_with(groups[name], key)
            ax.plot(steps, line, label=f"{name} (n={n})", lw=1.4, color=colours[name])
            ax.fill_between(steps, low, high, color=colours[name], alpha=0.15, lw=0)
            info[key][name] = (steps[0], line[0], steps[-1], line[-1])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(f"The three challenges over training: mean over seeds, band {BANDS[band]}")
    paths = _save(fig, out, "challenges")
    plt.close(fig)
    return paths, info


def challenge_lines(info: dict[str, Any]) -> list[str]:
    """Returns index.md's lines for ``figure_challenges``'s ``info``: a panel a line, each variant's
    first and last value."""
    shown = {
        "tokens": lambda v: precision.fixed(v, 1),
        "percent": lambda v: precision.fixed(100 * v, precision.SHARE) + "%",
        "signed": lambda v: precision.fixed(v, precision.DIAGNOSTIC, signed=True),
    }
    lines = []
    for key, title, _, kind, _ in PANELS:
        parts = [
            f"{name} {shown[kind](first)} at step {s0} → {shown[kind](last)} at step {s1}"
            for name, (s0, first, s1, last) in info.get(key, {}).items()
        ]
        if parts:
            lines.append(f"- {title} (`{key}`): " + "; ".join(parts))
    return lines
