r"""The answer grader shared by the reward and evaluation: extract the final answer, compare it.

``extract`` finds the final answer (the last ``\boxed{}``, else an ``Answer:`` line) and its
normalised key, ``symbolic`` guards and runs math-verify, ``workers`` are the grading processes
and ``match`` compares and grades (``match_answer``, ``grade``, ``grade_many``); what each set
accepts: docs/evaluation.md, Grading. Only the standard library is imported up front (math-verify,
which pulls sympy, on first symbolic comparison), so ``vapo_lab.tasks`` imports it cheaply.
"""

from __future__ import annotations

from vapo_lab.grading.extract import extract_answer, last_boxed, normalize_answer
from vapo_lab.grading.match import STATUSES, GradeResult, grade, grade_many, match_answer
from vapo_lab.grading.symbolic import SYMBOLIC_MAX_CHARS, SYMBOLIC_MAX_DEPTH, SYMBOLIC_MAX_DIGITS

__all__ = [
    "STATUSES",
    "SYMBOLIC_MAX_CHARS",
    "SYMBOLIC_MAX_DEPTH",
    "SYMBOLIC_MAX_DIGITS",
    "GradeResult",
    "extract_answer",
    "grade",
    "grade_many",
    "last_boxed",
    "match_answer",
    "normalize_answer",
]
