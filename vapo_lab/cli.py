"""The `vapo-lab` command line: parse, compose the config, call one library function, print.

Only this module prints or exits. Library code raises ``VapoLabError`` subclasses; a command
prints their message (one line per problem) and exits 1, or shows the traceback with ``--debug``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from vapo_lab import __version__
from vapo_lab.errors import ConfigError, VapoLabError

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    help="vapo-lab: reproduce, ablate and extend VAPO (value-model PPO for long chain-of-thought RL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Speed benchmarks that print ratios against a reference.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
base_app = typer.Typer(help="The embedded default's pre-trained base model.", no_args_is_help=True)
app.add_typer(base_app, name="base")

_state = {"debug": False}
_out = Console()
_err = Console(stderr=True)

OverridesArg = Annotated[
    Optional[list[str]],
    typer.Argument(help="Hydra overrides, e.g. loss.eps_low=0.1 scale=paper clip_higher=off.",
                   show_default=False),
]


def _cli_errors(fn: F) -> F:
    """Wraps a command so a VapoLabError prints as one line per problem and exits 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except VapoLabError as e:
            if _state["debug"]:
                raise
            for line in str(e).splitlines() or [type(e).__name__]:
                _err.print(f"[bold red]error:[/] {line}", highlight=False, markup=True, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vapo-lab {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """vapo-lab: VAPO, PPO, DAPO and GRPO with every VAPO component a config toggle."""
    _state["debug"] = debug
    _quiet_libraries()


def _quiet_libraries() -> None:
    """Silences per-file progress bars and advisory warnings of transformers / huggingface_hub."""
    import os

    # environment variables, read when transformers is first imported (later, and only by the
    # commands that need it); an import here would slow every command down
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


@app.command()
@_cli_errors
def components() -> None:
    """List the seven VAPO components: what each does, its keys (on -> off) and Table 1 without it.

    Example: vapo-lab components
    """
    from vapo_lab.components import COMPONENTS, settings

    table = Table(title="The seven VAPO components (Table 1: VAPO = 60, vanilla PPO = 5, DAPO = 50)",
                  show_lines=True)
    table.add_column("name", style="bold")
    table.add_column("what it does")
    table.add_column("keys: on -> off")
    table.add_column("paper", justify="center")
    table.add_column("Table 1\nwithout it", justify="right")
    for c in COMPONENTS:
        keys = "\n".join(f"{k}: {_show(on)} -> {_show(off)}" for k, (on, off) in settings(c).items())
        table.add_row(c.name, c.summary, keys, f"{c.paper_section}\n({c.origin})", f"{c.table1_without:g}")
    _out.print(table)


def _show(value: Any) -> str:
    """Returns a config value as the user would type it (interpolations shown as '= key')."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
        return f"= {value[2:-1]}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


@app.command()
@_cli_errors
def config(
    overrides: OverridesArg = None,
    algo: Annotated[Optional[str], typer.Option(help="Preset: vapo (default), ppo, dapo or grpo.")] = None,
    drop: Annotated[Optional[list[str]], typer.Option(
        help="Turn off a component of the preset (repeatable), e.g. --drop clip_higher.")] = None,
) -> None:
    """Print the fully composed config as YAML: the same composition `train` uses.

    Example: vapo-lab config --drop clip_higher loss.eps_low=0.1
    """
    from vapo_lab.config.compose import compose_config

    composed = compose_config(algo=algo, drop=drop or (), overrides=overrides or ())
    typer.echo(composed.to_yaml(), nl=False)


def _train(algo: str | None, drop: list[str], overrides: list[str], quiet: bool) -> None:
    """Composes the config, trains with a progress bar, prints the closing summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from vapo_lab.config.compose import compose_config
    from vapo_lab.trainer.run import Run

    from vapo_lab.trainer.run import resume_config

    composed = compose_config(algo=algo, drop=drop, overrides=overrides)
    cfg, choices = composed.cfg, composed.choices
    if cfg.resume:
        others = [o for o in overrides if not o.startswith("resume=")]
        if others or algo or drop:
            raise ConfigError(f"resume={cfg.resume} continues a run with its saved config: drop {others or '--algo/--drop'}")
        cfg, choices = resume_config(cfg.resume)
    command = "vapo-lab " + " ".join(sys.argv[1:])
    run = Run(cfg, choices, progress=not quiet, log=lambda msg: _err.print(msg, highlight=False),
              command=command)
    _err.print(f"run {run.run_dir} (tracking run {run.run_id}, {getattr(run.tracker, 'uri', 'none')})",
               highlight=False)
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[stats]}")]
    total = int(cfg.trainer.total_steps)
    with Progress(*columns, console=_err, disable=quiet, transient=False) as bar:
        task = bar.add_task(f"{cfg.algo.name}", total=total, completed=run.step, stats="")

        def on_step(step: int, m: dict[str, float]) -> None:
            stats = (f"reward {m.get('rollout/reward', float('nan')):.3f} "
                     f"acc {m.get('rollout/accuracy', float('nan')):.3f} "
                     f"len {m.get('rollout/response_length', float('nan')):.0f}")
            bar.update(task, completed=step, stats=stats)

        result = run.run(on_step)
    k = int(cfg.rollout.eval_samples)
    fmt = lambda v: "n/a" if v is None else f"{100 * v:.1f}"  # noqa: E731
    _out.print(f"run id      {result.run_id}\n"
               f"run dir     {result.run_dir}\n"
               f"eval avg@{k}  base {fmt(result.base_eval)}  final {fmt(result.final_eval)}  "
               f"best {fmt(result.best_eval)}  (held-out, x100)\n"
               f"checkpoint  {result.checkpoint}", highlight=False)


@app.command()
@_cli_errors
def train(
    overrides: OverridesArg = None,
    algo: Annotated[Optional[str], typer.Option(help="Preset: vapo (default), ppo, dapo or grpo.")] = None,
    drop: Annotated[Optional[list[str]], typer.Option(help="Turn off a component of the preset (repeatable).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train one run (default: VAPO on the embedded default) and print where it went.

    Example: vapo-lab train --algo dapo trainer.total_steps=20 seed=1
    """
    _train(algo, drop or [], overrides or [], quiet)


@app.command()
@_cli_errors
def ablate(
    drop: Annotated[list[str], typer.Option(help="Component to turn off (repeatable), e.g. --drop clip_higher.")],
    overrides: OverridesArg = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train VAPO without the given components: one row of Table 1.

    Example: vapo-lab ablate --drop clip_higher seed=2
    """
    _train("vapo", drop, overrides or [], quiet)


@base_app.command("build")
@_cli_errors
def base_build(
    overrides: OverridesArg = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when cached.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Pre-train the tiny base model for this config (cached; `train` builds it on first use too)
    and print its held-out accuracy by digit count.

    Example: vapo-lab base build task.options.max_digits=20 +model.base.steps=400
    """
    from vapo_lab.config.compose import compose_config
    from vapo_lab.trainer.run import build_base_for

    cfg = compose_config(overrides=overrides or ()).cfg
    base = build_base_for(cfg, progress=not quiet, force=force)
    m = base.metrics
    table = Table(title=f"base model {'(cached) ' if base.cached else ''}{base.path}")
    buckets = list(m["accuracy"]["t1"])
    table.add_column("held-out accuracy")
    for b in buckets:
        table.add_column("all digits" if b == "all" else f"{b} digits", justify="right")
    for mode, label in (("t1", "temperature 1"), ("greedy", "greedy")):
        table.add_row(label, *(f"{100 * m['accuracy'][mode][b]:.1f}%" for b in buckets))
    _out.print(table)
    _out.print(f"{m['n_params']:,} parameters; responses {m['response_tokens']['min']}-"
               f"{m['response_tokens']['max']} tokens; final loss {m['final_loss']}; "
               f"built in {m.get('build_seconds', m['train_seconds'] + m['eval_seconds'])} s", highlight=False)


@bench_app.command("gae")
@_cli_errors
def bench_gae(
    shapes: Annotated[str, typer.Option(help="Comma-separated BxT shapes.")] = "512x4096,8192x1024",
    repeats: Annotated[int, typer.Option(help="Timed repeats per shape (median reported).")] = 5,
    threads: Annotated[int, typer.Option(
        help="torch CPU threads for both implementations. 1 by default: the loop cannot use a second "
             "core, and multi-threaded ops stall when another process holds a core.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the random batch.")] = 0,
) -> None:
    """Time the vectorised GAE against a reverse-time loop over steps; print both and the ratio.

    Example: vapo-lab bench gae --shapes 512x4096 --repeats 3
    """
    from vapo_lab.bench.gae import format_gae_benchmark, parse_shapes, run_gae_benchmark

    rows = run_gae_benchmark(shapes=parse_shapes(shapes), repeats=repeats, seed=seed, threads=threads)
    typer.echo(format_gae_benchmark(rows))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
