"""`vapo-lab components` and `vapo-lab config`: what the registry and the config tree hold."""

from __future__ import annotations

from typing import Annotated

import typer

from vapo_lab.commands.output import (
    Col,
    DropOpt,
    OverridesArg,
    PresetOpt,
    cli_errors,
    print_table,
    show,
    stdout,
)


def components_markdown() -> str:
    """Returns the components as a Markdown table (docs/training.md carries it; a test compares)."""
    from vapo_lab.registry.components import COMPONENTS, settings

    lines = [
        "| component | key it owns | on (VAPO) | off (vanilla PPO) | what it does | "
        "Table 1 without it |",
        "|---|---|---|---|---|---|",
    ]
    for c in COMPONENTS:
        for key, (on, off) in settings(c).items():
            score = "-" if c.table1_without is None else f"{c.table1_without:g}"
            lines.append(
                f"| {c.name} | `{key}` | `{show(on)}` | `{show(off)}` | {c.summary} | {score} |"
            )
    return "\n".join(lines)


@cli_errors
def components(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the table as Markdown (docs/training.md).")
    ] = False,
) -> None:
    """List the seven VAPO components: what each does, its keys (on -> off) and Table 1 without it.

    Example: vapo-lab components
    """
    from vapo_lab.registry.components import COMPONENTS, settings
    from vapo_lab.registry.presets import PRESETS
    from vapo_lab.registry.table1 import paper_scores

    if markdown:
        stdout.print(components_markdown(), markup=False, highlight=False, soft_wrap=True)
        return

    cols = (
        Col("name", typed=True, style="bold"),
        Col("keys: on -> off", typed=True),
        Col("what it does (paper)"),
        Col("Table 1 without it", justify="right"),
    )
    rows = [
        (
            c.name,
            "\n".join(f"{k}: {show(on)} -> {show(off)}" for k, (on, off) in settings(c).items()),
            f"{c.summary} ({c.paper_section}, {c.origin})",
            "-" if c.table1_without is None else f"{c.table1_without:g}",
        )
        for c in COMPONENTS
    ]
    paper = ", ".join(
        f"{row} = {score:g}"
        for row, score in paper_scores().items()
        if row in {p.table1_row for p in PRESETS}
    )
    print_table(f"The {len(COMPONENTS)} VAPO components (Table 1: {paper})", cols, rows, lines=True)


@cli_errors
def config(
    overrides: OverridesArg = None,
    algo: PresetOpt = None,
    drop: DropOpt = None,
) -> None:
    """Print the fully composed config as YAML: the same composition `train` uses.

    Example: vapo-lab config --drop clip_higher loss.eps_low=0.1
    """
    from vapo_lab.config.compose import compose_config

    composed = compose_config(algo=algo, drop=drop or (), overrides=overrides or ())
    typer.echo(composed.to_yaml(), nl=False)
