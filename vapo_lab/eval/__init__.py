"""Evaluation: the answer grader (shared with the reward), avg@k / pass@k / maj@k, benchmarks.

``grader`` and ``metrics`` import only the standard library and numpy. ``load_benchmark`` and
``Benchmark`` (``vapo_lab.eval.data``) are imported on first use: data.py imports
``vapo_lab.tasks``, which imports the grader from here, so an eager import would be circular.
"""

from __future__ import annotations

from typing import Any

from vapo_lab.eval.grader import (
    GradeResult,
    extract_answer,
    grade,
    grade_many,
    match_answer,
    normalize_answer,
)
from vapo_lab.eval.metrics import (
    avg_at_k,
    avg_at_k_se,
    bootstrap_ci,
    maj_at_k,
    pass_at_k,
    pass_at_k_table,
)

_LAZY = {"Benchmark", "BENCHMARKS", "load_benchmark"}


def __getattr__(name: str) -> Any:
    """Returns the lazily imported names of ``vapo_lab.eval.data`` (PEP 562)."""
    if name in _LAZY:
        from vapo_lab.eval import data

        return getattr(data, name)
    raise AttributeError(f"module 'vapo_lab.eval' has no attribute {name!r}")


__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "GradeResult",
    "avg_at_k",
    "avg_at_k_se",
    "bootstrap_ci",
    "extract_answer",
    "grade",
    "grade_many",
    "load_benchmark",
    "maj_at_k",
    "match_answer",
    "normalize_answer",
    "pass_at_k",
    "pass_at_k_table",
]
