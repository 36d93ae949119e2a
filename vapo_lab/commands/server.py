"""`vapo-lab server`: an MLflow tracking server for grids on Slurm or Ray."""

from __future__ import annotations

from typing import Annotated

import typer

from vapo_lab.commands.output import cli_errors, stderr


@cli_errors
def server(
    host: Annotated[
        str,
        typer.Option(
            help="Interface to bind; 127.0.0.1 keeps it private to this machine. "
            "Use 0.0.0.0 only on a trusted network (MLflow has no auth)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 5000,
    store: Annotated[
        str, typer.Option(help="Folder for the server's database and artifacts.")
    ] = "mlflow-server",
) -> None:
    """Run an MLflow tracking server for grids on Slurm or Ray.

    Runs log to it with tracking.uri=http://HOST:PORT.

    Example: vapo-lab server --port 5000
    """
    from vapo_lab.track.server import serve_forever

    serve_forever(host, port, store, log=lambda m: stderr.print(m, highlight=False))
