r"""The answer grader shared by the reward and evaluation: extract the final answer, compare it.

``extract_answer`` reads the last ``\boxed{...}`` / ``\fbox{...}`` / ``\boxed 5`` of a response,
else its last ``Answer:`` line (DAPO's format). ``grade`` compares the answer with the reference:

* integer-answer sets (AIME, GSM8K): the answer must normalise to an integer literal (leading
  zeros, ``1,000``, ``^\circ``, ``\text{}``, ``$...$`` and a trailing period tolerated), compared
  exactly; anything else is wrong, with no symbolic parsing;
* other sets (MATH-500): equal after cheap normalisation, else math-verify's symbolic
  equivalence (``math_verify.parse`` / ``verify``), unless a cheap pre-check finds the answer too
  long, too deeply nested or holding too large an integer power for sympy (see
  ``_symbolic_refusal``): such an answer is compared as text only.

``grade_many`` grades a batch in worker processes with a per-sample time limit: sympy can hang on
adversarial output, and a hung or crashed sample is reported and counted wrong without stopping
the rest. ``grade`` is bounded on any thread: math-verify's own limit (SIGALRM) in the main
thread, a worker process killed at the limit in any other. Model output is only ever parsed as
text, never passed to ``eval``/``exec``.

This module imports only the standard library at import time (math-verify, which pulls sympy,
is imported on first symbolic comparison), so ``vapo_lab.tasks`` can import it cheaply.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

STATUSES = ("ok", "no_answer", "timeout", "error")

_log = logging.getLogger(__name__)

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# Greedy to the end of the line (`.` stops at a newline), stripped afterwards: a lazy `(.+?)\s*$`
# backtracks quadratically on a long run of spaces. Markdown bold may close between "Answer" and
# its colon (`**Answer**: 73`); the optional group is tried once per "Answer", so this stays linear.
_ANSWER_LINE = re.compile(r"Answer(?:[ \t]*(?:\*{1,3}|_{1,3}))?[ \t]*:(.*)$", re.IGNORECASE | re.MULTILINE)
_EMPHASIS = "*_ \t"  # Markdown bold/italic markers (and the spaces beside them) around an answer line's value
# Whole-string wrappers whose content is the answer.
_WRAPPERS = ("\\text", "\\textbf", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox", "\\boxed", "\\fbox")
# Spacing and sizing commands that never change a value (`\!` and `\,` also separate thousands).
_NOISE = re.compile(r"\\left(?![a-zA-Z])|\\right(?![a-zA-Z])|\\displaystyle|\\[!,;:]|\\ |\\\$")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°")
# A trailing unit: `5\text{ cm}`, `5.4 \text{ cents}`, `\frac{270}7\text{ degrees}`.
_UNIT = re.compile(r"^(.*?\S)\s*\\(?:text|mbox|mathrm)\s*\{[ a-zA-Z.]*\}$", re.DOTALL)
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:(?:,|\{,\})\d{3})+(?:\.\d+)?")
_INTEGER = re.compile(r"([+-]?\d+)(?:\.0*)?")
_BRACE_OR_ESCAPE = re.compile(r"[\\{}]")
_GROUPING = re.compile(r"\\.|[{(\[]|[})\]]", re.DOTALL)
_POWER = re.compile(r"(?<![0-9.])([0-9]+)\s*\^\s*")  # an integer base and its ^
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: \d also matches other scripts' digits

# Pre-checks before math-verify (sympy), whose time grows with an answer's length and steeply with
# its nesting (on 2 shared CPU cores: a 1,000-character sum 1 s, braces nested 10 deep 1 s and 20
# deep over 20 s), and which evaluates integer powers eagerly (9^{9^9} has 369,693,100 digits).
# MATH-500's references are at most 53 characters long and nested at most 2 deep; an answer past
# a limit is compared as text only (its normalised key), so it can still equal the reference.
SYMBOLIC_MAX_CHARS = 400  # after runs of whitespace collapse; or 4x the reference's length, if more
SYMBOLIC_MAX_DEPTH = 8  # ( [ { nested (unescaped); a 3-deep continued fraction is 3
SYMBOLIC_MAX_DIGITS = 10_000  # digits of an integer power such as 2^{33219}; int() stops at 4,300


def _matching_brace(text: str, open_at: int) -> int:
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
    lines = _ANSWER_LINE.findall(text)
    value = _strip_emphasis(lines[-1]) if lines else ""
    return value or None


def _strip_emphasis(value: str) -> str:
    """Returns an answer line's value without Markdown emphasis: ``** 73`` and ``**73**.`` → ``73`` / ``73.``.

    Models bold the answer line in several ways (``**Answer:** 73``, ``**Answer: 73**``,
    ``Answer: **73**``), leaving markers at either end of the value; no answer starts with ``*`` or
    ``_`` or ends with ``_``. A trailing ``*`` after ``^`` is kept: ``z^*`` is a conjugate.
    """
    s = value.strip().lstrip(_EMPHASIS)
    period = "." if s.endswith(".") else ""
    core = s[:len(s) - len(period)]
    kept = core.rstrip(_EMPHASIS)
    if kept.endswith("^") and core[len(kept):].startswith("*"):
        kept += "*"
    return kept + period if kept else ""


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


def _nesting_depth(text: str) -> int:
    """Returns how deep unescaped ``(``, ``[`` and ``{`` nest in ``text`` (a stray closer counts nothing)."""
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
    """Returns log10 of the integer a digit string spells (-inf for 0), without building a huge int."""
    digits = digits.lstrip("0")
    if not digits:
        return -math.inf
    if len(digits) <= 300:
        return math.log10(int(digits))
    return len(digits) - 15 + math.log10(int(digits[:15]))  # leading 15 digits, shifted


def _tower_log10(text: str, at: int) -> tuple[float, int] | None:
    """Returns (log10 of the value, end index) of the integer power at ``at`` (``9^{9^{9}}``), else None.

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
        end = _matching_brace(text, j)
        if end < 0:
            return None
        exponent, stop = text[j + 1:end].strip(), end + 1
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
    return (math.inf if exp_log10 > 300 else 10.0 ** exp_log10 * base_log10), stop


def _power_digits(text: str) -> float:
    """Returns the digit count of the largest integer power written in ``text`` (0 if none; may be inf).

    ``2^{10}`` = 1024: 4; ``9^{9^{9}}`` = 9^387420489: ⌊387420489·log10 9⌋ + 1 = 369,693,100.
    """
    largest = 0.0
    for m in _POWER.finditer(text):
        tower = _tower_log10(text, m.start())
        if tower is not None:
            largest = max(largest, math.inf if math.isinf(tower[0]) else math.floor(tower[0]) + 1)
    return largest


def _symbolic_refusal(answer: str, reference: str) -> str | None:
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


def _symbolic_equal(answer: str, reference: str, timeout_s: float | None) -> bool:
    """Returns math-verify's verdict on ``answer`` ≡ ``reference``; False if either fails to parse or times out.

    The limit holds on every thread. ``timeout_s`` None: no limit here, the caller bounds the
    process (``grade_many`` kills its worker). Main thread: math-verify's own SIGALRM limit. Any
    other thread (or no SIGALRM, as on Windows): the comparison runs in a worker process that is
    killed at the limit, because no in-process bound can stop sympy there (it may hold the GIL
    for minutes expanding a power tower). A comparison over the limit counts False and is logged.
    """
    if timeout_s is None:
        return _math_verify_equal(answer, reference, None)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM"):
        return _math_verify_equal(answer, reference, timeout_s)
    verdict = _OFF_MAIN_THREAD.equal(answer, reference, timeout_s)
    if verdict is None:
        _log.warning("grading took over %s s (off the main thread): counted wrong: %.200s", timeout_s, answer)
        return False
    return verdict


def _math_verify_equal(answer: str, reference: str, timeout_s: float | None) -> bool:
    """Returns math-verify's verdict, with its own SIGALRM limit (main thread only) or none."""
    from math_verify import parse, verify

    wrap = lambda s: s if "$" in s else f"${s}$"
    gold = parse(wrap(reference), parsing_timeout=timeout_s)
    pred = parse(wrap(answer), parsing_timeout=timeout_s)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout_s))


def match_answer(answer: str, reference: str, integer: bool = False, timeout_s: float | None = 5) -> bool:
    """Returns True iff the extracted ``answer`` equals ``reference``.

    Equal normalised keys → True. Both integers → exact integer comparison. Otherwise, with
    ``integer`` → False (an AIME answer that is not an integer literal is wrong, whatever it
    evaluates to); without → math-verify symbolic equivalence. An ``integer`` set whose
    reference is not an integer falls back to math-verify too. An answer that fails a pre-check
    (``_symbolic_refusal``: over 400 characters, nested over 8 deep, or an integer power over
    10,000 digits) never reaches math-verify: its key did not equal the reference's, so False.
    ``timeout_s`` bounds math-verify on any thread (see ``_symbolic_equal``); None: unbounded.
    """
    key, ref_key = normalize_answer(answer, integer), normalize_answer(reference, integer)
    if key and key == ref_key:
        return True
    value, ref_value = _as_int(key), _as_int(ref_key)
    if value is not None and ref_value is not None:
        return value == ref_value
    if integer and ref_value is not None:
        return False
    compact = re.sub(r"\s+", " ", answer).strip()  # LaTeX reads a run of spaces as one
    if _symbolic_refusal(compact, reference) is not None:
        return False
    return _symbolic_equal(compact, reference, timeout_s)


def grade(response: str, reference: str, integer: bool = False, timeout_s: float | None = 5) -> bool:
    """Returns True iff the final answer of ``response`` equals ``reference`` (see ``match_answer``).

    In-process (the reward's path), bounded by ``timeout_s`` on any thread (math-verify's alarm
    in the main thread, a killed worker process elsewhere) and never raising: an error or a
    timeout grades the response wrong (a timeout is logged). ``grade_many`` also survives hangs
    and crashes, and reports them per sample.
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

# A job for ``_worker``: (response or answer, reference, integer) -> the fields of a GradeResult.
_Job = Callable[[str, str, bool], tuple[Any, ...]]


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


def _compare_one(answer: str, reference: str, integer: bool) -> tuple[str, bool, str, str]:
    """Returns the fields of a GradeResult for math-verify on an extracted ``answer``, unbounded here.

    The job of ``_OffMainThread``'s workers (``integer`` is unused: only the symbolic step comes here).
    """
    try:
        return answer, bool(_math_verify_equal(answer, reference, None)), "ok", ""
    except Exception as e:  # noqa: BLE001 - reported to the caller as "error"
        return answer, False, "error", f"{type(e).__name__}: {e}"[:500]


def _worker(conn: Connection, job: _Job, warm_up: bool) -> None:
    """Runs ``job`` on chunks ``[(response, reference, integer), ...]`` from ``conn``, one reply per sample.

    Says "ready" once warm (math-verify imported and its parser built, ~0.2 s the first time), so
    that start-up is not charged to the first sample's time limit. A reply per sample tells the
    parent when each sample starts; None or a closed pipe ends the worker.
    """
    # math-verify warns once per process that its own alarm is off: here that is by design
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(lambda record: "Timeout is disabled" not in record.getMessage())
    if warm_up:
        job("\\boxed{\\frac{1}{2}}", "0.5", False)
    conn.send("ready")
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for response, reference, integer in chunk:
            conn.send(job(response, reference, integer))


def _context() -> Any:
    """Returns the multiprocessing context: forkserver where available (safe under torch), else spawn.

    The fork server imports math-verify once, so a replacement for a killed worker starts in
    milliseconds rather than re-importing sympy.
    """
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["vapo_lab.grading", "math_verify"])
        return ctx
    return multiprocessing.get_context("spawn")


class _Slot:
    """One worker process and the chunk it is grading: ``chunk[pos]`` is in progress since ``since``."""

    def __init__(self, ctx: Any, job: _Job, warm_up: bool) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, job, warm_up), daemon=True)
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


class _OffMainThread:
    """Worker processes for math-verify comparisons made off the main thread (``_symbolic_equal``).

    A worker is started on first need (its start-up is not charged to the limit) and kept for the
    next call, one per thread grading at once, so a reward computed on another thread pays one
    pipe round trip per symbolic comparison. Over the limit, the worker is killed.
    """

    def __init__(self, start_timeout_s: float = 120.0) -> None:
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []

    def equal(self, answer: str, reference: str, timeout_s: float) -> bool | None:
        """Returns math-verify's verdict, or None when it took longer than ``timeout_s`` (worker killed).

        Raises:
            RuntimeError: a worker could not start, died, or the comparison raised.
        """
        with self._lock:
            slot = self._idle.pop() if self._idle else None
        slot = slot or self._start()
        try:
            slot.conn.send([(answer, reference, False)])
            if not slot.conn.poll(timeout_s):
                slot.stop(kill=True)
                return None
            _, verdict, status, detail = slot.conn.recv()
        except (EOFError, OSError):
            slot.stop(kill=True)
            raise RuntimeError(f"the grading process died (exit code {slot.proc.exitcode})") from None
        with self._lock:
            self._idle.append(slot)
        if status != "ok":
            raise RuntimeError(detail)
        return verdict

    def _start(self) -> _Slot:
        """Returns a started, warmed-up worker."""
        try:
            slot = _Slot(_context(), _compare_one, warm_up=True)
        except Exception as e:  # e.g. a daemonic process may not have children
            raise RuntimeError(f"could not start a grading process for a thread other than the main one "
                               f"({type(e).__name__}: {e}); grade from the main thread, or use grade_many") from e
        try:
            ready = slot.conn.poll(self.start_timeout_s) and slot.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            slot.stop(kill=True)
            raise RuntimeError(f"a grading process did not start within {self.start_timeout_s} s "
                               f"(exit code {slot.proc.exitcode})")
        slot.state = "idle"
        return slot

    def close(self) -> None:
        """Ends the idle workers (busy ones end with their call)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.stop(kill=False)


_OFF_MAIN_THREAD = _OffMainThread()


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
    job = functools.partial(_grade_one, match_fn=match_fn or _match_in_worker)
    ctx = _context()
    start = lambda: _Slot(ctx, job, warm_up=not integer)
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
