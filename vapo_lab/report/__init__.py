"""`vapo-lab report`: Table 1, Figure 1 and Figure 2 of a grid's tracked runs, beside the paper.

``collect`` reads MLflow and groups runs into variants, ``table`` aggregates and compares with the
paper, with the seed statistics of ``stats`` (bootstrap intervals, separability from VAPO, rank
agreement), ``figures`` draws the curves with seed bands; ``make_report`` writes them all and an
``index.md`` (``index_markdown``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from vapo_lab.names import slug
from vapo_lab.registry.table1 import row_name
from vapo_lab.report import confirm, confirm_markdown, precision, stats
from vapo_lab.report import diagnostic_figures as diag_figures
from vapo_lab.report import diagnostics as diag
from vapo_lab.report import predictions as pred
from vapo_lab.report.challenges import figure_challenges
from vapo_lab.report.collect import (
    CLIP_KEYS,
    CURVE_METRICS,
    ReportError,
    RunData,
    group,
    load_runs,
    runs_of_export,
    score_key,
)
from vapo_lab.report.figures import BANDS, FIG2_EMA, figure1, figure2
from vapo_lab.report.index_markdown import index
from vapo_lab.report.result import Report
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
        ("diag_value_bias", diag_figures.figure_value_bias),
        ("diag_adv_gap", diag_figures.figure_adv_gap),
        ("diag_lambda", diag_figures.figure_lambda),
        ("diag_length", diag_figures.figure_length),
        ("diag_clip", diag_figures.figure_clip),
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
        index(experiment, runs, groups, rows, rep, label, variants, key, band, smooth),
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
