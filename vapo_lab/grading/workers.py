"""Grading worker processes: started warm, fed chunks of samples over a pipe, killed at a limit.

``Slot`` is one worker and the chunk it is grading (``grade_many`` keeps a pool of them);
``OFF_MAIN_THREAD`` runs math-verify for other threads, where its SIGALRM limit cannot fire.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from vapo_lab.grading.symbolic import math_verify_equal

# A job for ``_worker``: (response or answer, reference, integer) -> the fields of a GradeResult.
Job = Callable[[str, str, bool], tuple[Any, ...]]


def _compare_one(answer: str, reference: str, integer: bool) -> tuple[str, bool, str, str]:
    """Returns the fields of a GradeResult for math-verify on an extracted ``answer``, unbounded:
    the job of ``_OffMainThread``'s workers (``integer`` is unused)."""
    try:
        return answer, bool(math_verify_equal(answer, reference, None)), "ok", ""
    except Exception as e:  # noqa: BLE001 - reported to the caller as "error"
        return answer, False, "error", f"{type(e).__name__}: {e}"[:500]


def _worker(conn: Connection, job: Job, warm_up: bool) -> None:
    """Runs ``job`` on chunks ``[(response, reference, integer), ...]`` from ``conn``, one reply a
    sample, so the parent knows when each starts; None or a closed pipe ends it.

    Says "ready" once warm (math-verify imported, its parser built), so that start-up is not
    charged to the first sample's time limit.
    """
    # math-verify warns once per process that its own alarm is off: here that is by design
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(
            lambda record: "Timeout is disabled" not in record.getMessage()
        )
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


def mp_context() -> Any:
    """Returns the multiprocessing context: forkserver where available (safe under torch), else
    spawn; the fork server imports math-verify once, so a killed worker's replacement starts in
    milliseconds."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["vapo_lab.grading", "math_verify"])
        return ctx
    return multiprocessing.get_context("spawn")


class Slot:
    """One worker process and the chunk it is grading, ``chunk[pos]`` since ``since``."""

    def __init__(self, ctx: Any, job: Job, warm_up: bool) -> None:
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
    """Worker processes for math-verify comparisons made off the main thread.

    A worker starts on first need (not charged to the limit) and is kept for the next call, one
    per thread grading at once, so a comparison costs one pipe round trip; over the limit it is
    killed.
    """

    def __init__(self, start_timeout_s: float = 120.0) -> None:
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._idle: list[Slot] = []

    def equal(self, answer: str, reference: str, timeout_s: float) -> bool | None:
        """Returns math-verify's verdict, or None when it took longer than ``timeout_s``.

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
            raise RuntimeError(
                f"the grading process died (exit code {slot.proc.exitcode})"
            ) from None
        with self._lock:
            self._idle.append(slot)
        if status != "ok":
            raise RuntimeError(detail)
        return verdict

    def _start(self) -> Slot:
        """Returns a started, warmed-up worker."""
        try:
            slot = Slot(mp_context(), _compare_one, warm_up=True)
        except Exception as e:  # e.g. a daemonic process may not have children
            raise RuntimeError(
                f"could not start a grading process for a thread other than the main one "
                f"({type(e).__name__}: {e}); grade from the main thread, or use grade_many"
            ) from e
        try:
            ready = slot.conn.poll(self.start_timeout_s) and slot.conn.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            slot.stop(kill=True)
            raise RuntimeError(
                f"a grading process did not start within {self.start_timeout_s} s "
                f"(exit code {slot.proc.exitcode})"
            )
        slot.state = "idle"
        return slot

    def close(self) -> None:
        """Ends the idle workers (busy ones end with their call)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.stop(kill=False)


OFF_MAIN_THREAD = _OffMainThread()


__all__ = [
    "OFF_MAIN_THREAD",
    "Job",
    "Slot",
    "mp_context",
]
