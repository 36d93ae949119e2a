"""Benchmarks: the packaged sets (aime24, aime25, math500, gsm8k) or any JSONL file of problems."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from vapo_lab.errors import ConfigError
from vapo_lab.tasks import Problem
from vapo_lab.tasks.math import load_jsonl


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


def load_benchmark(name_or_path: str | Path, problem_key: str | None = None,
                   answer_key: str | None = None) -> Benchmark:
    """Returns a packaged benchmark by name, or the problems of a JSONL file.

    Args:
        name_or_path: aime24 | aime25 | math500 | gsm8k, or the path of a JSONL file.
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
        problems = load_jsonl(data_dir() / spec.file, problem_key or spec.problem_key, answer_key or spec.answer_key)
        return Benchmark(name, problems, spec.integer_answers)
    path = Path(name)
    problems = load_jsonl(path, problem_key or "problem", answer_key or "answer")
    integer = all(_INTEGER_ANSWER.fullmatch(p.answer.strip()) for p in problems)
    return Benchmark(path.stem, problems, integer)


def check_benchmark_name(name_or_path: str | Path) -> None:
    """Raises ConfigError unless ``name_or_path`` is a packaged benchmark or an existing file (reads nothing:
    a command checks it before it resolves or loads a model)."""
    name = str(name_or_path)
    if name in BENCHMARKS or Path(name).is_file():
        return
    close = difflib.get_close_matches(name, list(BENCHMARKS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ConfigError(
        f"benchmark {name!r} is neither a packaged benchmark{hint} nor an existing file. Use one of "
        f"{', '.join(BENCHMARKS)}, or the path of a JSONL file with problem and answer fields.")


__all__ = ["BENCHMARKS", "Benchmark", "check_benchmark_name", "data_dir", "load_benchmark"]
