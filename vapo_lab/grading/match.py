"""Comparing an answer with its reference, and grading responses: one in-process, many in workers.

``grade`` is the reward's path (in-process, bounded on any thread, never raising); ``grade_many``
grades a batch in worker processes with a per-sample time limit, reporting hangs and crashes.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait

from vapo_lab.grading.extract import as_int, extract_answer, normalize_answer
from vapo_lab.grading.symbolic import math_verify_equal, symbolic_refusal
from vapo_lab.grading.workers import OFF_MAIN_THREAD, Slot, mp_context

STATUSES = ("ok", "no_answer", "timeout", "error")

_log = logging.getLogger(__name__)


def _symbolic_equal(answer: str, reference: str, timeout_s: float | None) -> bool:
    """Returns math-verify's verdict on ``answer`` ≡ ``reference``; False when either fails to
    parse or the comparison passes ``timeout_s`` (logged).

    In the main thread math-verify's own SIGALRM limit holds; elsewhere (or without SIGALRM) the
    comparison runs in a worker process killed at the limit, since nothing in-process can stop
    sympy holding the GIL. None: no limit here (``grade_many`` kills its worker instead).
    """
    if timeout_s is None:
        return math_verify_equal(answer, reference, None)
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM"):
        return math_verify_equal(answer, reference, timeout_s)
    verdict = OFF_MAIN_THREAD.equal(answer, reference, timeout_s)
    if verdict is None:
        _log.warning(
            "grading took over %s s (off the main thread): counted wrong: %.200s", timeout_s, answer
        )
        return False
    return verdict


def match_answer(
    answer: str, reference: str, integer: bool = False, timeout_s: float | None = 5
) -> bool:
    """Returns True iff the extracted ``answer`` equals ``reference``.

    Equal normalised keys → True. Both integers → exact integer comparison. Otherwise, with
    ``integer`` → False (an AIME answer that is not an integer literal is wrong, whatever it
    evaluates to), unless the reference is not an integer either; else math-verify's symbolic
    equivalence, bounded by ``timeout_s`` (None: unbounded). An answer that fails a pre-check
    (``symbolic_refusal``) never reaches math-verify: False.
    """
    key, ref_key = normalize_answer(answer, integer), normalize_answer(reference, integer)
    if key and key == ref_key:
        return True
    value, ref_value = as_int(key), as_int(ref_key)
    if value is not None and ref_value is not None:
        return value == ref_value
    if integer and ref_value is not None:
        return False
    compact = re.sub(r"\s+", " ", answer).strip()  # LaTeX reads a run of spaces as one
    if symbolic_refusal(compact, reference) is not None:
        return False
    return _symbolic_equal(compact, reference, timeout_s)


def grade(
    response: str, reference: str, integer: bool = False, timeout_s: float | None = 5
) -> bool:
    """Returns True iff the final answer of ``response`` equals ``reference`` (``match_answer``).

    The reward's path: in-process, bounded by ``timeout_s`` on any thread, never raising; an
    error or a timeout grades the response wrong.
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


def _grade_one(
    response: str, reference: str, integer: bool, match_fn: Callable[[str, str, bool], bool]
) -> tuple[str | None, bool, str, str]:
    """Returns the fields of a GradeResult for one sample; exceptions become status "error"."""
    answer = None
    try:
        answer = extract_answer(response)
        if answer is None:
            return None, False, "no_answer", ""
        return answer, bool(match_fn(answer, reference, integer)), "ok", ""
    except Exception as e:  # noqa: BLE001 - one bad sample must not stop the batch
        return answer, False, "error", f"{type(e).__name__}: {e}"[:500]


def grade_many(
    responses: Sequence[str],
    references: Sequence[str],
    integer: bool,
    timeout_s: float = 5.0,
    workers: int | None = None,
    match_fn: Callable[[str, str, bool], bool] | None = None,
    start_timeout_s: float = 120.0,
) -> list[GradeResult]:
    """Returns one GradeResult per response, graded in worker processes with a per-sample limit.

    Samples go to the workers in chunks; each has ``timeout_s`` seconds from the end of the
    previous one. A worker over the limit is killed and replaced, its sample marked "timeout"
    (a worker that dies: "error") and counted wrong, and the rest of its chunk requeued.

    Args:
        integer: grade as an integer-answer set (see ``match_answer``).
        workers: worker processes; default min(4, CPU count).
        match_fn: test hook: a picklable module-level ``(answer, reference, integer) -> bool`` run
            in the workers in place of ``match_answer``.
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
    ctx = mp_context()

    def start() -> Slot:
        return Slot(ctx, job, warm_up=not integer)

    slots = [start() for _ in range(min(workers, len(queue)))]
    results: list[GradeResult | None] = [None] * n
    remaining = n

    def retire(k: int, status: str, detail: str) -> None:
        """Fails slot k's current sample, requeues the rest of its chunk, replaces the worker."""
        nonlocal remaining
        slot = slots[k]
        slot.stop(kill=True)
        results[slot.chunk[slot.pos]] = GradeResult(None, False, status, detail)
        remaining -= 1
        if slot.pos + 1 < len(slot.chunk):
            queue.appendleft(slot.chunk[slot.pos + 1 :])
        slots[k] = start()

    def limit(slot: Slot) -> float:
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
                    slot.chunk, slot.pos, slot.state, slot.since = (
                        chunk,
                        0,
                        "busy",
                        time.monotonic(),
                    )
            active = [k for k, s in enumerate(slots) if s.state != "idle"]
            deadline = min(limit(slots[k]) for k in active)
            ready = wait(
                [slots[k].conn for k in active], timeout=max(0.0, deadline - time.monotonic())
            )
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
                            f"a grading worker exited with code {slot.proc.exitcode} before it "
                            "was ready"
                        ) from None
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
    "grade",
    "grade_many",
    "match_answer",
]
