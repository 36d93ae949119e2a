"""`vapo-lab sweep FILE`: a grid file's cells x sweep points x seeds, on a launcher."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from vapo_lab.commands.output import OverridesArg, cli_errors, stderr, stdout

LauncherOpt = Annotated[
    Optional[str],
    typer.Option(
        help="Where the runs go: local (this machine's processes), ray, "
        "or slurm (a job array via submitit). "
        "Settings: launcher.<name>.* overrides (conf/launcher/)."
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option("--dry-run", help="Print the cells (and Slurm's sbatch scripts); submit nothing."),
]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait", help="Slurm: wait until every cell ends (local and Ray always wait)."
    ),
]


def run_grid_command(
    grid: Any, overrides: list[str], launcher: str | None, dry_run: bool, wait: bool
) -> None:
    from vapo_lab.launch.actions import run_grid

    run_grid(
        grid,
        overrides,
        launcher,
        dry_run,
        wait,
        log=lambda m: stderr.print(m, highlight=False),
        out=lambda m: stdout.print(m, highlight=False, markup=False, soft_wrap=True),
    )


@cli_errors
def sweep(
    grid_file: Annotated[
        str,
        typer.Argument(
            help="A grid YAML file (see experiments/), or a shipped grid's name: table1, lr_sweep."
        ),
    ],
    overrides: OverridesArg = None,
    seeds: Annotated[
        Optional[int], typer.Option(help="Seeds 0..N-1 of every cell, instead of the file's.")
    ] = None,
    launcher: LauncherOpt = None,
    dry_run: DryRunOpt = False,
    wait: WaitOpt = True,
) -> None:
    """Run a grid file: its cells x sweep points x seeds, skipping runs already finished.

    Example: vapo-lab sweep experiments/lr_sweep.yaml --launcher ray trainer.total_steps=20
    """
    from vapo_lab.launch.grid import load_grid

    run_grid_command(load_grid(grid_file, seeds=seeds), overrides or [], launcher, dry_run, wait)
