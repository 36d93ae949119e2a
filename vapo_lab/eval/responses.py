"""``--responses``: grading a JSONL of responses generated elsewhere (any engine), with no model.

References and grader are those of ``evaluate_model``; the output folder holds the graded
``samples.jsonl`` and ``summary.json``, and no settings.json (nothing is generated to resume).
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vapo_lab.eval.benchmarks import ARITH, check_benchmark, load_eval_bench
from vapo_lab.eval.files import SAMPLES_FILE, EvalResult, require_out, write_records
from vapo_lab.eval.model_ref import NO_MODEL, resolve_model
from vapo_lab.eval.scoring import compute_metrics, failed_grades, grade_records, grading_record
from vapo_lab.eval.settings import EvalError, EvalSettings, check_settings, file_safe
from vapo_lab.eval.tracking import save_result
from vapo_lab.tasks import Problem, jsonl_objects


def read_responses(path: str | Path, problems: Sequence[Problem]) -> list[dict[str, Any]]:
    """Returns sample records, in benchmark order, from a JSONL of ``problem_id`` (or ``id``) and
    ``response``, optionally ``sample_index`` (default: order of appearance per problem),
    ``length`` and ``finish_reason`` ("length" = truncated).

    Raises:
        EvalError: a missing file, a malformed line, an unknown problem id, or a sample_index
            that is not one of 0..k-1 (k: the problem's responses) or repeats, with its line.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalError(
            f"--responses {path} does not exist: "
            "give a JSONL file with problem_id and response keys"
        )
    known = {p.id: p for p in problems}
    per_problem: dict[str, list[dict[str, Any]]] = {}
    line_of: dict[int, int] = {}  # id(record) -> its line
    for number, d in jsonl_objects(path, EvalError):
        pid = d.get("problem_id", d.get("id"))
        response = d.get("response")
        if pid is None or not isinstance(response, str):
            raise EvalError(f"{path}:{number}: needs a problem_id (or id) and a response string")
        pid = str(pid)
        if pid not in known:
            close = difflib.get_close_matches(pid, list(known), n=1)
            hint = (
                f"did you mean {close[0]}?"
                if close
                else f"its ids look like {', '.join(list(known)[:3])}"
            )
            raise EvalError(
                f"{path}:{number}: problem_id {pid!r} is not in the benchmark ({hint}); use the "
                "benchmark's problem ids"
            )
        rows = per_problem.setdefault(pid, [])
        index = d.get("sample_index", len(rows))
        if isinstance(index, float) and index.is_integer():
            index = int(index)
        if isinstance(index, bool) or not isinstance(index, int):
            raise EvalError(
                f"{path}:{number}: sample_index {index!r} is not an integer: number each problem's "
                "responses 0, 1, 2, ..., or leave sample_index out (order of appearance)"
            )
        rows.append(
            {
                "problem_id": pid,
                "sample_index": index,
                "prompt": d.get("prompt"),
                "response": response,
                "extracted_answer": None,
                "reference": known[pid].answer,
                "correct": False,
                "length": d.get("length"),
                "finish_reason": d.get("finish_reason"),
            }
        )
        line_of[id(rows[-1])] = number
    for pid, rows in per_problem.items():
        _check_numbering(path, pid, rows, line_of)
    return [
        r
        for p in problems
        for r in sorted(per_problem.get(p.id, []), key=lambda r: r["sample_index"])
    ]


def _check_numbering(
    path: Path, pid: str, rows: list[dict[str, Any]], line_of: dict[int, int]
) -> None:
    """Raises EvalError unless problem ``pid``'s k responses are numbered 0..k-1, each once."""
    seen: dict[int, int] = {}
    for r in rows:
        index, number = r["sample_index"], line_of[id(r)]
        if not 0 <= index < len(rows):
            raise EvalError(
                f"{path}:{number}: sample_index {index} is out of range: problem {pid} has "
                f"{len(rows)} responses, numbered 0..{len(rows) - 1}, each once; renumber them, "
                "or leave sample_index out (order of appearance)"
            )
        if index in seen:
            raise EvalError(
                f"{path}:{number}: sample_index {index} of problem {pid} is given twice (also "
                f"on line {seen[index]}); number its responses 0..{len(rows) - 1}, each once, "
                "or leave sample_index out (order of appearance)"
            )
        seen[index] = number


def grade_responses(
    bench: str | None,
    responses: str | Path,
    data: str | Path | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
    model: str | Path | None = None,
    step: int | None = None,
    settings: EvalSettings = EvalSettings(),
    out_dir: str | Path | None = None,
    runs_dir: str | Path = "runs",
    track: bool = True,
    tracking_uri: str | None = None,
) -> EvalResult:
    """Returns the graded evaluation of responses generated elsewhere (any engine), with no model;
    arith needs ``model`` (or a latest run) for its task."""
    check_settings(settings)
    check_benchmark(bench, data)
    ref = (
        resolve_model(model, step, runs_dir, tracking_uri)
        if (bench == ARITH or model is not None)
        else None
    )
    bch = load_eval_bench(bench, ref, data, problem_key, answer_key)
    out = (
        Path(out_dir)
        if out_dir is not None
        else Path("evals") / (f"{file_safe(bch.name)}-responses-{Path(responses).stem}")
    )
    require_out(out, out_dir is not None)
    records = read_responses(responses, bch.problems)
    if not records:
        raise EvalError(f"--responses {responses} holds no response")
    t0 = time.perf_counter()
    grade_records(records, bch, {p.id: p for p in bch.problems}, settings)
    t_grade = time.perf_counter() - t0
    metrics, rows = compute_metrics(records, bch.problems, bch.integer_answers)
    warnings = []
    if metrics["problems_graded"] < len(bch.problems):
        warnings.append(
            f"{len(bch.problems) - metrics['problems_graded']} of {len(bch.problems)} problems "
            "have no response: metrics are over the graded ones only"
        )
    failed = failed_grades(metrics)
    if failed:
        warnings.append(f"grading: {failed} (counted wrong)")
    n = metrics["samples_per_problem"]
    n = n if isinstance(n, int) else n["min"]
    out.mkdir(parents=True, exist_ok=True)
    write_records(out / SAMPLES_FILE, records)
    summary = {
        "benchmark": bch.describe(),
        "model": ref.describe() if ref is not None else dict(NO_MODEL),
        "generation": {
            "engine": "external",
            "responses": str(Path(responses).resolve()),
            "samples": n,
            "seed": None,
        },
        "grading": grading_record(bch, settings),
        "metrics": metrics,
        "per_problem": rows,
        "timing": {"grade_s": t_grade},
        "files": {"samples": str(out / SAMPLES_FILE)},
        "warnings": warnings,
    }
    return save_result(out, summary, ref, bch.name, track, tracking_uri)


__all__ = ["grade_responses", "read_responses"]
