"""The ``vapo-lab bench trl`` command: vapo-lab's trainer against TRL's PPOTrainer and GRPOTrainer.

Registered in ``vapo_lab/cli.py`` as ``bench_app.command("trl")(_cli_errors(bench_trl))``; the
benchmark itself is :mod:`vapo_lab.bench.trl`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def bench_trl(
    steps: Annotated[int, typer.Option(help="Timed steps per side, interleaved step by step.")] = 8,
    warmup: Annotated[int, typer.Option(help="Untimed steps per side before timing.")] = 1,
    threads: Annotated[int, typer.Option(help="torch CPU threads of every side.")] = 2,
    part: Annotated[Optional[list[str]], typer.Option(
        help="ppo (vapo-lab PPO and VAPO vs TRL PPOTrainer) or grpo (vapo-lab GRPO vs TRL GRPOTrainer); "
             "repeat for both, the default.", show_default=False)] = None,
    trl_python: Annotated[Optional[Path], typer.Option(
        help="Python of the trl==1.12.0 env (PPOTrainer). Default: .bench-venv/trl112/bin/python.",
        show_default=False)] = None,
    trl_grpo_python: Annotated[Optional[Path], typer.Option(
        help="Python of the latest-TRL env (GRPOTrainer). Default: .bench-venv/trl-latest/bin/python.",
        show_default=False)] = None,
    setup: Annotated[bool, typer.Option(
        "--setup", help="Create the TRL envs under .bench-venv/ (torch 2.13.0, then trl) and stop.")] = False,
) -> None:
    """Time one RL step of vapo-lab and of TRL on CPU, interleaved; print s/step, tokens/s and ratios.

    Tiny Qwen2 policy (~1.1M parameters), fp32, 2 threads, 64 completions of <= 32 new tokens per
    step, one PPO epoch. Needs the TRL envs: create them once with --setup.

    Example: vapo-lab bench trl --steps 4 --part grpo
    """
    from vapo_lab.bench.trl.envs import setup_trl_envs
    from vapo_lab.bench.trl.run import format_trl_benchmark, run_trl_benchmark
    from vapo_lab.bench.trl.spec import BenchSpec

    def progress(text: str) -> None:
        typer.echo(text, err=True)

    parts = part or ["ppo", "grpo"]
    if setup:
        for python in setup_trl_envs(parts, log=progress):
            typer.echo(f"ready: {python}")
        return
    result = run_trl_benchmark(steps=steps, warmup=warmup, parts=parts, trl_python=trl_python,
                               trl_grpo_python=trl_grpo_python, spec=BenchSpec(threads=threads), log=progress)
    typer.echo(format_trl_benchmark(result))
