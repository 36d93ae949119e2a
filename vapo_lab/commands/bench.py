"""`vapo-lab bench`: speed benchmarks that print ratios against a reference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from vapo_lab.commands.output import OverridesArg, cli_errors


@cli_errors
def bench_gae(
    shapes: Annotated[str, typer.Option(help="Comma-separated BxT shapes.")] = "512x4096,8192x1024",
    repeats: Annotated[
        int, typer.Option(help="Timed interleaved rounds per shape (medians reported).")
    ] = 5,
    threads: Annotated[
        int,
        typer.Option(
            help="torch CPU threads for every implementation. "
            "1 by default: the loop cannot use a second core, "
            "and multi-threaded ops stall when another process holds a core."
        ),
    ] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the random batch.")] = 0,
) -> None:
    """Time GAE against a reverse-time loop and the memory floor; print the times and the ratios.

    Both of GAE's implementations are timed: its compiled CPU scan and its torch scan.

    Example: vapo-lab bench gae --shapes 512x4096 --repeats 3
    """
    from vapo_lab.bench.gae import format_gae_benchmark, parse_shapes, run_gae_benchmark

    rows = run_gae_benchmark(
        shapes=parse_shapes(shapes), repeats=repeats, seed=seed, threads=threads
    )
    typer.echo(format_gae_benchmark(rows))


@cli_errors
def bench_update(
    repeats: Annotated[
        int, typer.Option(help="Interleaved repeats per path (median and range reported).")
    ] = 7,
    threads: Annotated[
        Optional[int], typer.Option(help="torch CPU threads (default: torch's).")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the sampled step and the mini-batch split.")
    ] = 0,
) -> None:
    """Time the packed training passes against the padded ones over one default step.

    Prints the ratios, the real-token share and how far the two paths' log-probs, values and
    gradients differ.

    Example: vapo-lab bench update --repeats 5 --threads 1
    """
    from vapo_lab.bench.update import format_update_benchmark, run_update_benchmark

    typer.echo(
        format_update_benchmark(
            run_update_benchmark(
                repeats=repeats,
                seed=seed,
                threads=threads,
                log=lambda text: typer.echo(text, err=True),
            )
        )
    )


@cli_errors
def bench_generate(
    prompts: Annotated[
        int, typer.Option(help="Prompts in the batch (the task's held-out split's first).")
    ] = 8,
    samples: Annotated[int, typer.Option(help="Samples per prompt; rows = prompts x samples.")] = 8,
    max_new_tokens: Annotated[
        int, typer.Option(help="New tokens per row, exactly (eos disabled in every engine).")
    ] = 128,
    repeats: Annotated[
        int,
        typer.Option(help="Timed runs per engine, interleaved round by round (median reported)."),
    ] = 3,
    threads: Annotated[int, typer.Option(help="torch CPU threads for every engine.")] = 1,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    device: Annotated[
        str, typer.Option(help="cpu (float32) or cuda (bfloat16), unless --dtype says.")
    ] = "cpu",
    dtype: Annotated[
        Optional[str],
        typer.Option(
            help="float32 or bfloat16 for every engine (default: by --device).", show_default=False
        ),
    ] = None,
    engines: Annotated[
        str,
        typer.Option(
            help="Comma-separated, in each round's order: builtin (the built-in sampler), "
            "vllm (vLLM in-process; needs its environment, scripts/vllm-env.sh), "
            "hf (HF generate)."
        ),
    ] = "builtin,hf",
    vllm_eager: Annotated[
        bool,
        typer.Option(
            help="vLLM without torch.compile (rollout.vllm.enforce_eager=true): a faster build."
        ),
    ] = False,
    arch: Annotated[
        Optional[str],
        typer.Option(
            help="A known shape at random init (e.g. Qwen2.5-0.5B) instead of the tiny model."
        ),
    ] = None,
    base: Annotated[
        bool,
        typer.Option(
            "--base",
            help="The embedded default's shipped base model instead of the random tiny one.",
        ),
    ] = False,
    grid: Annotated[
        bool,
        typer.Option(
            help="Run 32 and 128 rows (x 8 samples) at 128 and 512 new tokens, one table."
        ),
    ] = False,
    json_out: Annotated[
        Optional[str],
        typer.Option("--json", help="Also append each setting's result as a JSON line here."),
    ] = None,
) -> None:
    """Time the built-in sampler against Hugging Face generate (and vLLM); print the ratios.

    All sample from the same model, built once (vLLM: its own engine from the same weights, its
    build time printed apart); the engines' timed runs are interleaved round by round after a
    warm-up each. On cuda HF generate is timed eagerly, then with a static cache and
    torch.compile where they work (the output says which).

    Example: vapo-lab bench generate --prompts 8 --samples 8 --max-new-tokens 128;
    vapo-lab bench generate --engines builtin,vllm,hf --arch Qwen2.5-0.5B --prompts 4 --samples 4;
    vapo-lab bench generate --device cuda --arch Qwen2.5-0.5B --grid
    """
    import contextlib
    import tempfile

    from vapo_lab.bench.generate import (
        bench_model,
        build_vllm_engine,
        format_generate_benchmark,
        parse_engines,
        require_vllm_engine,
        run_generate_benchmark,
    )

    def show(result: dict) -> None:
        typer.echo(format_generate_benchmark(result))
        if json_out:  # each result as it comes: a run cut short keeps the ones done
            import json

            with open(json_out, "a", encoding="utf-8") as f:
                f.write(json.dumps(result, default=str) + "\n")

    chosen = parse_engines(engines)
    if "vllm" in chosen:
        require_vllm_engine()  # one line, before the model is built
    settings = (
        [(rows // samples, tokens) for rows in (32, 128) for tokens in (128, 512)]
        if grid
        else [(prompts, max_new_tokens)]
    )
    built = bench_model(device, arch, seed, base=base, dtype=dtype)
    with contextlib.ExitStack() as stack:
        vllm = None
        if "vllm" in chosen:  # built once, for the largest setting
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="vapo-bench-"))
            vllm = build_vllm_engine(built, folder, settings, samples, threads, seed, vllm_eager)
        for n_prompts, tokens in settings:
            show(
                run_generate_benchmark(
                    prompts=n_prompts,
                    samples=samples,
                    max_new_tokens=tokens,
                    repeats=repeats,
                    threads=threads,
                    seed=seed,
                    device=device,
                    arch=arch,
                    built=built,
                    partial=show,
                    engines=chosen,
                    vllm=vllm,
                    base=base,
                )
            )


@cli_errors
def bench_trl(
    steps: Annotated[int, typer.Option(help="Timed steps per side, interleaved step by step.")] = 8,
    warmup: Annotated[int, typer.Option(help="Untimed steps per side before timing.")] = 1,
    threads: Annotated[int, typer.Option(help="torch CPU threads of every side.")] = 2,
    part: Annotated[
        Optional[list[str]],
        typer.Option(
            help="ppo (vapo-lab PPO and VAPO vs TRL PPOTrainer) "
            "or grpo (vapo-lab GRPO vs TRL GRPOTrainer); "
            "repeat for both, the default.",
            show_default=False,
        ),
    ] = None,
    trl_python: Annotated[
        Optional[Path],
        typer.Option(
            help="Python of the trl==1.12.0 env (PPOTrainer). "
            "Default: .bench-venv/trl112/bin/python.",
            show_default=False,
        ),
    ] = None,
    trl_grpo_python: Annotated[
        Optional[Path],
        typer.Option(
            help="Python of the latest-TRL env (GRPOTrainer). "
            "Default: .bench-venv/trl-latest/bin/python.",
            show_default=False,
        ),
    ] = None,
    setup: Annotated[
        bool,
        typer.Option(
            "--setup",
            help="Create the TRL envs under .bench-venv/ (torch 2.13.0, then trl) and stop.",
        ),
    ] = False,
) -> None:
    """Time one RL step of vapo-lab and of TRL on CPU; print s/step, tokens/s and ratios.

    The two sides run interleaved, step by step. Tiny Qwen2 policy (~1.1M parameters), fp32,
    2 threads, 64 completions of <= 32 new tokens per step, one PPO epoch. Needs the TRL envs:
    create them once with --setup.

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
    result = run_trl_benchmark(
        steps=steps,
        warmup=warmup,
        parts=parts,
        trl_python=trl_python,
        trl_grpo_python=trl_grpo_python,
        spec=BenchSpec(threads=threads),
        log=progress,
    )
    typer.echo(format_trl_benchmark(result))


