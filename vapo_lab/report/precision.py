"""How many digits the report writes of each kind of number: its one statement of precision.

A number is written to the digits it carries, not to the last bits of the float that holds it, so
the same runs give the same figures on any machine, whatever order numpy or scipy sums in. The
tables (table1.md, table1.tex, index.md, predictions_scored.md) keep the places below; table1.csv
keeps ``CSV``; report.json keeps ``JSON_DIGITS`` significant digits, so a reader can re-display it
at a table's precision. A figure rounded on an exact half can still come out one unit apart on two
machines: readers and tests take a written number as good to one unit in its last place.
"""

from __future__ import annotations

import math
from typing import Any

# held-out scores x100, their stds, intervals and differences: 256 problems x 4 samples move a
# score in steps of ~0.1
SCORE = 1
# Spearman ρ, Kendall τ-b and their intervals: over 10 rows one swapped pair moves ρ by ~0.01
CORRELATION = 2
DIAGNOSTIC = 3  # value bias, advantage gap, λ_policy, entropy: values from 0.001 to a few units
FRACTION = 4  # clip fractions: of the order of 1e-4 of the tokens
PERCENT = 0  # accuracy of a length bucket, in %: a bucket holds tens to a few thousand responses
# the share of responses with λ_policy = 0, in %: small for most runs, one place more than PERCENT
SHARE = 1
CSV = 4  # table1.csv: three places finer than the tables, for re-analysis
# report.json: significant digits, beyond any table's places, well above float64's noise (~1e-15)
JSON_DIGITS = 8
# report.json: no place below 1e-12, where a difference of equal means leaves only float noise
JSON_PLACES = 12


def fixed(value: float, places: int, signed: bool = False) -> str:
    """Returns ``value`` to ``places`` decimals, with its sign when ``signed``: "43.4", "+0.012"."""
    return f"{value:{'+' if signed else ''}.{places}f}"


def p_value(p: float) -> str:
    """Returns a p-value to two significant digits ("0.031"), "<0.0001" below 1e-4, "1" for 1."""
    if p >= 1:
        return "1"
    if p < 1e-4:
        return "<0.0001"
    return f"{p:.2g}" if p < 0.001 else f"{p:.2f}" if p >= 0.1 else f"{p:.3f}".rstrip("0")


def json_float(value: float) -> float:
    """Returns ``value`` at report.json's precision: ``JSON_DIGITS`` significant digits, no place
    below ``JSON_PLACES``; a zero is written unsigned, NaN and infinities are kept."""
    if not math.isfinite(value):
        return value
    return round(float(f"{value:.{JSON_DIGITS - 1}e}"), JSON_PLACES) + 0.0  # + 0.0: -0.0 is 0.0


def json_rounded(tree: Any) -> Any:
    """Returns report.json's data with every float at its precision; tuples become lists."""
    if isinstance(tree, float):
        return json_float(tree)
    if isinstance(tree, dict):
        return {k: json_rounded(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [json_rounded(v) for v in tree]
    return tree
