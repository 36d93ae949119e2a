"""Symbolic comparison through math-verify (sympy), and the pre-checks that refuse it an answer.

``symbolic_refusal`` measures an answer without parsing it (length, nesting depth, digits of its
largest integer power); ``math_verify_equal`` is the comparison itself.
"""

from __future__ import annotations

import math
import re

from vapo_lab.grading.extract import matching_brace

_GROUPING = re.compile(r"\\.|[{(\[]|[})\]]", re.DOTALL)
_POWER = re.compile(r"(?<![0-9.])([0-9]+)\s*\^\s*")  # an integer base and its ^
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: \d also matches other scripts' digits

# Limits of the pre-checks: math-verify's time grows with an answer's length and steeply with its
# nesting (docs/benchmarks.md#grading), and sympy evaluates integer powers eagerly (9^{9^9} has
# 369,693,100 digits). MATH-500's references are at most 53 characters long and nested at most 2
# deep; an answer past a limit is compared as text only, so it can still equal the reference.
SYMBOLIC_MAX_CHARS = 400  # after runs of whitespace collapse; or 4x the reference's length, if more
SYMBOLIC_MAX_DEPTH = 8  # ( [ { nested (unescaped); a 3-deep continued fraction is 3
SYMBOLIC_MAX_DIGITS = 10_000  # digits of an integer power such as 2^{33219}; int() stops at 4,300


def _nesting_depth(text: str) -> int:
    """Returns how deep unescaped ``(``, ``[`` and ``{`` nest in ``text``, stray closers ignored."""
    depth = deepest = 0
    for m in _GROUPING.finditer(text):
        ch = m.group()
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return deepest


def _int_log10(digits: str) -> float:
    """Returns log10 of the integer a digit string spells (-inf for 0), without a huge int."""
    digits = digits.lstrip("0")
    if not digits:
        return -math.inf
    if len(digits) <= 300:
        return math.log10(int(digits))
    return len(digits) - 15 + math.log10(int(digits[:15]))  # leading 15 digits, shifted


def _tower_log10(text: str, at: int) -> tuple[float, int] | None:
    """Returns (log10 of the value, end index) of the integer power at ``at`` (``9^{9^{9}}``).

    ``text[at:]`` must start with an integer base and ``^``; the exponent is ``{...}`` holding an
    integer or another such power, or a bare digit run (math-verify reads ``2^10`` as 2^10).
    Anything else (``9^{x}``, ``9^{-1}``, ``9^{2n}``) is not an integer power: None. The log10 is
    inf when it overflows a float.
    """
    m = _POWER.match(text, at)
    if m is None:
        return None
    j = m.end()
    if j < len(text) and text[j] == "{":
        end = matching_brace(text, j)
        if end < 0:
            return None
        exponent, stop = text[j + 1 : end].strip(), end + 1
    else:
        run = _DIGITS.match(text, j)
        if run is None:
            return None
        exponent, stop = run.group(), run.end()
    if _DIGITS.fullmatch(exponent):
        exp_log10 = _int_log10(exponent)
    else:
        inner = _tower_log10(exponent, 0)
        if inner is None or inner[1] != len(exponent):
            return None
        exp_log10 = inner[0]
    base_log10 = _int_log10(m.group(1))
    if base_log10 <= 0 or exp_log10 == -math.inf:  # 0^E, 1^E or b^0: 0 or 1
        return 0.0, stop
    # log10(b^E) = E·log10(b), with E = 10^log10(E)
    return (math.inf if exp_log10 > 300 else 10.0**exp_log10 * base_log10), stop


def _power_digits(text: str) -> float:
    """Returns the digit count of the largest integer power in ``text`` (0 if none; may be inf).

    ``2^{10}`` = 1024: 4; ``9^{9^{9}}`` = 9^387420489: ⌊387420489·log10 9⌋ + 1 = 369,693,100.
    """
    largest = 0.0
    for m in _POWER.finditer(text):
        tower = _tower_log10(text, m.start())
        if tower is not None:
            largest = max(largest, math.inf if math.isinf(tower[0]) else math.floor(tower[0]) + 1)
    return largest


def symbolic_refusal(answer: str, reference: str) -> str | None:
    """Returns why sympy should not see ``answer`` (too long, nested or large), else None.

    ``answer`` has its whitespace runs collapsed already. The limits (``SYMBOLIC_MAX_*``) are far
    beyond any reference answer and below what sympy does in a fraction of the time limit.
    """
    if len(answer) > max(SYMBOLIC_MAX_CHARS, 4 * len(reference)):
        return f"{len(answer)} characters"
    depth = _nesting_depth(answer)
    if depth > SYMBOLIC_MAX_DEPTH:
        return f"nested {depth} deep"
    digits = _power_digits(answer)
    if digits > SYMBOLIC_MAX_DIGITS:
        return f"an integer power of {digits:.0f} digits"
    return None


def math_verify_equal(answer: str, reference: str, timeout_s: float | None) -> bool:
    """Returns math-verify's verdict, with its own SIGALRM limit (main thread only) or none."""
    from math_verify import parse, verify

    def wrap(s: str) -> str:
        return s if "$" in s else f"${s}$"

    gold = parse(wrap(reference), parsing_timeout=timeout_s)
    pred = parse(wrap(answer), parsing_timeout=timeout_s)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout_s))


__all__ = [
    "SYMBOLIC_MAX_CHARS",
    "SYMBOLIC_MAX_DEPTH",
    "SYMBOLIC_MAX_DIGITS",
    "math_verify_equal",
    "symbolic_refusal",
]
