"""`vapo-lab report`: Table 1, Figure 1 and Figure 2 of a grid's tracked runs, beside the paper.

``collect`` reads MLflow and groups runs into variants, ``table`` aggregates and compares with the
paper, with the seed statistics of ``stats`` (bootstrap intervals, separability from VAPO, rank
agreement), ``figures`` draws the curves with seed bands; ``make_report`` writes them all and an
``index.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vapo_lab.names import slug
from vapo_lab.registry.table1 import row_name
from vapo_lab.report import confirm, confirm_markdown, precision, stats
from vapo_lab.report import diagnostics as diag
from vapo_lab.report import predictions as pred
from vapo_lab.report.challenges import challenge_lines, figure_challenges
from vapo_lab.report.collect import (
    CURVE_METRICS,
    ReportError,
    RunData,
    group,
    load_runs,
    runs_of_export,
    score_key,
)
from vapo_lab.report.figures import BANDS, FIG2_EMA, band_text, figure1, figure2, smoothing_text
from vapo_lab.report.table import (
    SCORES,
    build_table,
    rank_agreement,
    table_records,
    to_csv,
    to_latex,
    to_markdown,
)

__all__ = ["Report", "ReportError", "make_report", "report_from_export"]

CLIP_KEYS = ("actor/clipfrac_low", "actor/clipfrac_high")


@dataclass
class Report:
    out: Path
    files: list[Path] = field(default_factory=list)
    table: list[dict[str, Any]] = field(default_factory=list)
    rank: dict[str, Any] = field(default_factory=dict)
    figure1: dict[str, Any] = field(default_factory=dict)
    figure2: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, Any] = field(default_factory=dict)  # figure stem -> what it plotted
    predictions: dict[str, Any] = field(default_factory=dict)  # the scored predictions, when given


def make_report(
    experiment: str,
    out: str | Path | None = None,
    tracking_uri: str | None = None,
    variants: list[str] | None = None,
    fig1_variants: list[str] | None = None,
    score: str = "final",
    smooth: float = FIG2_EMA,
    band: str = "minmax",
    predictions: str | Path | None = None,
    findings: str | Path | None = None,
    runs_of: Callable[[str], list[RunData]] | None = None,
) -> Report:
    """Writes the report of ``experiment`` to ``out`` (default reports/<experiment>); returns it.

    Args:
        experiment: the MLflow experiment of a grid (a grid file's name, e.g. table1).
        tracking_uri: the store (default: tracking.uri's resolution: MLFLOW_TRACKING_URI,
            ./mlflow.db).
        variants: Figure 2's variants (default VAPO and DAPO).
        fig1_variants: Figure 1's variants (default VAPO, DAPO, GRPO and Vanilla PPO, if present).
        score: how a run's held-out curve becomes its score (``table.SCORES``): "final" (the
            default), "best", "plateau" or "speed".
        smooth: the EMA α of Figure 2's lines in (0, 1]; 1 = none.
        band: the seed band around the mean over seeds in every figure: "minmax" or "std".
        predictions: a predictions YAML or confirmatory plan to score against the runs, written
            to predictions_scored.md and index.md.
        findings: a findings YAML (``confirm.load_findings``): what was found after the grid,
            printed beside each verdict of the plan it qualifies.
        runs_of: where an experiment's runs come from (default: ``load_runs`` from
            ``tracking_uri``; ``report_from_export``: runs exports).

    Raises:
        ReportError: no runs, no scores, or a bad option (one line, with the fix).
    """
    if score not in SCORES:
        raise ReportError(f"--score {score}: choose {', '.join(SCORES)}")
    if band not in BANDS:
        raise ReportError(f"--band {band}: choose one of {', '.join(BANDS)}")
    if not 0 < smooth <= 1:
        raise ReportError(f"--ema {smooth}: must be in (0, 1] (1 = no smoothing)")
    from vapo_lab.config.preflight import require_writable

    # a bad file fails before any store is read; a plan (families, tests, Holm) or the older format
    plan = confirm.load(predictions) if predictions and confirm.is_plan(predictions) else None
    preds = pred.load(predictions) if predictions and plan is None else None
    if findings and plan is None:
        raise ReportError("--findings qualifies a confirmatory plan's verdicts: give --predictions")
    found = confirm.load_findings(findings) if findings else {}

    require_writable(
        Path(out or Path("reports") / slug(experiment)),
        f"--out {out}" if out else f"the report folder reports/{slug(experiment)}",
        "give --out a writable folder",
        ReportError,
    )
    read = runs_of or (lambda name: load_runs(tracking_uri, name, CURVE_METRICS + CLIP_KEYS))
    runs = read(experiment)
    groups = group(runs)
    if not variants:  # the paper's pair, or whatever of it the experiment holds
        variants = [v for v in (row_name("vapo"), row_name("dapo")) if v in groups] or sorted(
            groups
        )[:2]
    unknown = [v for v in variants if v not in groups]
    if unknown:
        raise ReportError(
            f"--variants {', '.join(unknown)}: not in experiment {experiment!r} "
            f"(it has: {', '.join(sorted(groups))})"
        )
    fig1_variants = fig1_variants or [
        v
        for v in (row_name("vapo"), row_name("dapo"), row_name("grpo"), row_name("ppo"))
        if v in groups
    ]
    key = score_key(runs)
    # an experiment's name may come from a runs file: a slug, never a path out of reports/
    out = Path(out or Path("reports") / slug(experiment))
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out=out)

    rows = build_table(groups, key, score)
    label = f"{key.split('/')[-1].replace('_at_', '@')} {score}"
    for name, text in (
        ("table1.md", to_markdown(rows, label)),
        ("table1.tex", to_latex(rows, label)),
        ("table1.csv", to_csv(rows)),
    ):
        (out / name).write_text(text, encoding="utf-8")
        rep.files.append(out / name)
    rep.table, rep.rank = table_records(rows), rank_agreement(rows)
    paths, rep.figure2 = figure2(groups, variants, out, smooth, band)
    rep.files += paths
    paths, rep.figure1 = figure1(groups, fig1_variants, key, out, band)
    rep.files += paths
    for stem, draw in (
        ("diag_value_bias", diag.figure_value_bias),
        ("diag_adv_gap", diag.figure_adv_gap),
        ("diag_lambda", diag.figure_lambda),
        ("diag_length", diag.figure_length),
        ("diag_clip", diag.figure_clip),
        ("challenges", figure_challenges),
    ):
        paths, info = draw(groups, out, band)
        if paths:
            rep.files += paths
            rep.diagnostics[stem] = info
    if preds:
        rep.predictions = pred.score(*preds[:2], groups, key)
        (out / "predictions_scored.md").write_text(
            pred.to_markdown(rep.predictions, preds[2]), encoding="utf-8"
        )
        rep.files.append(out / "predictions_scored.md")
    if plan:
        loaded = {experiment: runs}

        def family_runs(name: str) -> list[RunData]:
            if name not in loaded:
                loaded[name] = read(name)
            return loaded[name]

        rep.predictions = confirm.score(
            plan, lambda name: group(family_runs(name)), lambda name: score_key(family_runs(name))
        )
        confirm.qualify(rep.predictions, found)
        (out / "predictions_scored.md").write_text(
            confirm_markdown.to_markdown(rep.predictions, plan.source), encoding="utf-8"
        )
        rep.files.append(out / "predictions_scored.md")
    (out / "index.md").write_text(
        _index(experiment, runs, groups, rows, rep, label, variants, key, band, smooth),
        encoding="utf-8",
    )
    rep.files.append(out / "index.md")
    summary = {
        "table": rep.table,
        "rank": rep.rank,
        "figure1": rep.figure1,
        "figure2": rep.figure2,
        "diagnostics": diag.summarize(groups),
        "score": label,
        "statistics": stats.settings(),
        "band": BANDS[band],
    }
    if rep.predictions:
        summary["predictions"] = rep.predictions
    (out / "report.json").write_text(
        json.dumps(precision.json_rounded(summary), indent=1, default=str)
    )
    rep.files.append(out / "report.json")
    return rep


def report_from_export(
    path: str | Path | list[str | Path], out: str | Path | None = None, **kwargs: Any
) -> Report:
    """Reports on runs exports (``vapo-lab report --save-runs``): on the first file's experiment,
    the others holding the experiments a plan's families also read. The runs are read as
    ``load_runs`` reads them once imported into a store (``collect.runs_of_export``), with no
    store: the import into MLflow's SQLite store took ~3/4 of a 120-run report."""
    from vapo_lab.track.export import read_export

    paths = path if isinstance(path, list) else [path]
    data = [read_export(p) for p in paths]  # every file checked (bounded, schema) before any use
    where = "the runs file" + (
        f" {paths[0]}" if len(paths) == 1 else f"s {', '.join(map(str, paths))}"
    )

    def runs_of(name: str) -> list[RunData]:
        return runs_of_export(data, name, where, CURVE_METRICS + CLIP_KEYS)

    return make_report(data[0]["experiment"], out, runs_of=runs_of, **kwargs)


def _index(
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
    commits = sorted({r.tags.get("git_commit", "unknown")[:12] for r in runs})
    seeds = sorted({r.seed for r in runs})
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
    lines += _diagnostics_section(rep, groups, band)
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


def _diagnostics_section(rep: Report, groups: dict[str, list[Any]], band: str) -> list[str]:
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
