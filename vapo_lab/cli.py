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
from vapo_lab.errors import VapoLabError

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    help="vapo-lab: reproduce, ablate and extend VAPO (value-model PPO for long chain-of-thought RL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Speed benchmarks that print ratios against a reference.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

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


@bench_app.command("gae")
@_cli_errors
def bench_gae(
    shapes: Annotated[str, typer.Option(help="Comma-separated BxT shapes.")] = "512x4096,8192x1024",
    repeats: Annotated[int, typer.Option(help="Timed repeats per shape (median reported).")] = 5,
    threads: Annotated[Optional[int], typer.Option(help="torch CPU threads (default: torch's).")] = None,
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
