"""Scoring sample records: grading them, then avg@N ± SE, bootstrap CI, pass@k, maj@N, MLflow names.

A sample record is one line of ``samples.jsonl``: ``problem_id``, ``sample_index``, ``prompt``,
``response``, ``extracted_answer``, ``reference``, ``correct``, ``length``, ``finish_reason``
(``"length"``: truncated), then ``grade_status`` (and ``grade_detail`` on a timeout or error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vapo_lab.eval.benchmarks import EvalBench
from vapo_lab.eval.metrics import (
    avg_at_k,
    avg_at_k_se,
    bootstrap_ci,
    maj_at_k,
    majority_index,
    pass_at_k_table,
)
from vapo_lab.eval.settings import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    EvalError,
    EvalSettings,
    mlflow_safe,
)
from vapo_lab.grading import grade_many, last_boxed, normalize_answer
from vapo_lab.tasks import Problem

# grade statuses whose samples count wrong without a verdict on their answer
FAILED_STATUSES = ("timeout", "error")


def grade_records(
    records: list[dict[str, Any]],
    bench: EvalBench,
    problems: dict[str, Problem],
    settings: EvalSettings,
) -> None:
    """Fills ``extracted_answer``, ``correct`` and ``grade_status`` of each record in place.

    arith: the task's verifier, a truncated response wrong, as in the trainer's reward and eval;
    otherwise ``grade_many``, whose timeouts and crashes count wrong.
    """
    if bench.verify is not None:
        for r in records:
            box = last_boxed(r["response"])
            r["extracted_answer"] = box.strip() if box is not None and box.strip() else None
            r["correct"] = (
                bool(bench.verify(r["response"], problems[r["problem_id"]]))
                and r["finish_reason"] != "length"
            )
            r["grade_status"] = "ok" if r["extracted_answer"] is not None else "no_answer"
        return
    results = grade_many(
        [r["response"] for r in records],
        [problems[r["problem_id"]].answer for r in records],
        bench.integer_answers,
        timeout_s=settings.grade_timeout_s,
        workers=settings.grade_workers,
    )
    for r, g in zip(records, results):
        r["extracted_answer"], r["correct"], r["grade_status"] = g.answer, bool(g.correct), g.status
        if g.status in FAILED_STATUSES:
            r["grade_detail"] = g.detail


def grader_settings(bench: EvalBench, settings: EvalSettings) -> dict[str, Any]:
    """Returns how ``bench`` is graded, as recorded in settings.json (a resume must match it)."""
    if bench.verify is not None:
        return {
            "grader": "task verifier (arith): last \\boxed{} equals the sum; truncated counts wrong"
        }
    return {
        "grader": "vapo_lab.grading.grade_many",
        "integer_answers": bench.integer_answers,
        "timeout_s": settings.grade_timeout_s,
    }


def grading_record(bench: EvalBench, settings: EvalSettings) -> dict[str, Any]:
    """Returns the summary's ``grading`` entry: ``grader_settings`` and the CI's bootstrap."""
    return {
        **grader_settings(bench, settings),
        "bootstrap": {
            "level": 0.95,
            "resamples": BOOTSTRAP_RESAMPLES,
            "seed": BOOTSTRAP_SEED,
            "unit": "problem",
        },
    }


def failed_grades(metrics: dict[str, Any]) -> str | None:
    """Returns ``"2 timeout, 1 error"`` for the samples the grader timed out or crashed on, or
    None."""
    bad = {k: v for k, v in metrics["grade_status"].items() if k in FAILED_STATUSES}
    return ", ".join(f"{v} {k}" for k, v in bad.items()) if bad else None


def compute_metrics(
    records: Sequence[dict[str, Any]], problems: Sequence[Problem], integer: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Returns (metrics, per-problem rows) of graded sample records, problems in benchmark order.

    Problems without a record are left out (``problems_graded`` counts the rest); the metrics
    are those of :mod:`vapo_lab.eval.metrics`, and ``grade_timeouts`` / ``grade_errors`` count
    the samples the grader timed out / crashed on.
    """
    by_problem: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_problem.setdefault(r["problem_id"], []).append(r)
    graded = [p for p in problems if p.id in by_problem]
    if not graded:
        raise EvalError("no graded sample to compute metrics from")
    correct = [[bool(r["correct"]) for r in by_problem[p.id]] for p in graded]
    answers = [[r["extracted_answer"] for r in by_problem[p.id]] for p in graded]
    counts = [len(row) for row in correct]
    n = min(counts)
    se = avg_at_k_se(correct)
    lo, hi = bootstrap_ci(correct, level=0.95, resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)
    lengths = [r["length"] for r in records if r.get("length") is not None]
    reasons = [r.get("finish_reason") for r in records]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[r.get("grade_status", "ok")] = statuses.get(r.get("grade_status", "ok"), 0) + 1
    metrics = {
        "samples_per_problem": n if n == max(counts) else {"min": n, "max": max(counts)},
        "problems_graded": len(graded),
        "problems_total": len(problems),
        "samples_graded": len(records),
        f"avg_at_{n}": avg_at_k(correct),
        f"avg_at_{n}_se": None if math.isnan(se) else se,
        f"avg_at_{n}_ci95": [lo, hi],
        "pass_at_k": {str(k): v for k, v in pass_at_k_table(correct).items()},
        f"maj_at_{n}": maj_at_k(answers, correct, k=n, integer=integer),
        "response_length": sum(lengths) / len(lengths) if lengths else None,
        "truncated_frac": (
            sum(r == "length" for r in reasons) / len(reasons)
            if all(r is not None for r in reasons)
            else None
        ),
        "grade_status": statuses,
        # samples over the grader's time limit or whose grading crashed: counted wrong above, and
        # counted here apart, so that they show in the summary and log as metrics
        "grade_timeouts": statuses.get("timeout", 0),
        "grade_errors": statuses.get("error", 0),
    }
    rows = []
    for p, row, ans in zip(graded, correct, answers):
        keys = [None if a is None else normalize_answer(a, integer) for a in ans]
        top = majority_index(keys)
        rows.append(
            {
                "problem_id": p.id,
                "reference": p.answer,
                "samples": len(row),
                "correct": sum(row),
                "accuracy": sum(row) / len(row),
                "majority_answer": None if top is None else ans[top],
                "majority_correct": top is not None and row[top],
            }
        )
    return metrics, rows


def metric_names(bench: str, metrics: dict[str, Any]) -> dict[str, float]:
    """Returns the MLflow metrics ``eval/<bench>/<name>`` (MLflow names cannot hold ``@``)."""
    safe = mlflow_safe(bench)
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "pass_at_k":
            out.update({f"eval/{safe}/pass_at_{k}": float(v) for k, v in value.items()})
        elif key.endswith("_ci95"):
            out[f"eval/{safe}/{key[:-5]}_ci95_low"], out[f"eval/{safe}/{key[:-5]}_ci95_high"] = map(
                float, value
            )
        elif (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and key
            not in ("samples_per_problem", "problems_graded", "problems_total", "samples_graded")
        ):
            out[f"eval/{safe}/{key}"] = float(value)
    return out


__all__ = [
    "compute_metrics",
    "failed_grades",
    "grade_records",
    "grader_settings",
    "grading_record",
    "metric_names",
]
