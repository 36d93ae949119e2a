r"""The answer grader shared by the reward and evaluation: extract the final answer, compare it.

``extract_answer`` reads the last ``\boxed{...}`` / ``\fbox{...}`` / ``\boxed 5`` of a response,
else its last ``Answer:`` line (DAPO's format). ``grade`` compares the answer with the reference:

* integer-answer sets (AIME, GSM8K): the answer must normalise to an integer literal (leading
  zeros, ``1,000``, ``^\circ``, ``\text{}``, ``$...$`` and a trailing period tolerated), compared
  exactly; anything else is wrong, with no symbolic parsing;
* other sets (MATH-500): equal after cheap normalisation, else math-verify's symbolic
  equivalence (``math_verify.parse`` / ``verify``).

``grade_many`` grades a batch in worker processes with a per-sample time limit: sympy can hang on
adversarial output, and a hung or crashed sample is reported and counted wrong without stopping
the rest. Model output is only ever parsed as text, never passed to ``eval``/``exec``.

This module imports only the standard library at import time (math-verify, which pulls sympy,
is imported on first symbolic comparison), so ``vapo_lab.tasks`` can import it cheaply.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

STATUSES = ("ok", "no_answer", "timeout", "error")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# Greedy to the end of the line (`.` stops at a newline), stripped afterwards: a lazy `(.+?)\s*$`
# backtracks quadratically on a long run of spaces.
_ANSWER_LINE = re.compile(r"Answer[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE)
# Whole-string wrappers whose content is the answer.
_WRAPPERS = ("\\text", "\\textbf", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox", "\\boxed", "\\fbox")
# Spacing and sizing commands that never change a value (`\!` and `\,` also separate thousands).
_NOISE = re.compile(r"\\left(?![a-zA-Z])|\\right(?![a-zA-Z])|\\displaystyle|\\[!,;:]|\\ |\\\$")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°")
# A trailing unit: `5\text{ cm}`, `5.4 \text{ cents}`, `\frac{270}7\text{ degrees}`.
_UNIT = re.compile(r"^(.*?\S)\s*\\(?:text|mbox|mathrm)\s*\{[ a-zA-Z.]*\}$", re.DOTALL)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?")
_INTEGER = re.compile(r"([+-]?\d+)(?:\.0*)?")


def _matching_brace(text: str, open_at: int) -> int:
    """Returns the index of the ``}`` closing the ``{`` at ``open_at``, else -1 (unbalanced).

    A backslash escapes the next character, so ``\\{`` and ``\\}`` (set braces, possibly
    unpaired as in ``\\left\\{ ... \\right.``) do not count, while ``\\\\{`` (a line break then a
    group) does.
    """
    depth = 0
    i = open_at
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def last_boxed(text: str) -> str | None:
    r"""Returns the content of the last ``\boxed{...}`` or ``\fbox{...}`` (braces balanced), else None.

    The last one wins because a chain of thought may box intermediate results before the final
    answer. The space form ``\boxed 5`` gives the token up to the next space or ``$``. An
    unclosed last box, or a bare ``\boxed`` at the end, gives None: a truncated response has no
    answer.
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
        end = _matching_brace(text, j)
        return text[j + 1:end] if end >= 0 else None
    if j == i:  # `\boxed` at the very end or followed by a symbol: truncated
        return None
    k = j
    while k < len(text) and not text[k].isspace() and text[k] != "$":
        k += 1
    return text[j:k] if k > j else None


def extract_answer(text: str) -> str | None:
    r"""Returns the final answer of a response: the last box, else the last ``Answer:`` line, else None.

    A box that is present but unbalanced gives None (the response was cut off inside its
    answer) rather than falling back to an earlier ``Answer:`` line; so does an empty box.
    """
    if any(c in text for c in _BOX_COMMANDS):
        boxed = (last_boxed(text) or "").strip()
        return boxed or None
    lines = [m.strip() for m in _ANSWER_LINE.findall(text)]
    return lines[-1] if lines and lines[-1] else None


def _unwrap(s: str) -> str:
    r"""Returns ``s`` without one layer of ``$...$``, ``\(...\)``, ``\[...\]`` or ``\text{...}``-like wrapper."""
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left):len(s) - len(right)]
    for name in _WRAPPERS:
        if s.startswith(name) and not s[len(name):len(name) + 1].isalpha():
            j = len(name)
            while j < len(s) and s[j].isspace():
                j += 1
            if j < len(s) and s[j] == "{" and _matching_brace(s, j) == len(s) - 1:
                return s[j + 1:-1]
    return s


def normalize_answer(answer: str, integer: bool = False) -> str:
    r"""Returns the comparison key of an answer: cheap, value-preserving textual normalisation.

    Strips ``$``/``\(``/``\[`` and ``\text{}``/``\mbox{}``/``\boxed{}`` wrappers, trailing periods,
    ``\left``/``\right`` and spacing commands, degree signs, a trailing unit (``5\text{ cm}``),
    whitespace and thousands separators; ``\dfrac``/``\tfrac`` become ``\frac``; an integer
    literal is written canonically (``025`` → ``25``, ``3.0`` → ``3``). With ``integer``, the
    part after the last ``=`` is kept and a percent sign dropped (``m+n=25``, ``25\%`` → ``25``). Equal keys mean equal answers, so
    the keys also group answers for majority voting.
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
    value = _as_int(s)
    return str(value) if value is not None else s


def _as_int(key: str) -> int | None:
    """Returns the integer a normalised key spells (``-12``, ``007``, ``3.00``), else None."""
    match = _INTEGER.fullmatch(key)
    if not match or len(match.group(1)) > 4000:  # int() refuses > 4300 digits; no answer is that long
        return None
    return int(match.group(1))


def _symbolic_equal(answer: str, reference: str, timeout_s: int | None) -> bool:
    """Returns math-verify's verdict on ``answer`` ≡ ``reference``; False when either fails to parse.

    ``timeout_s`` is math-verify's own SIGALRM limit; it only works in a main thread, so it is
    dropped elsewhere (``grade_many`` enforces its limit by killing the worker instead).
    """
    from math_verify import parse, verify

    if threading.current_thread() is not threading.main_thread():
        timeout_s = None
    wrap = lambda s: s if "$" in s else f"${s}$"
    gold = parse(wrap(reference), parsing_timeout=timeout_s)
    pred = parse(wrap(answer), parsing_timeout=timeout_s)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout_s))


def match_answer(answer: str, reference: str, integer: bool = False, timeout_s: int | None = 5) -> bool:
    """Returns True iff the extracted ``answer`` equals ``reference``.

    Equal normalised keys → True. Both integers → exact integer comparison. Otherwise, with
    ``integer`` → False (an AIME answer that is not an integer literal is wrong, whatever it
    evaluates to); without → math-verify symbolic equivalence. An ``integer`` set whose
    reference is not an integer falls back to math-verify too.
    """
    key, ref_key = normalize_answer(answer, integer), normalize_answer(reference, integer)
    if key and key == ref_key:
        return True
    value, ref_value = _as_int(key), _as_int(ref_key)
    if value is not None and ref_value is not None:
        return value == ref_value
    if integer and ref_value is not None:
        return False
    return _symbolic_equal(answer, reference, timeout_s)


def grade(response: str, reference: str, integer: bool = False, timeout_s: int | None = 5) -> bool:
    """Returns True iff the final answer of ``response`` equals ``reference`` (see ``match_answer``).

    In-process (the reward's path), bounded only by math-verify's own alarm (main thread) and
    never raising: an error in the comparison grades the response wrong. ``grade_many`` also
    survives hangs and crashes, and reports them.
    """
    try:
        answer = extract_answer(response)
        return answer is not None and match_answer(answer, reference, integer, timeout_s)
    except Exception:  # noqa: BLE001 - adversarial output must never stop training
        return False


@dataclass(frozen=True)
class GradeResult:
    """The grading of one response.

    Attributes:
        answer: the extracted final answer, None when there is none (or the worker hung/died).
        correct: True iff the answer equals the reference; False for every status but "ok".
        status: "ok" (graded), "no_answer", "timeout" (over the limit, worker killed) or
            "error" (the comparison raised, or the worker process died).
        detail: why, for "timeout" and "error".
    """

    answer: str | None
    correct: bool
    status: str
    detail: str = ""


# The comparison the workers run: no SIGALRM of math-verify's, the worker is killed instead, so
# a slow sample is reported as "timeout" rather than silently graded wrong.
_match_in_worker = functools.partial(match_answer, timeout_s=None)


def _grade_one(response: str, reference: str, integer: bool,
               match_fn: Callable[[str, str, bool], bool]) -> tuple[str | None, bool, str, str]:
    """Returns the fields of a GradeResult for one sample; exceptions become status "error"."""
    answer = None
    try:
        answer = extract_answer(response)
        if answer is None:
            return None, False, "no_answer", ""
        return answer, bool(match_fn(answer, reference, integer)), "ok", ""
    except Exception as e:  # noqa: BLE001 - one bad sample must not stop the batch
        return answer, False, "error", f"{type(e).__name__}: {e}"[:500]


def _worker(conn: Connection, match_fn: Callable[[str, str, bool], bool], warm_up: bool) -> None:
    """Grades chunks ``[(response, reference, integer), ...]`` from ``conn``, one reply per sample.

    Says "ready" once warm (math-verify imported and its parser built, ~0.2 s the first time), so
    that start-up is not charged to the first sample's time limit. A reply per sample tells the
    parent when each sample starts; None or a closed pipe ends the worker.
    """
    # math-verify warns once per process that its own alarm is off: here that is by design
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(lambda record: "Timeout is disabled" not in record.getMessage())
    if warm_up:
        _grade_one("\\boxed{\\frac{1}{2}}", "0.5", False, match_fn)
    conn.send("ready")
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for response, reference, integer in chunk:
            conn.send(_grade_one(response, reference, integer, match_fn))


def _context() -> Any:
    """Returns the multiprocessing context: forkserver where available (safe under torch), else spawn.

    The fork server imports math-verify once, so a replacement for a killed worker starts in
    milliseconds rather than re-importing sympy.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["vapo_lab.eval.grader", "math_verify"])
        return ctx
    return multiprocessing.get_context("spawn")


class _Slot:
    """One worker process and the chunk it is grading: ``chunk[pos]`` is in progress since ``since``."""

    def __init__(self, ctx: Any, match_fn: Callable[[str, str, bool], bool], warm_up: bool) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, match_fn, warm_up), daemon=True)
        self.proc.start()
        child.close()
        self.state = "starting"  # then "idle" / "busy"
        self.chunk: list[int] = []
        self.pos = 0
        self.since = time.monotonic()

    def stop(self, kill: bool) -> None:
        """Ends the process: politely (None, then a short join) or with SIGKILL."""
        if not kill:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(timeout=1.0)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def grade_many(responses: Sequence[str], references: Sequence[str], integer: bool,
               timeout_s: float = 5.0, workers: int | None = None,
               match_fn: Callable[[str, str, bool], bool] | None = None,
               start_timeout_s: float = 120.0) -> list[GradeResult]:
    """Returns one GradeResult per response, graded in worker processes with a per-sample time limit.

    Samples go to the workers in chunks (few round trips for the common, fast case); each sample
    has ``timeout_s`` seconds from the end of the previous one. A worker over the limit is
    killed and replaced, its sample is marked "timeout" and the rest of its chunk is requeued; a
    worker that dies marks its sample "error" the same way. Either way the sample counts wrong.

    Args:
        responses: model outputs, untrusted.
        references: reference answers, one per response.
        integer: grade as an integer-answer set (see ``match_answer``).
        timeout_s: per-sample limit in seconds.
        workers: worker processes; default min(4, CPU count).
        match_fn: test hook: a picklable module-level ``(answer, reference, integer) -> bool`` run
            in the workers in place of ``match_answer``. Only the caller can set it, never the
            model output.
        start_timeout_s: limit for a worker to start and warm up.

    Raises:
        ValueError: lengths differ or ``timeout_s`` <= 0.
        RuntimeError: a worker could not start (an environment problem, not a sample's).
    """
    if len(responses) != len(references):
        raise ValueError(f"{len(responses)} responses but {len(references)} references")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0")
    n = len(responses)
    if n == 0:
        return []
    workers = workers or min(4, os.cpu_count() or 1)
    # ~4 chunks per worker balance the load; 64 bounds the work requeued after a kill
    size = max(1, min(64, n // (4 * workers)))
    queue = deque(list(range(i, min(i + size, n))) for i in range(0, n, size))
    match_fn = match_fn or _match_in_worker
    ctx = _context()
    start = lambda: _Slot(ctx, match_fn, warm_up=not integer)
    slots = [start() for _ in range(min(workers, len(queue)))]
    results: list[GradeResult | None] = [None] * n
    remaining = n

    def retire(k: int, status: str, detail: str) -> None:
        """Marks the sample in progress on slot k, requeues the rest of its chunk, replaces the worker."""
        nonlocal remaining
        slot = slots[k]
        slot.stop(kill=True)
        results[slot.chunk[slot.pos]] = GradeResult(None, False, status, detail)
        remaining -= 1
        if slot.pos + 1 < len(slot.chunk):
            queue.appendleft(slot.chunk[slot.pos + 1:])
        slots[k] = start()

    def limit(slot: _Slot) -> float:
        """Returns the time by which the slot must have said something."""
        return slot.since + (start_timeout_s if slot.state == "starting" else timeout_s)

    try:
        while remaining:
            for k, slot in enumerate(slots):
                if slot.state == "idle" and queue:
                    chunk = queue.popleft()
                    try:
                        slot.conn.send([(responses[i], references[i], integer) for i in chunk])
                    except OSError:  # died while idle (e.g. the OOM killer): no sample to blame
                        queue.appendleft(chunk)
                        slot.stop(kill=True)
                        slots[k] = start()
                        continue
                    slot.chunk, slot.pos, slot.state, slot.since = chunk, 0, "busy", time.monotonic()
            active = [k for k, s in enumerate(slots) if s.state != "idle"]
            deadline = min(limit(slots[k]) for k in active)
            ready = wait([slots[k].conn for k in active], timeout=max(0.0, deadline - time.monotonic()))
            for k in active:
                slot = slots[k]
                if slot.conn not in ready:
                    continue
                try:
                    while slot.conn.poll():
                        message = slot.conn.recv()
                        if slot.state == "starting":
                            slot.state = "idle"
                            continue
                        results[slot.chunk[slot.pos]] = GradeResult(*message)
                        remaining -= 1
                        slot.pos += 1
                        slot.since = time.monotonic()
                        if slot.pos == len(slot.chunk):
                            slot.state = "idle"
                            break
                except (EOFError, OSError):
                    slot.proc.join()
                    if slot.state == "starting":
                        raise RuntimeError(
                            f"a grading worker exited with code {slot.proc.exitcode} before it was ready") from None
                    retire(k, "error", f"grading process died (exit code {slot.proc.exitcode})")
            now = time.monotonic()
            for k, slot in enumerate(slots):
                if slot.state == "starting" and now > limit(slot):
                    raise RuntimeError(f"a grading worker did not start within {start_timeout_s} s")
                if slot.state == "busy" and now > limit(slot):
                    retire(k, "timeout", f"grading took longer than {timeout_s} s")
    finally:
        for slot in slots:
            slot.stop(kill=slot.state != "idle")
    return results  # type: ignore[return-value] - every entry is set when remaining reaches 0


__all__ = [
    "STATUSES",
    "GradeResult",
    "extract_answer",
    "grade",
    "grade_many",
    "last_boxed",
    "match_answer",
    "normalize_answer",
]
