"""How a training process meets SIGTERM (``kill``, a container stop, Slurm's scancel or
preemption, torchrun stopping its ranks) and Ctrl-C: a stop request, acted on where the run can
stop cleanly.

The handler only records the request (which signal, when), since raising there would lose it: a
handler runs wherever the main thread is, and an exception raised inside a weakref or
garbage-collection callback (one of SQLAlchemy's, under MLflow) is printed as "Exception ignored"
and dropped. The trainer acts on the request at its next safe point (:func:`stop_point`: before
each step and before each evaluation) by raising :class:`StopRequested`, a KeyboardInterrupt: the
run ends as Ctrl-C ends it, KILLED in MLflow (a grid cell: ``failed``, with the signal as its
error), its last checkpoint intact, resumed by the same command. On many ranks a request on any
rank stops them all at the same point.

A second signal, or a request still waiting after ``FORCE_AFTER_S`` (a long step or set-up), stops
the run where it is: Slurm (``KillWait``) and torchrun both send SIGKILL 30 s after their SIGTERM
by default, and a run stopped before then is still recorded as KILLED.

A Slurm job's time is planned, not hoped: the handler knows when the job must have saved and ended
(``deadline``), and a safe point told what the next unit of work needs (``need_s``: the measured
step, evaluation and save of this attempt, :class:`AttemptClock`) stops the run there, saving,
once it no longer fits: a save-and-stop like Slurm's warning, on every rank at the same point.
The warning (``SAVE_SIGNAL``) stays as the fallback; one still waiting after ``save_within`` calls
``overdue`` from the watchdog thread (the cell's requeue from its last checkpoint), since an
interrupt cannot reach a rank blocked in a device sync behind a collective.

The launch code installs the handler (``vapo-lab train``, a grid cell, each of torchrun's ranks);
the module sits below the trainer so that the trainer can ask it without importing the launch
layer.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Slurm's warning before a job's time limit (submitit asks for it, `--signal=USR2@delay`): a stop
# that saves a checkpoint first, so that the requeued job resumes past it
SAVE_SIGNAL = signal.SIGUSR2
FORCE_AFTER_S = 10.0  # a request not acted on by then stops the run where it is
# one stop often comes as two signals at once (Ctrl-C reaches torchrun's ranks from the terminal
# and again from torchrun, which passes its signals on): a second one this soon is the same request
SAME_STOP_S = 1.0
WATCH_EVERY_S = 0.25  # how often the watchdog looks at a waiting request


@dataclass(frozen=True)
class StopRequest:
    """A stop asked of this process: the signal, and when it came (``time.time()``)."""

    signum: int
    at: float

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class StopRequested(KeyboardInterrupt):
    """A stop request acted on: a KeyboardInterrupt, so that whatever handles Ctrl-C (the run's
    record: KILLED; a grid cell: failed; a grid: interrupted) handles it the same way. ``reason``
    is the short form the run's closing line gives ("SIGTERM", "SIGINT twice"); ``save``: the run
    is to save a checkpoint before it stops (``SAVE_SIGNAL`` at a safe point)."""

    def __init__(self, reason: str, detail: str, signum: int = 0, save: bool = False) -> None:
        self.reason, self.signum, self.save = reason, signum, save
        super().__init__(f"{reason}: {detail}")


class StopHandler:
    """The handler of SIGTERM and SIGINT in a training process and the request they share.

    The trainer calls :func:`stop_point` at its safe points, which asks the installed handler. The
    handler itself only sets attributes: it runs between any two bytecodes of the main thread,
    where taking a lock (starting a thread, setting an Event) could deadlock. A watchdog thread
    started with the handler forces a request that waits too long.
    """

    def __init__(
        self,
        save_within: float | None = None,
        deadline: float | None = None,
        overdue: Callable[[], None] | None = None,
    ) -> None:
        self.request: StopRequest | None = None
        # SAVE_SIGNAL: how long its request may wait for a safe point that can save
        self.save_within = save_within
        self.deadline = deadline  # time.time() by which the job must have saved and ended
        self.overdue = overdue  # SAVE_SIGNAL past save_within: called instead of an interrupt
        self.overdue_called = False  # then the job is already requeued
        self.previous_save_handler: Any = None  # submitit's, called to requeue after the save
        self._forced = False
        self._closed = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name="stop-request-watchdog", daemon=True
        )
        self._watchdog.start()

    def __call__(self, signum: int, frame: Any) -> None:
        """Records a first signal; raises StopRequested at once for a second (or the watchdog's)."""
        req = self.request
        if req is None:
            self.request = StopRequest(signum, time.time())
        elif self._forced:
            raise StopRequested(
                f"{req.name}, no safe point within {self._deadline(req.signum):.0f} s",
                f"signal {req.signum}, the run stopped where it was",
                req.signum,
            )
        elif time.time() - req.at >= SAME_STOP_S:
            raise StopRequested(
                f"{signal.Signals(signum).name} twice", f"signal {signum}, the run stopped at once"
            )

    def stop_point(self, world: Any = None, can_save: bool = True, need_s: float = 0.0) -> None:
        """Raises StopRequested if a stop was asked of this process or, on many ranks, of any rank
        of ``world`` (a ``World``; every rank must call this at the same points: it is a
        collective). The request is consumed: a later signal is a new one. A ``SAVE_SIGNAL``
        request waits for a point that ``can_save`` (the same on every rank). At a point that
        ``can_save``, ``need_s`` (what the next unit of work and its save take) past the
        ``deadline`` is a save-and-stop too, reason "time limit"."""
        req = self.request
        signum = req.signum if req else 0
        late = self._too_late(need_s) if can_save and not signum else None
        if late is not None:
            signum = SAVE_SIGNAL
        if world is not None and world.initialized:
            # any stop outranks a save-and-stop: SIGTERM's 15 and SIGINT's 2 above USR2's 12
            signum = int(world.max(float(_rank(signum))))
            signum = _unrank(signum)
        if not signum:
            return
        if signum == SAVE_SIGNAL and not can_save:
            return
        self.request, self._forced = None, False
        if late is not None:
            raise StopRequested("time limit", late, signum, save=True)
        when = (
            "by another rank"
            if req is None
            else f"{time.time() - req.at:.1f} s before this safe point"
        )
        raise StopRequested(
            signal.Signals(signum).name,
            f"signal {signum}, received {when}",
            signum,
            save=signum == SAVE_SIGNAL,
        )

    def _too_late(self, need_s: float) -> str | None:
        """Returns why the next unit of work no longer fits before the deadline, or None."""
        if self.deadline is None:
            return None
        left = self.deadline - time.time()
        if left >= need_s:
            return None
        return (
            f"{left:.0f} s left before the job's time limit; "
            f"the next unit and a save need {need_s:.0f} s"
        )

    def close(self) -> None:
        """Forgets any request and stops the watchdog (the handler is being replaced)."""
        global _installed
        self.request, self._forced = None, False
        self._closed.set()
        if _installed is self:
            _installed = None

    def _watch(self) -> None:
        """Stops the run where it is when a request waited ``FORCE_AFTER_S`` for a safe point."""
        while not self._closed.wait(WATCH_EVERY_S):
            req = self.request
            late = req is not None and time.time() - req.at >= self._deadline(req.signum)
            if req is not None and not self._forced and late:
                self._forced = True
                if req.signum == SAVE_SIGNAL and self.overdue is not None:
                    self.overdue_called = True
                    self.overdue()  # from this thread: the main one may be blocked in a collective
                    continue
                # the handler runs in the main thread, as for a signal
                _thread.interrupt_main(req.signum)

    def _deadline(self, signum: int) -> float:
        if signum == SAVE_SIGNAL and self.save_within is not None:
            return self.save_within
        return FORCE_AFTER_S


def _rank(signum: int) -> int:
    """Orders signals for the ranks' agreement: a save-and-stop below every plain stop."""
    return 1 if signum == SAVE_SIGNAL else (signum + 100 if signum else 0)


def _unrank(value: int) -> int:
    return SAVE_SIGNAL if value == 1 else (value - 100 if value else 0)


# the handler sigterm_interrupts installed, until it is closed
_installed: StopHandler | None = None


def installed() -> StopHandler | None:
    """Returns the handler ``sigterm_interrupts`` installed (None: none, or it was closed)."""
    return _installed


def stop_point(world: Any = None, can_save: bool = True, need_s: float = 0.0) -> None:
    """A safe point: raises StopRequested if a stop was asked, or ``need_s`` no longer fits before
    the job's deadline (see ``StopHandler.stop_point``; on many ranks a collective). Without an
    installed handler (a run in a library call, a thread) it does nothing, on every rank alike:
    ranks are started by the same code."""
    if _installed is not None:
        _installed.stop_point(world, can_save, need_s)


class AttemptClock:
    """How long each kind of work took in this process (this attempt of a job): what the next one
    is expected to need (``need``), the longest of each kind plus the last save, so that the run
    stops before a unit it cannot finish and save. Kinds never measured count 0: the first step of
    an attempt always runs (Slurm's warning is the fallback)."""

    def __init__(self) -> None:
        self.longest: dict[str, float] = {}
        self.last: dict[str, float] = {}

    @contextlib.contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        """Times the body as one unit of ``kind``."""
        t0 = time.perf_counter()
        yield
        self.add(kind, time.perf_counter() - t0)

    def add(self, kind: str, seconds: float) -> None:
        self.longest[kind] = max(self.longest.get(kind, 0.0), seconds)
        self.last[kind] = seconds

    def need(self, *kinds: str, save: str = "save") -> float:
        """Returns the seconds the next unit made of ``kinds`` and a save needs, plus
        ``STOP_MARGIN_S`` for the stop itself (the requeue, the processes' exit)."""
        work = sum(self.longest.get(k, 0.0) for k in kinds)
        return work + self.last.get(save, 0.0) + STOP_MARGIN_S


# beside the work and the save, what a stop for the time limit keeps for itself: the collective
# that agrees on it, submitit's requeue (scontrol) and every process's exit
STOP_MARGIN_S = 20.0


def sigterm_interrupts(
    save_within: float | None = None,
    deadline: float | None = None,
    overdue: Callable[[], None] | None = None,
) -> StopHandler | None:
    """Makes SIGTERM and Ctrl-C stop the run at its next safe point (see the module docstring);
    returns the handler, or None off the main thread (only the main thread can set a handler).

    ``save_within`` (seconds): ``SAVE_SIGNAL`` too, a stop that saves a checkpoint at the next safe
    point after a step, or once that long has passed, ``overdue()`` (None: the run stops where it
    is); the handler keeps the one it replaced (submitit's checkpoint-and-requeue) in
    ``previous_save_handler``. ``deadline``: see ``StopHandler.stop_point``.

    Under submitit, which ignores SIGTERM so that Slurm's SIGKILL ``KillWait`` seconds later is
    what ends a job, this handler replaces submitit's: a cancelled cell stops within one step, its
    last checkpoint intact, and the same grid command resumes it. submitit's USR2 handler
    (checkpoint and requeue) is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    # an earlier run's, in a reused process: its request is stale
    if isinstance(previous, StopHandler):
        previous.close()
    global _installed
    handler = StopHandler(save_within, deadline, overdue)
    for signum in SIGNALS:
        signal.signal(signum, handler)
    if save_within is not None:
        handler.previous_save_handler = signal.getsignal(SAVE_SIGNAL)
        signal.signal(SAVE_SIGNAL, handler)
    _installed = handler
    return handler


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopHandler | None]:
    """``sigterm_interrupts()`` for the body, the previous handlers back after it (a run inside a
    longer-lived process: a test's, the CLI's in-process runner)."""
    if threading.current_thread() is not threading.main_thread():
        yield None
        return
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    handler = sigterm_interrupts()
    try:
        yield handler
    finally:
        if handler is not None:
            handler.close()
        for signum, old in previous.items():
            signal.signal(signum, old)
