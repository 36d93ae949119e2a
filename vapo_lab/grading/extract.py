r"""Extracting a response's final answer and normalising answers into comparison keys.

``extract_answer`` reads the last ``\boxed{...}`` / ``\fbox{...}`` / ``\boxed 5``, else the last
``Answer:`` line (DAPO's format); ``normalize_answer`` gives keys that are equal only for equal
answers. Every scan is linear in the text: model output is untrusted and may be megabytes long.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# Greedy to the end of the line, stripped afterwards: a lazy `(.+?)\s*$` backtracks
# quadratically on a long run of spaces. Markdown bold may close between "Answer" and its colon
# (`**Answer**: 73`); the optional group is tried once per "Answer", so this stays linear.
_ANSWER_LINE = re.compile(
    r"Answer(?:[ \t]*(?:\*{1,3}|_{1,3}))?[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE
)
# Markdown bold/italic markers (and the spaces beside them) around an answer line's value
_EMPHASIS = "*_ \t"
# Whole-string wrappers whose content is the answer.
_WRAPPERS = (
    "\\text",
    "\\textbf",
    "\\textrm",
    "\\mathrm",
    "\\mathbf",
    "\\mbox",
    "\\boxed",
    "\\fbox",
)
# Spacing and sizing commands that never change a value (`\!` and `\,` also separate thousands).
_NOISE = re.compile(r"\\left(?![a-zA-Z])|\\right(?![a-zA-Z])|\\displaystyle|\\[!,;:]|\\ |\\\$")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°")
# A trailing unit: `5\text{ cm}`, `5.4 \text{ cents}`, `\frac{270}7\text{ degrees}`.
_UNIT = re.compile(r"^(.*?\S)\s*\\(?:text|mbox|mathrm)\s*\{[ a-zA-Z.]*\}$", re.DOTALL)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?")
_INTEGER = re.compile(r"([+-]?\d+)(?:\.0*)?")
_BRACE_OR_ESCAPE = re.compile(r"[\\{}]")


def matching_brace(text: str, open_at: int) -> int:
    """Returns the index of the ``}`` closing the ``{`` at ``open_at``, else -1 (unbalanced).

    A backslash escapes the next character, so ``\\{`` and ``\\}`` (set braces, possibly
    unpaired as in ``\\left\\{ ... \\right.``) do not count, while ``\\\\{`` (a line break then a
    group) does. The regex jumps over everything else, so a 1 MB answer is scanned in C.
    """
    depth = 0
    pos = open_at
    while (m := _BRACE_OR_ESCAPE.search(text, pos)) is not None:
        i = m.start()
        if text[i] == "\\":
            pos = i + 2
            continue
        if text[i] == "{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i
        pos = i + 1
    return -1


def last_boxed(text: str) -> str | None:
    r"""Returns the content of the last ``\boxed{...}`` or ``\fbox{...}`` (braces balanced), else
    None.

    The last wins: a chain of thought may box intermediate results first. ``\boxed 5`` gives the
    token up to the next space or ``$``. An unclosed last box, or a bare ``\boxed`` at the end,
    gives None: a truncated response has no answer.
    """
    found = {c: text.rfind(c) for c in _BOX_COMMANDS}
    while True:  # skip look-alike commands such as \boxedx, from the right; each rfind resumes
        start, name = max((at, c) for c, at in found.items())
        if start < 0:
            return None
        i = start + len(name)
        if not (i < len(text) and text[i].isalpha()):
            break
        found[name] = text.rfind(name, 0, start)
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        end = matching_brace(text, j)
        return text[j + 1 : end] if end >= 0 else None
    if j == i:  # `\boxed` at the very end or followed by a symbol: truncated
        return None
    k = j
    while k < len(text) and not text[k].isspace() and text[k] != "$":
        k += 1
    return text[j:k] if k > j else None


def extract_answer(text: str) -> str | None:
    r"""Returns the final answer of a response: the last box, else the last ``Answer:`` line.

    A box that is present but unbalanced gives None (the response was cut off inside its
    answer) rather than falling back to an earlier ``Answer:`` line; so does an empty box.
    """
    if any(c in text for c in _BOX_COMMANDS):
        boxed = (last_boxed(text) or "").strip()
        return boxed or None
    lines = _ANSWER_LINE.findall(text)
    value = _strip_emphasis(lines[-1]) if lines else ""
    return value or None


def _strip_emphasis(value: str) -> str:
    """Returns an answer line's value without Markdown emphasis: ``**73**.`` → ``73.``.

    Models bold the line in several ways (``**Answer:** 73``, ``Answer: **73**``), leaving markers
    at either end; no answer starts with ``*`` or ``_`` or ends with ``_``. A trailing ``*`` after
    ``^`` is kept: ``z^*`` is a conjugate.
    """
    s = value.strip().lstrip(_EMPHASIS)
    period = "." if s.endswith(".") else ""
    core = s[: len(s) - len(period)]
    kept = core.rstrip(_EMPHASIS)
    if kept.endswith("^") and core[len(kept) :].startswith("*"):
        kept += "*"
    return kept + period if kept else ""


def _unwrap(s: str) -> str:
    r"""Returns ``s`` without one layer of ``$...$``, ``\(...\)``, ``\[...\]`` or ``\text{...}``."""
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)]
    for name in _WRAPPERS:
        if s.startswith(name) and not s[len(name) : len(name) + 1].isalpha():
            j = len(name)
            while j < len(s) and s[j].isspace():
                j += 1
            if j < len(s) and s[j] == "{" and matching_brace(s, j) == len(s) - 1:
                return s[j + 1 : -1]
    return s


def normalize_answer(answer: str, integer: bool = False) -> str:
    r"""Returns the comparison key of an answer: cheap, value-preserving textual normalisation.

    Strips ``$``/``\(``/``\[`` and ``\text{}``/``\mbox{}``/``\boxed{}`` wrappers, trailing periods,
    ``\left``/``\right`` and spacing commands, degree signs, a trailing unit (``5\text{ cm}``),
    whitespace and thousands separators; ``\dfrac``/``\tfrac`` become ``\frac``; an integer
    literal is written canonically (``025`` → ``25``, ``3.0`` → ``3``). With ``integer``, the
    part after the last ``=`` is kept and a percent sign dropped (``m+n=25``, ``25\%`` → ``25``).
    Equal keys mean equal answers, so the keys also group answers for majority voting.
    """
    s = answer.strip().replace("\u2212", "-")
    for _ in range(8):  # nested wrappers; bounded, as adversarial nesting would cost O(n²)
        previous = s
        s = _unwrap(s).strip().rstrip(".").strip()
        s = _NOISE.sub(" ", s).strip()
        s = _DEGREES.sub("", s).strip()
        unit = _UNIT.match(s)
        if unit:
            s = unit.group(1)
        if s == previous:
            break
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\s+", "", s)
    if integer:  # an integer set: "m+n=25" and GSM8K's "25%" mean 25
        s = s.rsplit("=", 1)[-1].removesuffix("\\%").removesuffix("%")
    if _THOUSANDS.fullmatch(s):
        s = s.replace("{,}", "").replace(",", "")
    value = as_int(s)
    return str(value) if value is not None else s


def as_int(key: str) -> int | None:
    """Returns the integer a normalised key spells (``-12``, ``007``, ``3.00``), else None."""
    match = _INTEGER.fullmatch(key)
    # int() refuses > 4300 digits; no answer is that long
    if not match or len(match.group(1)) > 4000:
        return None
    return int(match.group(1))


__all__ = [
    "as_int",
    "extract_answer",
    "last_boxed",
    "matching_brace",
    "normalize_answer",
]
