"""Progress of long phases (base build, training, evaluation): a bar on a terminal, lines in a log.

A rich bar redraws itself in place; when its console is not an interactive terminal (a Slurm log,
``nohup``, ``| tee``) it draws nothing until it stops, so a job that works for minutes looks hung.
:func:`progress_bar` gives the rich bar on a terminal and otherwise a :class:`PlainProgress`,
which takes the same ``add_task`` / ``update`` calls and prints, flushed, one line when a phase
starts, at most one per interval while it runs and one when it ends::

    pre-training base: step 0/800 (0%)
    pre-training base: step 60/800 (7%), 6.0 steps/s, ETA 2m03s, loss 0.512 · 1,234 tok/s
    pre-training base: done, 800 steps in 2m13s (6.0 steps/s)

A line is printed by the first update after the interval (``VAPO_PROGRESS_INTERVAL`` seconds, 10 by
default), so a phase whose steps are slower than that prints one line a step. Rate and ETA count
from where the phase started (a resumed run at step 40 of 80 measures its own steps only).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from vapo_lab.errors import ConfigError

INTERVAL_ENV = "VAPO_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 10.0


class ProgressBar(Protocol):
    """What a phase reports to: rich's ``Progress`` or :class:`PlainProgress`."""

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> Any: ...

    def update(self, task_id: Any, **kwargs: Any) -> None: ...


def interval_from_env() -> float:
    """Returns the seconds between plain progress lines: ``$VAPO_PROGRESS_INTERVAL``, else 10.

    Raises:
        ConfigError: the variable is not a number >= 0.
    """
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise ConfigError(
            f"{INTERVAL_ENV}={text!r} is not a number of seconds: set e.g. {INTERVAL_ENV}=10 "
            f"(0: a line at every step), or unset it"
        )
    return value


@dataclass
class _Task:
    description: str
    total: float | None
    completed: float
    unit: str
    fields: dict[str, Any]
    start_time: float
    start_completed: float
    last_line: float
    changed: bool = False
    done: bool = False


@dataclass
class PlainProgress:
    """Prints each task's progress as plain lines to ``file``: at its start, at most every
    ``interval`` seconds, at its end; each line flushed. Takes the calls of rich's ``Progress`` that
    vapo-lab makes.

    Attributes:
        interval: seconds between lines of one task; None: :func:`interval_from_env`.
        clock: seconds, monotonic (tests pass a fake one).
    """

    file: TextIO
    interval: float | None = None
    clock: Callable[[], float] = time.monotonic
    _tasks: list[_Task] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.interval is None:
            self.interval = interval_from_env()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        for task in self._tasks:  # a phase left unfinished: where it stopped
            if task.changed and not task.done:
                self._print(task, self.clock())

    def add_task(
        self,
        description: str,
        start: bool = True,
        total: float | None = 100.0,
        completed: float = 0,
        visible: bool = True,
        unit: str = "step",
        **fields: Any,
    ) -> int:
        """Returns the new task's id, after printing its first line."""
        now = self.clock()
        self._tasks.append(_Task(description, total, completed, unit, fields, now, completed, now))
        self._print(self._tasks[-1], now)
        return len(self._tasks) - 1

    def update(
        self,
        task_id: int,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        """Records the task's state; prints a line when the interval has passed or the task ends."""
        task = self._tasks[task_id]
        if task.done:
            return
        if total is not None:
            task.total = total
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        if description is not None:
            task.description = description
        task.fields.update(fields)
        task.changed = True
        now = self.clock()
        if task.total is not None and task.completed >= task.total:
            task.done = True
            self._print(task, now)
        elif now - task.last_line >= self.interval:
            self._print(task, now)

    def _print(self, task: _Task, now: float) -> None:
        task.last_line, task.changed = now, False
        elapsed, steps = now - task.start_time, task.completed - task.start_completed
        rate = steps / elapsed if elapsed > 0 and steps > 0 else None
        k, n, unit = _count(task.completed), task.total, task.unit
        if task.done:
            line = (
                f"{task.description}: done, {_count(steps)} {_plural(unit)} in {_duration(elapsed)}"
            )
            if rate:
                line += f" ({_rate(rate, unit)})"
        else:
            parts = [
                f"{unit} {k}"
                if n is None
                else f"{unit} {k}/{_count(n)} ({int(100 * task.completed // n)}%)"
            ]
            if rate:
                parts.append(_rate(rate, unit))
                if n is not None:
                    parts.append(f"ETA {_duration((n - task.completed) / rate)}")
            parts += [str(v) for v in task.fields.values() if str(v)]
            line = f"{task.description}: " + ", ".join(parts)
        self.file.write(line + "\n")
        self.file.flush()


def _count(x: float) -> str:
    return f"{x:g}" if x != int(x) else str(int(x))


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "x", "ch", "sh")) else "s")


def _rate(rate: float, unit: str) -> str:
    """Returns '6.1 steps/s', or '11.5 s/step' below one a second."""
    return f"{rate:.1f} {_plural(unit)}/s" if rate >= 1 else f"{1 / rate:.1f} s/{unit}"


def _duration(seconds: float) -> str:
    """Returns 42s, 2m03s or 2h46m."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def default_columns() -> tuple[ProgressColumn, ...]:
    """Returns the bar's columns: description, bar, k/N, elapsed, remaining."""
    return (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )


@contextmanager
def progress_bar(
    enabled: bool = True, console: Console | None = None, *columns: ProgressColumn
) -> Iterator[Progress | PlainProgress | None]:
    """Yields a rich ``Progress`` on an interactive terminal (or Jupyter), a :class:`PlainProgress`
    writing to the console's file otherwise, or None when disabled.

    Args:
        enabled: False yields None (the callers' ``--quiet``).
        console: where progress goes; default a new stderr console (stdout keeps the results).
        columns: the rich bar's columns; default :func:`default_columns`.
    """
    if not enabled:
        yield None
        return
    console = console or Console(stderr=True)
    # is_interactive: rich redraws the bar (fixed when the console was made); is_terminal: the file
    # it writes to now is still a terminal
    if (console.is_interactive and console.is_terminal) or console.is_jupyter:
        with Progress(*(columns or default_columns()), console=console, transient=False) as bar:
            yield bar
    else:
        with PlainProgress(console.file) as plain:
            yield plain


def build_progress(quiet: bool) -> Callable[[], AbstractContextManager[Any]] | None:
    """Returns the progress factory a base-model build (or any long library step) draws its bar
    with: on stderr, step, ETA and an info field; None with ``--quiet``."""
    if quiet:
        return None
    return lambda: progress_bar(True, None, *default_columns(), TextColumn("{task.fields[info]}"))
