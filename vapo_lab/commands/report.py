"""`vapo-lab report`: Table 1, Figures 1-2 and diagnostics from tracked runs."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vapo_lab.commands.output import cli_errors, stderr, stdout


@cli_errors
def report(
    experiment: Annotated[
        str, typer.Option(help="MLflow experiment of the grid (the grid file's name).")
    ] = "table1",
    out: Annotated[
        Optional[str], typer.Option(help="Output folder (default reports/<experiment>).")
    ] = None,
    tracking_uri: Annotated[
        Optional[str],
        typer.Option(
            help="MLflow store or server (default: MLFLOW_TRACKING_URI, else ./mlflow.db)."
        ),
    ] = None,
    variants: Annotated[
        Optional[list[str]],
        typer.Option(help="Figure 2's variants (repeatable), default VAPO and DAPO."),
    ] = None,
    score: Annotated[
        str,
        typer.Option(
            help="How a run's held-out curve becomes its score: "
            "final (last evaluation, default), best (highest), "
            "plateau (mean of the last 20% of the steps' evaluations) "
            "or speed (area under the curve over the steps)."
        ),
    ] = "final",
    ema: Annotated[
        float,
        typer.Option(
            help="EMA α of Figure 2's lines in (0, 1] (each point α of its step's value); 1 = none."
        ),
    ] = 0.2,
    band: Annotated[
        str,
        typer.Option(
            help="Band around the mean over seeds: minmax, std, or ci (the 95% bootstrap interval "
            "of the mean)."
        ),
    ] = "minmax",
    runs: Annotated[
        Optional[list[str]],
        typer.Option(
            help="Report from a runs export (.json.gz) instead of a store; "
            "repeat it for the other experiments a plan's families read (the first is reported)."
        ),
    ] = None,
    save_runs: Annotated[
        Optional[str], typer.Option(help="Also export the experiment's runs to this .json.gz.")
    ] = None,
    predictions: Annotated[
        Optional[str],
        typer.Option(
            help="Score the predictions in this YAML against the runs "
            "(e.g. reports/table1-cpu-long/predictions.yaml)."
        ),
    ] = None,
    findings: Annotated[
        Optional[str],
        typer.Option(
            help="Print beside the plan's verdicts what was found after the grid: a YAML "
            "'findings: {prediction id or claim: text}' "
            "(e.g. reports/table1-plateau/findings.yaml)."
        ),
    ] = None,
) -> None:
    """Table 1, Figures 1 and 2 and diagnostics from a grid's tracked runs, beside the paper.

    Table 1 comes as Markdown, LaTeX and CSV.

    Examples: vapo-lab report --experiment table1 --variants VAPO --variants DAPO --variants GRPO;
    vapo-lab report --runs reports/table1-80steps/runs.json.gz --out reports/table1-80steps;
    vapo-lab report --runs reports/table1-cpu-long/runs.json.gz --out reports/table1-cpu-long
    --predictions reports/table1-cpu-long/predictions.yaml
    """
    from vapo_lab.report import ReportError, make_report, report_from_export

    if runs and save_runs:
        raise ReportError(
            "--runs and --save-runs together: a runs export is already saved; give one of them"
        )
    if runs:
        rep = report_from_export(
            runs,
            out,
            variants=variants,
            score=score,
            smooth=ema,
            band=band,
            predictions=predictions,
            findings=findings,
        )
    else:
        from vapo_lab.launch.parent import heal_everywhere

        # runs that ended while the store was down: their steps and status first
        heal_everywhere("runs", lambda m: stderr.print(m, highlight=False, markup=False))
        rep = make_report(
            experiment,
            out,
            tracking_uri,
            variants,
            score=score,
            smooth=ema,
            band=band,
            predictions=predictions,
            findings=findings,
        )
    if save_runs:
        from vapo_lab.track import resolve_tracking_uri
        from vapo_lab.track.export import export_runs

        n = export_runs(resolve_tracking_uri(tracking_uri), experiment, save_runs)
        stdout.print(f"exported {n} runs to {save_runs}", highlight=False, markup=False)
    stdout.print((rep.out / "table1.md").read_text(), highlight=False, markup=False)
    stdout.print(
        f"wrote {len(rep.files)} files to {rep.out} (start with {rep.out / 'index.md'})",
        highlight=False,
        markup=False,
    )
