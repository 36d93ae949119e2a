"""The text of a report's index.md: how it was made, Table 1, the figures with what each shows,
the scored predictions, the diagnostics with their key numbers, clip fractions and the runs behind
each row. ``make_report`` (:mod:`vapo_lab.report`) writes the files it links first."""

from __future__ import annotations

from typing import Any

from vapo_lab.report import diagnostics as diag
from vapo_lab.report import precision
from vapo_lab.report.challenges import challenge_lines
from vapo_lab.report.collect import CLIP_KEYS
from vapo_lab.report.figures import band_text, smoothing_text
from vapo_lab.report.result import Report


def index(
    experiment: str,
    runs: list[Any],
    groups: dict[str, list[Any]],
    rows: list[Any],
    rep: Report,
    label: str,
    variants: list[str],
    key: str,
    band: str,
    smooth: float,
) -> str:
    """Returns index.md for the report ``rep`` of ``experiment``: its ``runs`` grouped by variant
    (``groups``), Table 1's ``rows``, the score ``label``, Figure 2's ``variants``, the held-out
    metric ``key``, the figures' ``band`` and Figure 2's EMA ``smooth``."""
    commits = sorted({r.tags.get("git_commit", "unknown")[:12] for r in runs})
    seeds = sorted({r.seed for r in runs})
    machines = sorted({r.tags.get("machine", "") for r in runs} - {""})
    commands = sorted(
        {c for r in runs for c in r.tags.get("grid_commands", "").split(" ; ")} - {""}
    )
    lines = [
        f"# Report: experiment `{experiment}`",
        "",
        f"Made by `vapo-lab report --experiment {experiment}` from {len(runs)} tracked run(s); "
        f"seeds {seeds}; git commit(s) {', '.join(commits)}; score = held-out {label} (x100).",
        "",
    ]
    if machines:  # runs from before the tag existed say nothing
        lines += [f"Ran on: {'; '.join(machines)}.", ""]
    grids = sorted({r.tags.get("grid_id", "") for r in runs} - {""})
    if grids:
        again = (
            "the command it was submitted with (below)"
            if commands
            else f"the same command, e.g. `vapo-lab ablate --table1 --seeds {len(seeds)}`"
        )
        lines.append(
            f"Grid(s): {', '.join(grids)}. Re-run or extend with {again}; "
            "`vapo-lab jobs` shows its cells."
        )
        lines.append("")
    if commands:
        lines += ["Submitted with:", "", *(f"    {c}" for c in commands), ""]
    lines += [
        "## Table 1",
        "",
        (rep.out / "table1.md").read_text(encoding="utf-8"),
        "Also as [LaTeX](table1.tex) and [CSV](table1.csv).",
        "",
        "## Figure 2",
        "",
        "![Figure 2](figure2.png)",
        "",
        f"{' vs '.join(variants)}: the line is the mean over seeds at each step, "
        f"{smoothing_text(smooth)}; "
        "the band is drawn from the seeds' unsmoothed values. "
        f"{band_text(band)} [PDF](figure2.pdf)",
        "",
        "## Figure 1",
        "",
        "![Figure 1](figure1.png)",
        "",
        f"Held-out score: mean over seeds at each evaluation, no smoothing. {band_text(band)} "
        "[PDF](figure1.pdf)",
        "",
    ]
    for name, d in rep.figure1.items():
        reach = "never" if d["reach_90"] is None else f"step {d['reach_90']}"
        lines.append(
            f"- {name}: final {precision.fixed(d['final'], precision.SCORE)}; "
            f"first reaches 90% of VAPO's final: {reach}"
        )
    if rep.predictions:
        lines += [
            "",
            "## Predictions, scored",
            "",
            (rep.out / "predictions_scored.md").read_text(encoding="utf-8"),
            "The predictions and why: [predictions.md](predictions.md).",
            "",
        ]
    lines += diagnostics_section(rep, groups, band)
    lines += [
        "",
        "## Clip fractions (mean over steps and seeds)",
        "",
        "| variant | low (ratio < 1-ε_low) | high (ratio > 1+ε_high) |",
        "|---|---|---|",
    ]
    for name in sorted(groups):
        vals = {k: [v for r in groups[name] for _, v in r.history.get(k, [])] for k in CLIP_KEYS}
        if all(vals.values()):
            lo, hi = (sum(v) / len(v) for v in vals.values())
            lo, hi = (precision.fixed(v, precision.FRACTION) for v in (lo, hi))
            lines.append(f"| {name} | {lo} | {hi} |")
    lines += ["", "## Runs behind each row", ""]
    for r in rows:
        ids = ", ".join(f"`{i}`" for i in r.run_ids) or r.state
        lines.append(f"- {r.variant}: {ids}")
    return "\n".join(lines) + "\n"