@cli_errors
def bench_scale(
    rounds: Annotated[
        int, typer.Option(help="Rounds; each runs every variant once, in rotating order.")
    ] = 5,
    steps: Annotated[
        int,
        typer.Option(help="Timed steps per run (after the warm-up; one profiled step follows)."),
    ] = 4,
    warmup: Annotated[int, typer.Option(help="Untimed steps per run first.")] = 1,
    threads: Annotated[
        Optional[int],
        typer.Option(
            help="CPU threads per variant, split among its ranks (at least 1 each). "
            "Default: every CPU this process may use. "
            "--threads 1: every rank 1 thread (1 core against 2; steadier on a loaded machine).",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Option(
            help="Also write every measurement as JSON here (rewritten after each run).",
            show_default=False,
        ),
    ] = None,
    overrides: OverridesArg = None,
) -> None:
    """Time the same training on 1 process and on 1 and 2 CPU ranks; print speeds and ratios.

    The variants: single (1 process), and fsdp over gloo on 1 and 2 ranks. Prints tokens/s,
    s/step, its phases, the share of the step in communication, and the 2-rank / 1-rank ratios.
    Runs the embedded default (or it with the overrides) as subprocesses, interleaved round by
    round. On a 2-core machine no speed-up is expected: the 2 ranks share the cores.

    Example: vapo-lab bench scale --rounds 5 --steps 4 --out scale.json
    """
    import json

    from vapo_lab.bench.scale import format_scale_benchmark, run_scale_benchmark, to_json

    def progress(text: str) -> None:
        typer.echo(text, err=True)

    def record(result: dict) -> None:
        if out is not None:
            out.write_text(json.dumps(to_json(result), indent=1) + "\n")

    result = run_scale_benchmark(
        rounds=rounds,
        steps=steps,
        warmup=warmup,
        threads=threads,
        overrides=overrides or [],
        log=progress,
        on_run=record,
    )
    record(result)
    typer.echo(format_scale_benchmark(result))
