"""`vapo-lab jobs` and `vapo-lab cancel`: a grid's cells, and stopping them."""

from __future__ import annotations

from vapo_lab.commands.output import (
    Col,
    GridArg,
    GridsDirOpt,
    cli_errors,
    print_table,
    stderr,
    stdout,
)


@cli_errors
def jobs(
    grid: GridArg = None,
    output_dir: GridsDirOpt = "runs",
) -> None:
    """List a grid's cells: their state, job id and tracking run id.

    A state is pending, running step k, finished, or failed with the error.

    Example: vapo-lab jobs
    """
    from vapo_lab.launch.actions import jobs_table

    path, rows = jobs_table(
        output_dir, grid, log=lambda m: stderr.print(m, highlight=False, markup=False)
    )
    cols = (
        Col("cell", typed=True),
        Col("state"),
        Col("job id", typed=True),
        Col("tracking run id", typed=True),
    )
    print_table(
        f"grid {path.name} ({path})",
        cols,
        [(r["cell"], r["state"], r["job_id"], r["run_id"]) for r in rows],
    )


@cli_errors
def cancel(
    grid: GridArg = None,
    output_dir: GridsDirOpt = "runs",
) -> None:
    """Cancel a grid's queued and running cells.

    Slurm cells get scancel, local and Ray cells on this host SIGTERM. Finished cells and
    checkpoints are kept: submitting the grid again resumes the rest.

    Example: vapo-lab cancel
    """
    from vapo_lab.launch.actions import cancel as cancel_grid

    path, done = cancel_grid(output_dir, grid)
    stdout.print(
        "\n".join(done) if done else f"nothing running in grid {path.name}", highlight=False
    )
