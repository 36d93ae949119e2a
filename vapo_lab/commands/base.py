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
    """Pre-train the tiny base model for this config and print its held-out accuracy by digit count.

    The model is cached, and `train` builds it on first use too. The package ships the models of
    the default config and of scale=cpu-long: for those, without --force, the shipped model is
    shown (unless this folder's cache has one) and no build runs.

    Example: vapo-lab base build task.options.max_digits=20 +model.base.steps=400
    """
    from vapo_lab.basemodel import build_base_for
    from vapo_lab.commands.progress import build_progress
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.preflight import require_writable
    from vapo_lab.config.schema import typed
    from vapo_lab.integrity import CACHE_DIR

    cfg = typed(compose_config(overrides=overrides or ()).cfg)
    require_writable(
        CACHE_DIR / "base",
        f"the base-model cache {CACHE_DIR / 'base'}",
        "run vapo-lab from a writable folder",
    )
    progress = build_progress(quiet)
    base = build_base_for(cfg.model, cfg.task, progress, force=force, threads=cfg.trainer.threads)
    m = base.metrics
    buckets = list(m["accuracy"]["t1"])
    cols = [Col("held-out accuracy")] + [
        Col("all digits" if b == "all" else f"{b} digits", justify="right") for b in buckets
    ]
    rows = [
        (label, *(f"{100 * m['accuracy'][mode][b]:.1f}%" for b in buckets))
        for mode, label in (("t1", "temperature 1"), ("greedy", "greedy"))
    ]
    where = "(shipped) " if base.shipped else "(cached) " if base.cached else ""
    print_table(f"base model {where}{base.path}", cols, rows)
    stdout.print(
        f"{m['n_params']:,} parameters; responses {m['response_tokens']['min']}-"
        f"{m['response_tokens']['max']} tokens; final loss {m['final_loss']}; "
        f"built in {m.get('build_seconds', m['train_seconds'] + m['eval_seconds'])} s",
        highlight=False,
    )


@cli_errors
def base_ship(overrides: OverridesArg = None) -> None:
    """Copy this folder's cached models of a config into the package's shipped entries.

    The base model, reward model and pretrained critic go to vapo_lab/shipped/, so that a fresh
    folder's first run loads them instead of building them. For maintainers, from an editable
    install of a source checkout; build the entries here first with `vapo-lab train` and the same
    overrides, then commit vapo_lab/shipped/.

    Example: vapo-lab train trainer.total_steps=1 && vapo-lab base ship
    """
    from vapo_lab.basemodel.build import base_config, base_options_for, config_hash
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.preflight import require_writable
    from vapo_lab.config.schema import typed
    from vapo_lab.errors import ConfigError
    from vapo_lab.integrity import CACHE_DIR, SHIPPED_DIR, ship_entry
    from vapo_lab.trainer.caches import critic_cache_keys

    cfg = typed(compose_config(overrides=overrides or ()).cfg)
    base_key = config_hash(base_config(**base_options_for(cfg.model, cfg.task)))
    entries = {"base": base_key, **critic_cache_keys(base_key, cfg)}
    # an entry only the package has (already shipped, e.g. the base model a run loaded) stays
    already = {
        kind
        for kind, key in entries.items()
        if not (CACHE_DIR / kind / key).is_dir() and (SHIPPED_DIR / kind / key).is_dir()
    }
    missing = [
        f"{kind}/{key}"
        for kind, key in entries.items()
        if kind not in already and not (CACHE_DIR / kind / key).is_dir()
    ]
    if missing:
        words = " ".join(overrides or ())
        raise ConfigError(
            f"this folder's {CACHE_DIR} has no {', '.join(missing)} for this config: build them "
            f"here first with `vapo-lab train {words}`".rstrip()
            + ", then ship"
        )
    require_writable(
        SHIPPED_DIR,
        f"the package's shipped entries {SHIPPED_DIR}",
        "ship from an editable install of a source checkout (pip install -e .)",
    )
    rows = [(kind, f"{SHIPPED_DIR / kind / entries[kind]} (shipped already)") for kind in already]
    for kind, key in entries.items():
        if kind in already:
            continue
        try:
            rows.append((kind, str(ship_entry(CACHE_DIR / kind / key, SHIPPED_DIR / kind))))
        except ValueError as e:
            raise ConfigError(
                f"{e}: rebuild it (delete {CACHE_DIR / kind / key} and rerun vapo-lab train)"
            ) from None
    print_table("shipped (commit vapo_lab/shipped/)", [Col("entry"), Col("folder")], rows)
