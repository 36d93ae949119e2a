"""Benchmarks: the packaged sets (``BENCHMARKS``), any JSONL file of problems, and arith.

``arith`` is the embedded task's held-out split of the evaluated run, prompted and graded as the
trainer's periodic eval does it (the task's verifier, a truncated response wrong).
``load_eval_bench`` returns any of them as an ``EvalBench``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vapo_lab.errors import ConfigError
from vapo_lab.eval.settings import EvalError
from vapo_lab.tasks import Problem
from vapo_lab.tasks.math import load_jsonl

if TYPE_CHECKING:  # the packaged sets load without torch, which model references pull in
    from vapo_lab.eval.model_ref import ModelRef

ARITH = "arith"


@dataclass(frozen=True)
class _Packaged:
    """Where a packaged benchmark lives and how to read it."""

    file: str
    problem_key: str
    answer_key: str
    integer_answers: bool


# Provenance and checks of each file: vapo_lab/data/README.md.
BENCHMARKS: dict[str, _Packaged] = {
    "aime24": _Packaged("aime24.jsonl", "problem", "answer", True),
    "aime25": _Packaged("aime25.jsonl", "problem", "answer", True),
    "math500": _Packaged("math500.jsonl", "problem", "answer", False),
    # GSM8K's text is under `question`; its final answers are integers
    "gsm8k": _Packaged("gsm8k_test.jsonl", "question", "answer", True),
}

_INTEGER_ANSWER = re.compile(r"[+-]?\d+")


@dataclass(frozen=True)
class Benchmark:
    """A set of problems to evaluate on.

    Attributes:
        name: the packaged name, or the file's stem for a JSONL path.
        problems: in file order; ``Problem.id`` from the file's ``id`` field, else the line number.
        integer_answers: every reference is an integer, so answers are graded as integers
            (``vapo_lab.grading.match_answer``).
    """

    name: str
    problems: list[Problem]
    integer_answers: bool


def data_dir() -> Path:
    """Returns the directory of the packaged benchmark files (vapo_lab/data)."""
    return Path(str(resources.files("vapo_lab.data")))


def load_benchmark(
    name_or_path: str | Path, problem_key: str | None = None, answer_key: str | None = None
) -> Benchmark:
    """Returns a packaged benchmark by name, or the problems of a JSONL file.

    Args:
        name_or_path: a key of ``BENCHMARKS``, or the path of a JSONL file.
        problem_key: field holding the problem text (default: the set's own, else "problem").
        answer_key: field holding the reference answer (default: the set's own, else "answer").

    Returns:
        The benchmark; a JSONL file is an integer-answer set iff every reference is an integer.

    Raises:
        ConfigError: an unknown name (the valid ones are listed), a missing file, or a malformed
            line (named with its file and line number).
    """
    name = str(name_or_path)
    check_benchmark_name(name)
    if name in BENCHMARKS:
        spec = BENCHMARKS[name]
        problems = load_jsonl(
            data_dir() / spec.file, problem_key or spec.problem_key, answer_key or spec.answer_key
        )
        return Benchmark(name, problems, spec.integer_answers)
    path = Path(name)
    problems = load_jsonl(path, problem_key or "problem", answer_key or "answer")
    integer = all(_INTEGER_ANSWER.fullmatch(p.answer.strip()) for p in problems)
    return Benchmark(path.stem, problems, integer)


def check_benchmark_name(name_or_path: str | Path) -> None:
    """Raises ConfigError unless ``name_or_path`` is a packaged benchmark or an existing file; reads
    nothing, so a command checks it before it loads a model."""
    name = str(name_or_path)
    if name in BENCHMARKS or Path(name).is_file():
        return
    close = difflib.get_close_matches(name, list(BENCHMARKS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(
        f"benchmark {name!r} is neither a packaged benchmark{hint} nor an existing file. "
        f"Use one of {', '.join(BENCHMARKS)}, or the path of a JSONL file with problem and "
        "answer fields."
    )


def benchmark_names() -> list[str]:
    """Returns the names a benchmark argument takes besides a JSONL path: arith, ``BENCHMARKS``."""
    return [ARITH, *BENCHMARKS]


@dataclass
class EvalBench:
    """A benchmark ready to evaluate: problems, how their prompts are written, how they are graded.

    ``verify`` is set for arith (the task's verifier, truncated counting wrong, as the trainer's
    eval); otherwise responses go through ``grade_many``.
    """

    name: str
    problems: list[Problem]
    integer_answers: bool
    source: str
    verify: Callable[[str, Problem], bool] | None = None
    chat_template: str | None = None  # arith: the run's model.chat_template
    # arith on a run: the run's seed (periodic-eval seeds derive from it)
    run_seed: int | None = None
    default_max_tokens: int | None = None  # arith on a run: its rollout.max_new_tokens

    def fingerprint(self) -> str:
        """Returns a 16-hex-digit hash of the problems' ids, prompts and answers."""
        blob = json.dumps([[p.id, p.prompt, p.answer] for p in self.problems], ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        """Returns the JSON-able record of the benchmark for the summary."""
        return {
            "name": self.name,
            "source": self.source,
            "problems": len(self.problems),
            "integer_answers": self.integer_answers,
            "fingerprint": self.fingerprint(),
        }


def arith_bench(ref: ModelRef | None) -> EvalBench:
    """Returns the embedded task's eval split of the run (or bare base folder) ``ref``."""
    from vapo_lab.tasks import build_task

    if ref is None or (ref.cfg is None and ref.base_config is None):
        raise EvalError(
            "benchmark arith is the held-out split of a run's embedded task: give --model a "
            "vapo-lab run (or the embedded base model's folder), not a model without one"
        )
    if ref.cfg is not None:
        c = ref.cfg.task
        if c.name != ARITH:
            raise EvalError(
                f"run {ref.run_dir} trained on task={c.name}, not arith: evaluate its eval file "
                f"with --data {c.eval_path or c.train_path}"
            )
        task = build_task(ARITH, seed=c.seed, n_train=c.n_train, n_eval=c.n_eval, **c.options)
        return EvalBench(
            ARITH,
            list(task.eval),
            True,
            f"task=arith seed={c.seed} n_eval={c.n_eval} options={c.options}",
            verify=task.verify,
            chat_template=ref.cfg.model.chat_template,
            run_seed=ref.cfg.seed,
            default_max_tokens=ref.cfg.rollout.max_new_tokens,
        )
    b = ref.base_config
    task = build_task(
        ARITH,
        seed=int(b["task_seed"]),
        n_train=int(b["n_train"]),
        n_eval=int(b["n_eval"]),
        min_digits=int(b["min_digits"]),
        max_digits=int(b["max_digits"]),
        length_exponent=float(b["length_exponent"]),
        readout=str(b.get("readout", "plain")),
    )
    return EvalBench(
        ARITH,
        list(task.eval),
        True,
        f"task=arith from {ref.path}/base.json",
        verify=task.verify,
        chat_template="none",
    )


def check_benchmark(bench: str | None, data: str | Path | None = None) -> None:
    """Raises EvalError or ConfigError unless ``bench`` / ``data`` name one benchmark that exists;
    reads nothing, so a command checks it before it loads a model."""
    if data is not None:
        if bench not in (None, str(data)):
            raise EvalError(f"give either a benchmark name ({bench}) or --data {data}, not both")
        check_benchmark_name(data)
    elif bench is None:
        raise EvalError(
            f"no benchmark given: name one of {', '.join(benchmark_names())}, "
            "or give --data FILE.jsonl"
        )
    elif bench != ARITH:
        check_benchmark_name(bench)


def load_eval_bench(
    bench: str | None,
    ref: ModelRef | None,
    data: str | Path | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
) -> EvalBench:
    """Returns the benchmark to evaluate: arith, a packaged set, or ``data`` (a JSONL file)."""
    check_benchmark(bench, data)
    if data is not None:
        b: Benchmark = load_benchmark(Path(data), problem_key, answer_key)
        return EvalBench(b.name, b.problems, b.integer_answers, str(Path(data).resolve()))
    assert bench is not None  # check_benchmark
    if bench == ARITH:
        return arith_bench(ref)
    b = load_benchmark(bench, problem_key, answer_key)
    source = (
        f"vapo_lab/data/{BENCHMARKS[bench].file}"
        if bench in BENCHMARKS
        else str(Path(bench).resolve())
    )
    return EvalBench(b.name, b.problems, b.integer_answers, source)


__all__ = [
    "ARITH",
    "BENCHMARKS",
    "Benchmark",
    "EvalBench",
    "benchmark_names",
    "check_benchmark",
    "check_benchmark_name",
    "data_dir",
    "load_benchmark",
    "load_eval_bench",
]
