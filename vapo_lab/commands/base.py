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
) -> None:
    """Pre-train the tiny base model for this config (cached; `train` builds it on first use too)
    and print its held-out accuracy by digit count.

    Example: vapo-lab base build task.options.max_digits=20 +model.base.steps=400
    """
    from vapo_lab.basemodel import build_base_for
    from vapo_lab.commands.progress import build_progress
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.preflight import require_writable
    from vapo_lab.integrity import CACHE_DIR

    cfg = compose_config(overrides=overrides or ()).cfg
    require_writable(CACHE_DIR / "base", f"the base-model cache {CACHE_DIR / 'base'}",
                     "run vapo-lab from a writable folder")
    base = build_base_for(cfg, progress=build_progress(quiet), force=force)
    m = base.metrics
    buckets = list(m["accuracy"]["t1"])
    cols = [Col("held-out accuracy")] + [Col("all digits" if b == "all" else f"{b} digits", justify="right")
                                          for b in buckets]
    rows = [(label, *(f"{100 * m['accuracy'][mode][b]:.1f}%" for b in buckets))
            for mode, label in (("t1", "temperature 1"), ("greedy", "greedy"))]
    print_table(f"base model {'(cached) ' if base.cached else ''}{base.path}", cols, rows)
    stdout.print(f"{m['n_params']:,} parameters; responses {m['response_tokens']['min']}-"
               f"{m['response_tokens']['max']} tokens; final loss {m['final_loss']}; "
               f"built in {m.get('build_seconds', m['train_seconds'] + m['eval_seconds'])} s", highlight=False)
