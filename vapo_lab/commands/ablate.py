"""`vapo-lab ablate`: VAPO without given components (one run or a grid), or Table 1's grid."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from vapo_lab.commands.output import OverridesArg, cli_errors
from vapo_lab.commands.sweep import DryRunOpt, LauncherOpt, WaitOpt, run_grid_command
from vapo_lab.commands.train import run_training
from vapo_lab.errors import ConfigError


@cli_errors
def ablate(
    overrides: OverridesArg = None,
    drop: Annotated[
        Optional[list[str]],
        typer.Option(help="Component to turn off (repeatable), e.g. --drop clip_higher."),
    ] = None,
    table1: Annotated[
        bool,
        typer.Option(
            "--table1",
            help="The whole Table 1 grid (experiments/table1.yaml): "
            "PPO, DAPO, VAPO and VAPO without each component.",
        ),
    ] = False,
    seeds: Annotated[
        Optional[int], typer.Option(help="Seeds 0..N-1 of every cell (a grid).")
    ] = None,
    launcher: LauncherOpt = None,
    dry_run: DryRunOpt = False,
    wait: WaitOpt = True,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar (single run).")] = False,
) -> None:
    """Train VAPO without the given components (one row of Table 1), or the whole Table 1 grid.

    Examples: vapo-lab ablate --drop clip_higher seed=2 ;
    vapo-lab ablate --table1 --seeds 3 --launcher slurm launcher.slurm.partition=gpu
    """
    from vapo_lab.launch.grid import check_seeds, drop_grid, load_grid

    if seeds is not None:
        check_seeds(seeds)
    if table1 and drop:
        raise ConfigError("--table1 already holds every --drop variant: give one or the other")
    if not table1 and not drop:
        raise ConfigError(
            "give --drop NAME (repeatable) for one variant, or --table1 for the whole grid"
        )
    if not table1 and seeds is None and launcher is None and not dry_run:
        # one run, here, with a progress bar
        run_training("vapo", drop or [], overrides or [], quiet)
        return
    grid = load_grid("table1", seeds=seeds) if table1 else drop_grid(drop or [], seeds=seeds or 1)
    run_grid_command(grid, overrides or [], launcher, dry_run, wait)
