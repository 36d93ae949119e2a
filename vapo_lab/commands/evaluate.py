"""`vapo-lab eval`: sample and grade a model on a benchmark; avg@N, pass@k, maj@N."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from vapo_lab.commands.output import Col, cli_errors, print_table, stderr, stdout


@cli_errors
def eval_(
    bench: Annotated[
        Optional[str],
        typer.Argument(
            help="arith (the run's held-out task split), aime24, aime25, math500, gsm8k, "
            "or a JSONL path.",
            show_default=False,
        ),
    ] = None,
    samples: Annotated[
        int, typer.Option("--samples", "-n", help="N samples per problem (avg@N).")
    ] = 32,
    model: Annotated[
        Optional[str],
        typer.Option(
            help="A run directory or its MLflow run id (its latest checkpoint), "
            "a checkpoint folder, or a local HF model folder. "
            "Default: the latest run under --runs-dir.",
            show_default=False,
        ),
    ] = None,
    step: Annotated[
        Optional[int],
        typer.Option(help="The run's checkpoint at this training step.", show_default=False),
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            help="builtin (CPU/GPU) or vllm (vLLM: the gpu extra on a GPU, or its CPU build from "
            "scripts/vllm-env.sh)."
        ),
    ] = "builtin",
    temperature: Annotated[float, typer.Option(help="Sampling temperature (paper: 1.0).")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus mass (paper: 0.7).")] = 0.7,
    max_tokens: Annotated[
        Optional[int],
        typer.Option(
            help="New tokens per response. "
            "Default: for arith on a run, its rollout.max_new_tokens; else 1024.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        Optional[int],
        typer.Option(
            help="Sampling seed. "
            "Default: for arith on a run, the trainer's eval seed at that step; else 0.",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Optional[Path],
        typer.Option(
            help="Output folder (samples.jsonl, summary.json); rerun to resume. "
            "Default: <run>/eval/... or evals/...",
            show_default=False,
        ),
    ] = None,
    per_problem: Annotated[
        bool, typer.Option("--per-problem", help="Print a table of every problem.")
    ] = False,
    responses: Annotated[
        Optional[Path],
        typer.Option(
            help="Grade this JSONL of responses (problem_id, response) instead of generating.",
            show_default=False,
        ),
    ] = None,
    data: Annotated[
        Optional[Path],
        typer.Option(help="A JSONL benchmark file instead of BENCH.", show_default=False),
    ] = None,
    problem_key: Annotated[
        Optional[str],
        typer.Option(
            help="--data: field of the problem text (default problem).", show_default=False
        ),
    ] = None,
    answer_key: Annotated[
        Optional[str],
        typer.Option(help="--data: field of the reference (default answer).", show_default=False),
    ] = None,
    template: Annotated[
        Optional[str],
        typer.Option(
            help="Prompt template with {problem}. "
            "Default: the problem, then 'Please reason step by step, and put your "
            "final answer within \\boxed{}.'",
            show_default=False,
        ),
    ] = None,
    chunk_problems: Annotated[
        Optional[int],
        typer.Option(
            help="Problems per generation chunk "
            "(the resume unit; each seeded from seed and its index). "
            "Default 256 // N; 0: one chunk, which reproduces the trainer's eval draws.",
            show_default=False,
        ),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    threads: Annotated[
        Optional[int], typer.Option(help="torch CPU threads.", show_default=False)
    ] = None,
    runs_dir: Annotated[Path, typer.Option(help="Where runs are looked for.")] = Path("runs"),
    no_track: Annotated[bool, typer.Option("--no-track", help="Log nothing to MLflow.")] = False,
    tracking_uri: Annotated[
        Optional[str],
        typer.Option(
            help="MLflow store for a new eval run "
            "(default: $MLFLOW_TRACKING_URI, else ./mlflow.db).",
            show_default=False,
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Discard earlier samples in the output folder.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Evaluate a model: N samples per problem, graded; print avg@N +- SE, 95% CI, pass@k, maj@N.

    Example: vapo-lab eval aime24 --samples 32 --model runs/vapo-seed0-20261122-080224 --step 100
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from vapo_lab.commands.progress import progress_bar
    from vapo_lab.eval.harness import evaluate_model
    from vapo_lab.eval.responses import grade_responses
    from vapo_lab.eval.settings import MATH_TEMPLATE, EvalSettings

    settings = EvalSettings(
        samples=samples,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
        backend=backend,
        template=template or MATH_TEMPLATE,
        chunk_problems=chunk_problems,
        device=device,
        threads=threads,
    )
    name = bench or (str(data) if data else None)
    shown: set[str] = set()

    def log(message: str) -> None:
        shown.add(message)
        stderr.print(message, highlight=False, soft_wrap=True, markup=False)

    if responses is not None:
        result = grade_responses(
            bench,
            responses,
            data=data,
            problem_key=problem_key,
            answer_key=answer_key,
            model=model,
            step=step,
            settings=settings,
            out_dir=out,
            runs_dir=runs_dir,
            track=not no_track,
            tracking_uri=tracking_uri,
        )
    else:
        columns = [
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("samples"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        ]
        progress = [0, 0]  # samples done, in all: what a stop reports
        with progress_bar(not quiet, stderr, *columns) as bar:
            # added at the first report, after every check: a refusal prints alone
            tasks: list[Any] = []

            def on_progress(done: int, total: int) -> None:
                progress[:] = [done, total]
                if bar is not None:
                    if not tasks:
                        tasks.append(
                            bar.add_task(f"eval {name}", total=total, completed=done, unit="sample")
                        )
                    bar.update(tasks[0], completed=done, total=total)

            with stopped_by_signal(progress):
                result = evaluate_model(
                    bench,
                    model=model,
                    step=step,
                    settings=settings,
                    out_dir=out,
                    data=data,
                    problem_key=problem_key,
                    answer_key=answer_key,
                    runs_dir=runs_dir,
                    track=not no_track,
                    tracking_uri=tracking_uri,
                    overwrite=overwrite,
                    on_progress=on_progress,
                    log=log,
                )
    for warning in result.warnings:
        if f"warning: {warning}" not in shown:
            stderr.print(f"warning: {warning}", highlight=False, soft_wrap=True, markup=False)
    print_eval(result.summary, per_problem)


@contextlib.contextmanager
def stopped_by_signal(progress: list[int]) -> Iterator[None]:
    """Turns SIGTERM into an interrupt while an evaluation samples, and an interrupt (Ctrl-C or
    SIGTERM) into one line that says how far it got and that the same command resumes it (the
    finished chunks are on disk), exiting 130 (Ctrl-C) or 143 (SIGTERM) as a shell would."""

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_term) if _main_thread() else None
    try:
        yield
    except KeyboardInterrupt as e:
        why = str(e) or "Ctrl-C"
        done, total = progress
        stderr.print(
            f"evaluation stopped ({why}) after {done} of {total} samples; the finished chunks "
            "are kept: run the same command to resume from them",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        raise typer.Exit(143 if why == "SIGTERM" else 130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def print_eval(s: dict[str, Any], per_problem: bool) -> None:
    """Prints an evaluation summary: settings, avg@N +- SE and CI, pass@k, maj@N, lengths, files."""
    m, g, b, mod = s["metrics"], s["generation"], s["benchmark"], s["model"]
    n = (
        m["samples_per_problem"]
        if isinstance(m["samples_per_problem"], int)
        else m["samples_per_problem"]["min"]
    )
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    where = (
        f"{mod['checkpoint']} (step {mod['step']})" if mod.get("checkpoint") else mod.get("path")
    ) or "responses"
    if g["engine"] == "external":
        how = f"responses from {g['responses']}"
    else:
        how = (
            f"{g['engine']} ({g['engine_version']}), "
            f"temperature {g['temperature']}, top_p {g['top_p']}, "
            f"max {g['max_tokens']} tokens, seed {g['seed']}"
        )
    se = m[f"avg_at_{n}_se"]
    lo, hi = m[f"avg_at_{n}_ci95"]
    se_text = "n/a" if se is None else f"{100 * se:.1f}"
    length = "n/a" if m["response_length"] is None else f"{m['response_length']:.1f}"
    lines = [
        f"benchmark   {b['name']}: {m['problems_graded']} problems x {n} samples",
        f"model       {where}",
        f"sampling    {how}",
        (
            f"avg@{n:<7} {pct(m[f'avg_at_{n}'])} +- {se_text} (SE over problems), 95% bootstrap CI "
            f"[{100 * lo:.1f}, {100 * hi:.1f}]   mean per-sample accuracy = pass@1 from {n} samples"
        ),
        "pass@k      " + "  ".join(f"k={k} {pct(v)}" for k, v in m["pass_at_k"].items()),
        f"maj@{n:<7} {pct(m[f'maj_at_{n}'])}",
        f"responses   mean length {length} tokens, truncated {pct(m['truncated_frac'])}",
    ]
    stdout.print("\n".join(lines), highlight=False, soft_wrap=True, markup=False)
    if mod.get("name") == "tiny" and b["name"] != "arith":
        stdout.print(
            f"note        the embedded tiny model (~1M parameters, taught only addition) cannot do "
            f"{b['name']} problems: a score near zero is the expected, honest result",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    if per_problem:
        cols = (
            Col("problem", typed=True),
            Col("reference", typed=True, justify="right"),
            Col("correct", justify="right"),
            Col("accuracy", justify="right"),
            Col("majority answer", justify="right"),
        )
        rows = [
            (
                row["problem_id"],
                row["reference"],
                f"{row['correct']}/{row['samples']}",
                pct(row["accuracy"]),
                "-"
                if row["majority_answer"] is None
                else f"{row['majority_answer'][:30]}"
                f"{' (right)' if row['majority_correct'] else ''}",
            )
            for row in s["per_problem"]
        ]
        print_table(None, cols, rows)
    t = s.get("tracking")
    track = (
        "not logged"
        if not t
        else (
            f"{'new run' if t['new_run'] else 'training run'} {t['run_id']} at step "
            f"{t['step']} ({t['uri']})"
        )
    )
    stdout.print(
        f"samples     {s['files']['samples']}\n"
        f"summary     {Path(s['files']['samples']).parent / 'summary.json'}\n"
        f"MLflow      {track}\n"
        f"time        {s['timing'].get('wall_s', s['timing'].get('grade_s', 0)):.1f} s",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
