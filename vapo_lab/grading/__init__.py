r"""The answer grader shared by the reward and evaluation: extract the final answer, compare it.

``extract_answer`` reads the last ``\boxed{...}`` / ``\fbox{...}`` / ``\boxed 5`` of a response,
else its last ``Answer:`` line (DAPO's format). ``grade`` compares the answer with the reference:

* integer-answer sets (AIME, GSM8K): the answer must normalise to an integer literal (leading
  zeros, ``1,000``, ``^\circ``, ``\text{}``, ``$...$`` and a trailing period tolerated), compared
  exactly; anything else is wrong, with no symbolic parsing;
* other sets (MATH-500): equal after cheap normalisation, else math-verify's symbolic
  equivalence (``math_verify.parse`` / ``verify``), unless a cheap pre-check finds the answer too
  long, too deeply nested or holding too large an integer power for sympy (see
  ``symbolic.symbolic_refusal``): such an answer is compared as text only.

``grade_many`` grades a batch in worker processes with a per-sample time limit: sympy can hang on
adversarial output, and a hung or crashed sample is reported and counted wrong without stopping
the rest. ``grade`` is bounded on any thread: math-verify's own limit (SIGALRM) in the main
thread, a worker process killed at the limit in any other. Model output is only ever parsed as
text, never passed to ``eval``/``exec``.

Modules: ``extract`` (final answer, normalised keys), ``symbolic`` (math-verify and the
pre-checks guarding it), ``workers`` (the grading processes), ``match`` (``match_answer``,
``grade``, ``grade_many``). The package imports only the standard library at import time
(math-verify, which pulls sympy, is imported on first symbolic comparison), so
``vapo_lab.tasks`` can import it cheaply.
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
