"""`vapo-lab train`: one run, with a progress bar, then where it went."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from vapo_lab.commands.output import OverridesArg, cli_errors, peak_rss_mib, stderr, stdout
from vapo_lab.errors import ConfigError


def run_training(algo: str | None, drop: list[str], overrides: list[str], quiet: bool) -> None:
    """Composes the config, trains with a progress bar (plain lines in a log), prints the closing summary."""
    from rich.progress import TextColumn

    from vapo_lab.commands.progress import build_progress, default_columns, progress_bar
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.preflight import check_run
    from vapo_lab.integrity import CACHE_DIR
    from vapo_lab.runs.folder import resume_config
    from vapo_lab.trainer.run import Run

    composed = compose_config(algo=algo, drop=drop, overrides=overrides)
    cfg, choices = composed.cfg, composed.choices
    if cfg.resume:
        others = [o for o in overrides if not o.startswith("resume=")]
        if others or algo or drop:
            raise ConfigError(f"resume={cfg.resume} continues a run with its saved config: drop {others or '--algo/--drop'}")
        cfg, choices = resume_config(cfg.resume)
    check_run(cfg, CACHE_DIR)  # folders and tracking store, before the base build
    command = "vapo-lab " + " ".join(sys.argv[1:])
    sigterm_interrupts()
    run = Run(cfg, choices, progress=build_progress(quiet), log=lambda msg: stderr.print(msg, highlight=False),
              command=command)
    stderr.print(f"run {run.run_dir} (tracking run {run.run_id}, {getattr(run.tracker, 'uri', 'none')})",
              highlight=False)
    total = int(cfg.trainer.total_steps)
    with progress_bar(not quiet, stderr, *default_columns(), TextColumn("{task.fields[stats]}")) as bar:
        task = bar.add_task(f"{cfg.algo.name}", total=total, completed=run.step, stats="") if bar else None

        def on_step(step: int, m: dict[str, float]) -> None:
            if bar is None:
                return
            stats = (f"reward {m.get('rollout/reward', float('nan')):.3f} "
                     f"acc {m.get('rollout/accuracy', float('nan')):.3f} "
                     f"len {m.get('rollout/response_length', float('nan')):.0f}")
            bar.update(task, completed=step, stats=stats)

        result = run.run(on_step)
    k = int(cfg.rollout.eval_samples)
    fmt = lambda v: "n/a" if v is None else f"{100 * v:.1f}"  # noqa: E731
    stdout.print(f"run id      {result.run_id}\n"
              f"run dir     {result.run_dir}\n"
              f"eval avg@{k}  base {fmt(result.base_eval)}  final {fmt(result.final_eval)}  "
              f"best {fmt(result.best_eval)}  (held-out, x100)\n"
              f"checkpoint  {result.checkpoint}\n"
              f"peak RSS    {peak_rss_mib():.0f} MiB", highlight=False)


def sigterm_interrupts() -> None:
    """Makes SIGTERM (``kill``, a container stop, Slurm's scancel) end the run as Ctrl-C does: the
    run is marked KILLED in MLflow and says so in its folder, instead of staying RUNNING."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


@cli_errors
def train(
    overrides: OverridesArg = None,
    algo: Annotated[Optional[str], typer.Option(help="Preset: vapo (default), ppo, dapo or grpo.")] = None,
    drop: Annotated[Optional[list[str]], typer.Option(help="Turn off a component of the preset (repeatable).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train one run (default: VAPO on the embedded default) and print where it went.

    Example: vapo-lab train --algo dapo trainer.total_steps=20 seed=1
    """
    run_training(algo, drop or [], overrides or [], quiet)
