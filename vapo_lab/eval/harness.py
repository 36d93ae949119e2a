"""The evaluation harness: N samples per problem from a model, graded, scored, saved, logged.

``evaluate_model`` samples each chunk of problems from its own seeded generator, grades it and
appends it to the samples file, so that a resumed evaluation equals an uninterrupted one
(docs/evaluation.md, Outputs and resuming). Nothing here prints: the CLI renders progress through
``on_progress`` and ``log``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vapo_lab.eval.benchmarks import ARITH, EvalBench, check_benchmark, load_eval_bench
from vapo_lab.eval.files import (
    SAMPLES_FILE,
    SETTINGS_FILE,
    SUMMARY_FILE,
    EvalResult,
    append_records,
    chunks,
    default_out_dir,
    open_samples,
    require_out,
)
from vapo_lab.eval.loading import Loaded, device_name, load_generator, prompt_ids
from vapo_lab.eval.model_ref import ModelRef, resolve_model
from vapo_lab.eval.scoring import (
    compute_metrics,
    failed_grades,
    grade_records,
    grader_settings,
    grading_record,
)
from vapo_lab.eval.settings import (
    DEFAULT_MAX_TOKENS,
    ROWS_PER_CHUNK,
    EvalSettings,
    check_settings,
)
from vapo_lab.eval.tracking import save_result
from vapo_lab.seeds import STEP_STRIDE, STREAM_STRIDE, chunk_seed, heldout_seed


@dataclass(frozen=True)
class _Plan:
    """What the samples depend on, decided before anything is loaded; ``key`` is settings.json."""

    n: int
    seed: int
    seed_rule: str
    max_tokens: int
    per_chunk: int
    chunks: list[range]
    out: Path
    device: str
    key: dict[str, Any]


@dataclass
class _Generation:
    """What generating the missing chunks did (nothing, when the samples file was complete)."""

    resumed_chunks: int
    started: float
    loaded: Loaded | None = None
    chat_template_applied: bool | None = None
    generate_s: float = 0.0
    grade_s: float = 0.0
    tokens: int = 0
    warnings: list[str] = field(default_factory=list)


def evaluate_model(
    bench: str | None,
    model: str | Path | None = None,
    step: int | None = None,
    settings: EvalSettings = EvalSettings(),
    out_dir: str | Path | None = None,
    data: str | Path | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
    runs_dir: str | Path = "runs",
    track: bool = True,
    tracking_uri: str | None = None,
    overwrite: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> EvalResult:
    """Returns the graded evaluation of ``model`` on ``bench``: samples, metrics, files.

    Args:
        bench: arith, a packaged benchmark (``benchmarks.BENCHMARKS``) or a JSONL path (None with
            ``data``).
        model: see ``resolve_model``; None: the latest run under ``runs_dir``.
        step: the run checkpoint's training step (None: the latest checkpoint).
        out_dir: output folder (None: ``default_out_dir``); samples written there with the same
            settings are resumed, with others refused (``overwrite`` restarts).
        track: log the metrics to MLflow (``tracking.log_metrics_to_mlflow``).
        tracking_uri: the MLflow store for a new run (default: ``resolve_tracking_uri``).
        on_progress: called with (samples done, samples in all) at the start and after each
            chunk; an exception raised there stops the evaluation with the chunks so far on disk.

    Raises:
        EvalError, ConfigError: bad model, benchmark, settings or out folder; one line each.
    """
    import torch

    check_settings(settings)
    bch, ref = _bench_and_model(
        bench, model, step, data, problem_key, answer_key, runs_dir, tracking_uri
    )
    if settings.threads:
        torch.set_num_threads(int(settings.threads))
    plan = _plan(bch, ref, settings, out_dir)
    require_out(plan.out, out_dir is not None)
    records, complete = open_samples(
        plan.out, plan.key, plan.chunks, plan.n, [p.id for p in bch.problems], overwrite, log
    )
    gen = _generate(bch, ref, settings, plan, records, complete, on_progress, log)
    summary = _summary(bch, ref, settings, plan, records, gen)
    return save_result(plan.out, summary, ref, bch.name, track, tracking_uri)


def _bench_and_model(
    bench: str | None,
    model: str | Path | None,
    step: int | None,
    data: str | Path | None,
    problem_key: str | None,
    answer_key: str | None,
    runs_dir: str | Path,
    tracking_uri: str | None,
) -> tuple[EvalBench, ModelRef]:
    """Returns (the benchmark, the model): a file or packaged set is read before the model is
    looked for, so that a bad one is refused first; arith needs the run."""
    check_benchmark(bench, data)
    early = (
        None
        if bench == ARITH and data is None
        else load_eval_bench(bench, None, data, problem_key, answer_key)
    )
    ref = resolve_model(model, step, runs_dir, tracking_uri)
    return early or load_eval_bench(bench, ref, data, problem_key, answer_key), ref


def _seed(bch: EvalBench, ref: ModelRef, settings: EvalSettings) -> tuple[int, str]:
    """Returns (the sampling seed, how it was chosen)."""
    if settings.seed is not None:
        return settings.seed, "given"
    if bch.run_seed is not None and ref.step is not None:
        return (
            heldout_seed(bch.run_seed, ref.step),
            f"the trainer's periodic-eval seed at this step (seed*{STEP_STRIDE}+step)",
        )
    return 0, "default"


def _plan(
    bch: EvalBench, ref: ModelRef, settings: EvalSettings, out_dir: str | Path | None
) -> _Plan:
    """Returns the seed, token budget, chunks, output folder and device of the evaluation."""
    n = settings.samples
    seed, seed_rule = _seed(bch, ref, settings)
    max_tokens = settings.max_tokens or bch.default_max_tokens or DEFAULT_MAX_TOKENS
    per_chunk = (
        settings.chunk_problems
        if settings.chunk_problems is not None
        else max(1, ROWS_PER_CHUNK // n)
    )
    per_chunk = per_chunk or len(bch.problems)
    out = Path(out_dir) if out_dir is not None else default_out_dir(bch.name, ref, n, seed)
    device = device_name(settings.device)
    key = {
        "benchmark": bch.name,
        "benchmark_source": bch.source,
        "benchmark_fingerprint": bch.fingerprint(),
        "problems": len(bch.problems),
        "model": str(ref.path.resolve()),
        "step": ref.step,
        "backend": settings.backend,
        "device": device,
        "dtype": settings.dtype,
        "samples": n,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "max_tokens": max_tokens,
        "seed": seed,
        "chunk_problems": per_chunk,
        "chunk_seed": f"seed + {STREAM_STRIDE} * chunk",
        "template": None if bch.verify is not None else settings.template,
        "chat_template": bch.chat_template if bch.verify is not None else settings.chat_template,
        **grader_settings(bch, settings),
    }
    return _Plan(
        n,
        seed,
        seed_rule,
        max_tokens,
        per_chunk,
        chunks(len(bch.problems), per_chunk),
        out,
        device,
        key,
    )


def _generate(
    bch: EvalBench,
    ref: ModelRef,
    settings: EvalSettings,
    plan: _Plan,
    records: list[dict[str, Any]],
    complete: int,
    on_progress: Callable[[int, int], None] | None,
    log: Callable[[str], None],
) -> _Generation:
    """Generates, grades and appends every chunk after the first ``complete`` to ``records``."""
    samples_path = plan.out / SAMPLES_FILE
    problems = {p.id: p for p in bch.problems}
    total = len(bch.problems) * plan.n
    gen = _Generation(resumed_chunks=complete, started=time.perf_counter())
    if on_progress:
        on_progress(len(records), total)
    if complete == len(plan.chunks):
        log(f"{samples_path} is complete: metrics recomputed from it, nothing generated")
        return gen

    def longest_prompt(tokenizer: Any) -> int:
        return max(len(p) for p in prompt_ids(bch, tokenizer, settings)[0])

    gen.loaded = load_generator(ref, settings, plan.max_tokens, plan.seed, longest_prompt)
    ids, gen.chat_template_applied = prompt_ids(bch, gen.loaded.tokenizer, settings)
    context = gen.loaded.context()
    longest = max(len(p) for p in ids)
    if context is not None and longest + plan.max_tokens > context:
        gen.warnings.append(
            f"the longest prompt ({longest} tokens) plus --max-tokens {plan.max_tokens} exceeds "
            f"the model's context of {context} tokens: its outputs there are out of distribution"
        )
        log(f"warning: {gen.warnings[-1]}")
    for c_index in range(complete, len(plan.chunks)):
        chunk_records = _sample_chunk(bch, settings, plan, gen, ids, c_index)
        t0 = time.perf_counter()
        grade_records(chunk_records, bch, problems, settings)
        gen.grade_s += time.perf_counter() - t0
        append_records(samples_path, chunk_records)
        records.extend(chunk_records)
        if on_progress:
            on_progress(len(records), total)
    return gen


def _sample_chunk(
    bch: EvalBench,
    settings: EvalSettings,
    plan: _Plan,
    gen: _Generation,
    ids: list[list[int]],
    c_index: int,
) -> list[dict[str, Any]]:
    """Returns the ungraded sample records of chunk ``c_index``, drawn from its own generator."""
    import torch

    loaded, n = gen.loaded, plan.n
    assert loaded is not None  # _generate loads before the first chunk
    idx = list(plan.chunks[c_index])
    generator = torch.Generator().manual_seed(chunk_seed(plan.seed, c_index))
    t0 = time.perf_counter()
    s = loaded.generate([ids[i] for i in idx], n, settings.temperature, settings.top_p, generator)
    gen.generate_s += time.perf_counter() - t0
    lengths = s.lengths.tolist()
    gen.tokens += sum(lengths)
    records = []
    for row in range(len(idx) * n):
        i = idx[row // n]
        response = s.response_ids[row, : lengths[row]].tolist()
        records.append(
            {
                "problem_id": bch.problems[i].id,
                "sample_index": row % n,
                "prompt": loaded.tokenizer.decode(ids[i], skip_special_tokens=False),
                "response": loaded.tokenizer.decode(response, skip_special_tokens=True),
                "extracted_answer": None,
                "reference": bch.problems[i].answer,
                "correct": False,
                "length": lengths[row],
                "finish_reason": "stop" if bool(s.finished[row]) else "length",
            }
        )
    return records


def _engine_record(out: Path, gen: _Generation, settings: EvalSettings) -> dict[str, Any]:
    """Returns what only a loaded engine knows; when nothing was generated now, the earlier
    summary's record."""
    loaded = gen.loaded
    if loaded is not None:
        return {
            "engine": loaded.engine,
            "engine_version": loaded.engine_version,
            "dtype": loaded.dtype,
            "eos_ids": loaded.eos_ids,
            "chat_template_applied": gen.chat_template_applied,
        }
    earlier = (
        json.loads((out / SUMMARY_FILE).read_text()).get("generation", {})
        if (out / SUMMARY_FILE).is_file()
        else {}
    )
    return {
        "engine": earlier.get("engine", settings.backend),
        "engine_version": earlier.get("engine_version"),
        "dtype": earlier.get("dtype", settings.dtype),
        "eos_ids": earlier.get("eos_ids"),
        "chat_template_applied": earlier.get("chat_template_applied"),
    }


