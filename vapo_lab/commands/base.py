"""`vapo-lab base build`: the embedded default's base model, and its accuracy."""

from __future__ import annotations

from typing import Annotated

import typer

from vapo_lab.commands.output import Col, OverridesArg, cli_errors, print_table, stdout


@cli_errors
def base_build(
    overrides: OverridesArg = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when cached.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    ship: Annotated[bool, typer.Option(
        "--ship", help="Copy the built model into the package's shipped models (vapo_lab/basemodel/shipped/; "
                       "for maintainers, from a source checkout), so that a fresh folder loads it without a build."
    )] = False,
) -> None:
    """Pre-train the tiny base model for this config (cached; `train` builds it on first use too)
    and print its held-out accuracy by digit count.

    The package ships the models of the default config and of scale=cpu-long: for those, without
    --force, the shipped model is loaded (unless this folder's cache has one) and no build runs.

    Example: vapo-lab base build task.options.max_digits=20 +model.base.steps=400
    """
    from vapo_lab.basemodel import build_base_for
    from vapo_lab.basemodel.build import SHIPPED_DIR, ship_base
    from vapo_lab.commands.progress import build_progress
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.preflight import require_writable
    from vapo_lab.integrity import CACHE_DIR

    cfg = compose_config(overrides=overrides or ()).cfg
    require_writable(CACHE_DIR / "base", f"the base-model cache {CACHE_DIR / 'base'}",
                     "run vapo-lab from a writable folder")
    if ship:
        require_writable(SHIPPED_DIR, f"the package's shipped models {SHIPPED_DIR}",
                         "ship from an editable install of a source checkout (pip install -e .)")
    base = build_base_for(cfg, progress=build_progress(quiet), force=force)
    m = base.metrics
    buckets = list(m["accuracy"]["t1"])
    cols = [Col("held-out accuracy")] + [Col("all digits" if b == "all" else f"{b} digits", justify="right")
                                          for b in buckets]
    rows = [(label, *(f"{100 * m['accuracy'][mode][b]:.1f}%" for b in buckets))
            for mode, label in (("t1", "temperature 1"), ("greedy", "greedy"))]
    where = "(shipped) " if base.shipped else "(cached) " if base.cached else ""
    print_table(f"base model {where}{base.path}", cols, rows)
    stdout.print(f"{m['n_params']:,} parameters; responses {m['response_tokens']['min']}-"
               f"{m['response_tokens']['max']} tokens; final loss {m['final_loss']}; "
               f"built in {m.get('build_seconds', m['train_seconds'] + m['eval_seconds'])} s", highlight=False)
    if ship:
        stdout.print(f"shipped: {ship_base(base)} (commit it; package data vapo_lab/basemodel/shipped/)",
                     highlight=False)
