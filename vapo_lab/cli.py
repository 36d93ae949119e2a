"""The `vapo-lab` command line: the Typer app, its global options, and where each command lives.

Each command is a thin function in ``vapo_lab.commands.<noun>`` (parse, compose, call one library
function, print); this module only assembles them.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from vapo_lab import __version__
from vapo_lab.commands import (
    ablate,
    base,
    bench,
    describe,
    evaluate,
    jobs,
    plan,
    report,
    server,
    sweep,
    train,
)
from vapo_lab.commands.output import state

app = typer.Typer(
    help="vapo-lab: reproduce, ablate and extend VAPO "
    "(value-model PPO for long chain-of-thought RL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(
    help="Speed benchmarks that print ratios against a reference.", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")
base_app = typer.Typer(help="The embedded default's pre-trained base model.", no_args_is_help=True)
app.add_typer(base_app, name="base")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vapo-lab {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show full tracebacks instead of one-line errors.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """vapo-lab: VAPO, PPO, DAPO and GRPO with every VAPO component a config toggle."""
    state["debug"] = debug
    _quiet_libraries()


def _quiet_libraries() -> None:
    """Silences per-file progress bars and advisory warnings of transformers / huggingface_hub, and
    MLflow's informational lines."""
    # environment variables, read when transformers is first imported (later, and only by the
    # commands that need it); an import here would slow every command down
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # not "Creating initial MLflow database tables..."
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


# in the order `vapo-lab --help` lists them
app.command()(describe.components)
app.command()(describe.config)
app.command()(plan.plan)
app.command()(train.train)
app.command()(ablate.ablate)
app.command()(sweep.sweep)
app.command()(jobs.jobs)
app.command()(jobs.cancel)
app.command()(server.server)
app.command()(report.report)
base_app.command("build")(base.base_build)
base_app.command("ship")(base.base_ship)
bench_app.command("gae")(bench.bench_gae)
app.command("eval")(evaluate.eval_)
bench_app.command("generate")(bench.bench_generate)
bench_app.command("update")(bench.bench_update)
bench_app.command("trl")(bench.bench_trl)
bench_app.command("scale")(bench.bench_scale)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
