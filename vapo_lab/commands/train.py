"""`vapo-lab train`: one run, with a progress bar, then where it went."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from vapo_lab.commands.output import (
    DropOpt,
    OverridesArg,
    PresetOpt,
    cli_errors,
    peak_rss_mib,
    stderr,
    stdout,
)


def run_training(algo: str | None, drop: list[str], overrides: list[str], quiet: bool) -> None:
    """Composes the config, trains under a progress bar (lines in a log), prints the summary."""
    from vapo_lab.commands.progress import build_progress
    from vapo_lab.config.preflight import check_run
    from vapo_lab.config.train import train_config
    from vapo_lab.distributed.world import env_world, world_size
    from vapo_lab.integrity import CACHE_DIR
    from vapo_lab.stop import stop_on_signals
    from vapo_lab.trainer.trainer import running

    cfg, choices = train_config(algo, drop, overrides)
    check_run(cfg, CACHE_DIR)  # folders and tracking store, before the base build
    command = "vapo-lab " + " ".join(sys.argv[1:])
    if world_size(cfg.trainer) > 1 and env_world() is None:  # its ranks, through torchrun
        from vapo_lab.launch.ranks import run_ranks

        args = [*([f"--algo={algo}"] if algo else []), *[f"--drop={d}" for d in drop], *overrides]
        print_result(cfg, run_ranks(cfg, args, command, quiet))
        return
    log = lambda msg: stderr.print(msg, highlight=False, markup=False)  # noqa: E731
    progress = build_progress(quiet)
    with stop_on_signals():  # SIGTERM and Ctrl-C: stop after the step in progress, marked killed
        with running(cfg, choices, progress=progress, log=log, command=command) as trainer:
            result = _train(cfg, trainer, quiet)
    print_result(cfg, result.summary())


def _train(cfg: Any, trainer: Any, quiet: bool) -> Any:
    """Returns the TrainResult of training ``trainer`` to the end (a progress bar unless quiet)."""
    from rich.progress import TextColumn

    from vapo_lab.commands.progress import default_columns, progress_bar

    stderr.print(
        f"run {trainer.run_dir} (tracking run {trainer.run_id}, "
        f"{getattr(trainer.tracker, 'uri', 'none')})",
        highlight=False,
        markup=False,
    )
    total = int(cfg.trainer.total_steps)
    with progress_bar(
        not quiet, stderr, *default_columns(), TextColumn("{task.fields[stats]}")
    ) as bar:
        task = (
            bar.add_task(f"{cfg.algo.name}", total=total, completed=trainer.step, stats="")
            if bar
            else None
        )

        def on_step(step: int, m: dict[str, float]) -> None:
            if bar is None:
                return
            stats = (
                f"reward {m.get('rollout/reward', float('nan')):.3f} "
                f"acc {m.get('rollout/accuracy', float('nan')):.3f} "
                f"len {m.get('rollout/response_length', float('nan')):.0f}"
            )
            bar.update(task, completed=step, stats=stats)

        return trainer.train(on_step)


def print_result(cfg: Any, r: dict[str, Any]) -> None:
    """Prints the closing summary of a run (``TrainResult.summary()``)."""
    k = int(cfg.rollout.eval_samples)
    fmt = lambda v: "n/a" if v is None else f"{100 * v:.1f}"  # noqa: E731
    stdout.print(
        f"run id      {r['run_id']}\n"
        f"run dir     {r['run_dir']}\n"
        f"eval avg@{k}  base {fmt(r['base_eval'])}  final {fmt(r['final_eval'])}  "
        f"best {fmt(r['best_eval'])}  (held-out, x100)\n"
        f"checkpoint  {r['checkpoint']}\n"
        f"peak RSS    {r.get('peak_rss_mib') or peak_rss_mib():.0f} MiB",
        highlight=False,
        markup=False,
    )
    stages = r.get("stages") or {}
    if "perf/gen_tokens_per_s_per_device" in stages:
        mfu = stages.get("perf/mfu")
        stdout.print(
            f"stages      tokens/s a device, mean over steps: generation "
            f"{stages['perf/gen_tokens_per_s_per_device']:,.0f}, log-prob/value passes "
            f"{stages['perf/pass_tokens_per_s_per_device']:,.0f}, training "
            f"{stages['perf/train_tokens_per_s_per_device']:,.0f}"
            + (f" (MFU {100 * mfu:.1f}%)" if mfu is not None else " (MFU: no GPU peak known)")
            + f"; weight push {stages['time/push_s']:.3f} s",
            highlight=False,
            markup=False,
        )


@cli_errors
def train(
    overrides: OverridesArg = None,
    algo: PresetOpt = None,
    drop: DropOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train one run (default: VAPO on the embedded default) and print where it went.

    Example: vapo-lab train --algo dapo trainer.total_steps=20 seed=1
    """
    run_training(algo, drop or [], overrides or [], quiet)