def _summary(
    bch: EvalBench,
    ref: ModelRef,
    settings: EvalSettings,
    plan: _Plan,
    records: list[dict[str, Any]],
    gen: _Generation,
) -> dict[str, Any]:
    """Returns the evaluation's summary: settings, engine, metrics, per-problem rows, timings."""
    engine = _engine_record(plan.out, gen, settings)
    metrics, rows = compute_metrics(records, bch.problems, bch.integer_answers)
    wall = time.perf_counter() - gen.started
    samples_path = plan.out / SAMPLES_FILE
    failed = failed_grades(metrics)
    if failed:
        gen.warnings.append(
            f"grading: {failed} (counted wrong; see grade_detail in {samples_path})"
        )
    return {
        "benchmark": bch.describe(),
        "model": ref.describe(),
        "generation": {
            "engine": engine["engine"],
            "engine_version": engine["engine_version"],
            "device": plan.device,
            "dtype": engine["dtype"],
            "samples": plan.n,
            "temperature": settings.temperature,
            "top_p": settings.top_p,
            "max_tokens": plan.max_tokens,
            "seed": plan.seed,
            "seed_rule": plan.seed_rule,
            "chunk_problems": plan.per_chunk,
            "chunk_seed": plan.key["chunk_seed"],
            "template": plan.key["template"],
            "chat_template": plan.key["chat_template"],
            "chat_template_applied": engine["chat_template_applied"],
            "eos_ids": engine["eos_ids"],
        },
        "grading": grading_record(bch, settings),
        "metrics": metrics,
        "per_problem": rows,
        "timing": {
            "wall_s": wall,
            "generate_s": gen.generate_s,
            "grade_s": gen.grade_s,
            "generated_tokens": gen.tokens,
            "resumed_chunks": gen.resumed_chunks,
        },
        "files": {"samples": str(samples_path), "settings": str(plan.out / SETTINGS_FILE)},
        "warnings": gen.warnings,
    }


__all__ = ["evaluate_model"]
