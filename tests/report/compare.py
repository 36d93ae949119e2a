"""Compares a remade report file with its committed copy: every word exactly, numbers to the
precision they are written at (``vapo_lab.report.precision``).

A written number is good to one unit in its last place: a value on an exact half (43.25 to one
place) rounds either way under a float's last bits, so two correct writings of the same result may
differ by that unit, never by more. A number with a decimal point (or a percentage) is such a
rounded value; an integer without one (a seed, a step, a count, a digit in an id) is exact, and so
is everything in a command: a backtick span or an indented code line is compared as it stands.
"""

from __future__ import annotations

import itertools
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

from vapo_lab.report.precision import JSON_DIGITS, JSON_PLACES

# a command (`...` or a 4-space code line), else a rounded number: a decimal, or an integer
# before "%"; not part of a word, an id or a dotted version ("a1.5", "2.13.0")
TOKEN = re.compile(
    r"(?P<literal>`[^`\n]*`|^(?: {4}|\t).*$)"
    r"|(?<![\w.])(?P<number>[+-]?\d+(?:\.\d+(?!\w|\.\d)|(?=%)))",
    re.MULTILINE,
)


def split_numbers(text: str) -> tuple[list[str], list[str]]:
    """Returns (the text between the rounded numbers, the numbers as written): ``n + 1`` pieces
    around ``n`` numbers, commands and integers kept in the pieces."""
    pieces, numbers, start = [], [], 0
    for m in TOKEN.finditer(text):
        if m.group("number") is not None:
            pieces.append(text[start : m.start()])
            numbers.append(m.group("number"))
            start = m.end()
    return pieces + [text[start:]], numbers


def _last_place(written: str) -> Decimal:
    """One unit in the last place of a number as written: "43.4" -> 0.1, "57" -> 1."""
    return Decimal(1).scaleb(Decimal(written).as_tuple().exponent)


def text_mismatches(made: str, committed: str) -> list[str]:
    """Returns how ``made`` differs from ``committed`` beyond the rounding of its numbers (empty
    when it does not): the text around the numbers must be equal, each number written to the same
    places and within one unit of the last of them. Reads in order and stops at the first
    difference of text (the numbers after it no longer pair up)."""
    (made_text, made_nums), (ref_text, ref_nums) = split_numbers(made), split_numbers(committed)
    out = []
    for k, (a, b) in enumerate(itertools.zip_longest(made_text, ref_text)):
        if a != b:
            a, b = ("<end>" if x is None else x[:200] for x in (a, b))
            return out + [f"text after number {k}: {a!r} != {b!r}"]
        if k < min(len(made_nums), len(ref_nums)):
            unit = _last_place(ref_nums[k])
            if (
                _last_place(made_nums[k]) != unit
                or abs(Decimal(made_nums[k]) - Decimal(ref_nums[k])) > unit
            ):
                out.append(
                    f"number {k}: {made_nums[k]} != {ref_nums[k]} "
                    f"(to one unit in its last place, {unit}), "
                    f"after {b[-60:]!r}"
                )
    return out


def _json_unit(value: Decimal) -> Decimal:
    """One unit in the last place report.json keeps of ``value``: its ``JSON_DIGITS``-th
    significant digit, never below 10^-``JSON_PLACES``."""
    floor = Decimal(1).scaleb(-JSON_PLACES)
    return (
        floor if value == 0 else max(floor, Decimal(1).scaleb(value.adjusted() - JSON_DIGITS + 1))
    )


def json_mismatches(made: Any, committed: Any, path: str = "$") -> list[str]:
    """Returns where two report.json trees (floats parsed as ``Decimal``) differ: keys in order,
    strings, ints, booleans and nulls exactly, floats to one unit of the last place kept."""
    if isinstance(committed, Decimal) and isinstance(made, Decimal):
        unit = _json_unit(committed)
        return (
            [] if abs(made - committed) <= unit else [f"{path}: {made} != {committed} (to {unit})"]
        )
    if type(made) is not type(committed):
        return [f"{path}: {made!r} != {committed!r}"]
    if isinstance(committed, dict):
        if list(made) != list(committed):
            return [f"{path}: keys {list(made)} != {list(committed)}"]
        return [m for k in committed for m in json_mismatches(made[k], committed[k], f"{path}.{k}")]
    if isinstance(committed, list):
        if len(made) != len(committed):
            return [f"{path}: {len(made)} items != {len(committed)}"]
        return [
            m
            for k, (a, b) in enumerate(zip(made, committed))
            for m in json_mismatches(a, b, f"{path}[{k}]")
        ]
    return [] if made == committed else [f"{path}: {made!r} != {committed!r}"]


def load_json(text: str) -> Any:
    """Parses report.json keeping each float as written (``Decimal``) and NaN/Infinity as words."""
    return json.loads(text, parse_float=Decimal, parse_constant=str)


def report_mismatches(made: Path, committed: Path, names: list[str]) -> dict[str, list[str]]:
    """Returns {file: its mismatches} for the files ``names`` of a remade report folder against the
    committed one, by ``json_mismatches`` for .json and ``text_mismatches`` for the others; the
    files that match are left out."""
    out = {}
    for name in names:
        a, b = (
            (made / name).read_text(encoding="utf-8"),
            (committed / name).read_text(encoding="utf-8"),
        )
        found = (
            json_mismatches(load_json(a), load_json(b))
            if name.endswith(".json")
            else text_mismatches(a, b)
        )
        if found:
            out[name] = found
    return out