DIAG_TEXT = {
    "diag_value_bias": (
        "Value bias by token position",
        "Mean V(s_t) − G_t (critic value minus realised Monte-Carlo return) over the tokens at "
        "each position, in the first and the last fifth of training. VAPO §4.1 argues that a "
        "critic initialised from the reward model is biased until it is pretrained.",
    ),
    "diag_adv_gap": (
        "Advantage reaching the early tokens of long responses",
        "Over training responses of 64+ tokens, the mean advantage of correct responses' tokens "
        "minus wrong ones' at each position, in the first and the last fifth of training. With "
        "λ_policy = 0.95 a token k steps before the end gets 0.95^k of the outcome; "
        "length-adaptive GAE (VAPO §4.2) keeps λ near 1 for long responses so the outcome reaches "
        "their first tokens.",
    ),
    "diag_lambda": (
        "λ_policy against response length",
        "Length-adaptive GAE's λ_policy = 1 − 1/(α·l) over the lengths the policy produced, "
        "beside the paper's α = 0.05 over its lengths.",
    ),
    "diag_length": (
        "Response length against correctness",
        "Accuracy of the training rollouts by length, early and late (all seeds' responses pooled: "
        "no band), and the mean length of correct and wrong responses.",
    ),
    "diag_clip": (
        "Clip fractions against step",
        "Clip-higher raises ε_high (0.28 against 0.2), which "
        "should clip fewer positive-advantage tokens (b) and leave the low side (a) alone. The "
        "first mini-batch of a step's first epoch is on-policy (ratio 1), so only the later ones "
        "can be clipped at all (scale=cpu: 1 epoch of 4 mini-batches; scale=cpu-long: 2 epochs).",
    ),
    "challenges": (
        "The three challenges over training",
        "What the paper's three challenges look like in a task that logs them "
        "(docs/cpu-task-design.md): (a) long responses, the held-out response length and the "
        "share of answers given at once; (b) a sparse start, the held-out accuracy of the "
        "hardest stratum; (c) a biased critic, the value bias V(s_t) − G_t at tokens 0-7 "
        "(an EMA, α 0.2, of its per-step means; the first and last figures below are the EMA's).",
    ),
}
# figures drawn only for tasks that log their measures: not listed as missing elsewhere
OPTIONAL = ("challenges",)


# the diagnostics figures that draw per-run means, with a seed band (the others pool all seeds)
BANDED = ("diag_value_bias", "diag_adv_gap", "diag_length", "diag_clip", "challenges")


def diagnostics_section(rep: Report, groups: dict[str, list[Any]], band: str) -> list[str]:
    """Returns index.md's diagnostics: each figure, a line on what it shows, its key numbers."""
    if not rep.diagnostics:
        return [
            "",
            "## Diagnostics",
            "",
            "No run logged the trainer's diagnostics (diag/* metrics: "
            "runs made before they were added).",
        ]
    lines = ["", "## Diagnostics", ""]
    absent = [
        DIAG_TEXT[stem][0]
        for stem in DIAG_TEXT
        if stem not in rep.diagnostics and stem not in OPTIONAL
    ]
    if absent:
        why = (
            " (the advantage gap needs correct and wrong responses of 64+ tokens "
            "in the same window)"
            if "diag_adv_gap" not in rep.diagnostics
            else ""
        )
        lines += ["Not drawn, no run having a value for them: " + "; ".join(absent) + why + ".", ""]
    for stem, info in rep.diagnostics.items():
        title, text = DIAG_TEXT[stem]
        if stem in BANDED:
            text += f" Lines: mean over seeds of each run's value. {band_text(band)}"
        lines += [
            f"### {title}",
            "",
            f"![{title}]({stem}.png)",
            "",
            text + f" [PDF]({stem}.pdf)",
            "",
        ]
        if stem in ("diag_value_bias", "diag_adv_gap"):
            has_all = any("all" in d for prof in info.values() for d in prof.values())
            lines += [
                "| variant | window | "
                + " | ".join(diag.pretty(k) for k in _labels(info))
                + (" | all |" if has_all else " |"),
                "|---|---|" + "---|" * (len(_labels(info)) + has_all),
            ]
            for name, prof in info.items():
                for which, d in prof.items():
                    cells = [_diag(d[k]) if k in d else "" for k in _labels(info)]
                    tail = f" | {_diag(d.get('all', float('nan')))} |" if has_all else " |"
                    lines.append(f"| {name} | {which} | " + " | ".join(cells) + tail)
            lines.append("")
        elif stem == "diag_lambda":
            at = ", ".join(
                f"λ({length}) = {precision.fixed(v, precision.DIAGNOSTIC)}"
                for length, v in info.get("lambda_at", {}).items()
            )
            mean = precision.fixed(info.get("mean", float("nan")), precision.DIAGNOSTIC)
            zero = precision.fixed(100 * info.get("zero_frac", float("nan")), precision.SHARE)
            lines += [
                f"{info['variant']}, α = {info['alpha']:g}: {at}; mean λ_policy over training "
                f"{mean}, λ = 0 for {zero}% of responses.",
                "",
            ]
        elif stem == "diag_length":
            for name, prof in info.items():
                parts = [
                    f"{which}: "
                    + ", ".join(
                        f"{diag.pretty(k)} {_percent(d['acc'])} (n={d['count']:.0f})"
                        for k, d in prof[which].items()
                    )
                    for which in prof
                ]
                lines.append(f"- {name} — accuracy by length: " + "; ".join(parts))
            lines.append("")
        elif stem == "challenges":
            lines += [*challenge_lines(info), ""]
    return lines


def _diag(v: float) -> str:
    """Returns a value-bias or advantage-gap cell, signed, at ``precision.DIAGNOSTIC`` places."""
    return precision.fixed(v, precision.DIAGNOSTIC, signed=True)


def _percent(fraction: float) -> str:
    """Returns an accuracy as a percentage at ``precision.PERCENT`` places: "57%"."""
    return precision.fixed(100 * fraction, precision.PERCENT) + "%"


def _labels(info: dict[str, Any]) -> list[str]:
    return sorted({k for prof in info.values() for d in prof.values() for k in d} - {"all"})
