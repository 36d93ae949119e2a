"""Progress of long phases: a rich bar on a terminal; in a log (Slurm, nohup, | tee) plain lines
with phase, step k/N, rate and ETA at a steady interval, each flushed."""

import io

import pytest
from rich.console import Console
from rich.progress import Progress

from vapo_lab.commands.progress import INTERVAL_ENV, PlainProgress, interval_from_env, progress_bar
from vapo_lab.errors import ConfigError


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Log(io.StringIO):
    """A log file: not a terminal; counts flushes and what was flushed."""

    def __init__(self):
        super().__init__()
        self.flushed = ""

    def flush(self):
        self.flushed = self.getvalue()

    def lines(self):
        return self.getvalue().splitlines()


def test_lines_come_at_the_start_every_interval_and_at_the_end_each_flushed():
    clock, log = Clock(), Log()
    bar = PlainProgress(log, interval=10, clock=clock)
    task = bar.add_task("base build", total=800)
    assert log.lines() == ["base build: step 0/800 (0%)"]  # the phase starts
    for step in range(1, 121):  # 6 steps/s: step 60 at t = 10 s, step 120 at t = 20 s
        clock.now = step / 6
        bar.update(task, advance=1, info="loss 0.512")
        assert log.flushed == log.getvalue()  # every line is flushed as it is written
    # step 60: 60/800 = 7.5% (floored), rate 60/10 = 6.0 steps/s, ETA (800-60)/6 = 123.3 s = 2m03s
    # step 120: 15%, 6.0 steps/s, ETA (800-120)/6 = 113.3 s = 1m53s; nothing between the two
    assert log.lines()[1:] == [
        "base build: step 60/800 (7%), 6.0 steps/s, ETA 2m03s, loss 0.512",
        "base build: step 120/800 (15%), 6.0 steps/s, ETA 1m53s, loss 0.512",
    ]
    clock.now = 800 / 6  # the last step, 3.3 s after the previous line: the end is printed at once
    bar.update(task, completed=800)
    assert log.lines()[-1] == "base build: done, 800 steps in 2m13s (6.0 steps/s)"
    clock.now = 1000.0
    bar.update(task, completed=800)  # updates after the end print nothing more
    assert len(log.lines()) == 4 and log.flushed == log.getvalue()


def test_slow_steps_show_seconds_per_step_and_a_resumed_count_from_where_it_started():
    clock, log = Clock(), Log()
    bar = PlainProgress(log, interval=10, clock=clock)
    task = bar.add_task("vapo", total=80, completed=40, stats="")  # resumed at step 40
    clock.now = 23.0
    bar.update(task, completed=42, stats="reward 0.250 acc 0.250 len 12")
    # 2 steps in 23 s: 11.5 s/step; ETA 38 x 11.5 = 437 s = 7m17s; the empty field at the start is
    # left out
    assert log.lines() == [
        "vapo: step 40/80 (50%)",
        "vapo: step 42/80 (52%), 11.5 s/step, ETA 7m17s, reward 0.250 acc 0.250 len 12",
    ]


def test_unknown_total_unit_and_a_phase_left_unfinished_is_closed_at_exit():
    clock, log = Clock(), Log()
    with PlainProgress(log, interval=10, clock=clock) as bar:
        task = bar.add_task("eval arith", total=None, unit="sample")
        clock.now = 4.0
        bar.update(task, completed=0, total=16)  # before the interval: no line
        clock.now = 5.0
        bar.update(task, completed=8)
    # 8 samples in 5 s = 1.6 samples/s; ETA 8 / 1.6 = 5 s
    assert log.lines() == [
        "eval arith: sample 0",
        "eval arith: sample 8/16 (50%), 1.6 samples/s, ETA 5s",
    ]


def test_long_etas_read_in_hours():
    clock, log = Clock(), Log()
    bar = PlainProgress(log, interval=0, clock=clock)
    task = bar.add_task("vapo", total=1000)
    clock.now = 10.0
    bar.update(task, completed=1)  # 10 s/step: ETA 999 x 10 = 9990 s = 2h46m
    assert log.lines()[-1] == "vapo: step 1/1000 (0%), 10.0 s/step, ETA 2h46m"


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.delenv(INTERVAL_ENV, raising=False)
    assert interval_from_env() == 10.0
    monkeypatch.setenv(INTERVAL_ENV, "0.5")
    assert interval_from_env() == 0.5
    monkeypatch.setenv(INTERVAL_ENV, "often")
    with pytest.raises(
        ConfigError, match=r"VAPO_PROGRESS_INTERVAL='often' is not a number of seconds"
    ):
        interval_from_env()


def test_a_terminal_gets_the_rich_bar_a_log_gets_plain_lines():
    terminal = Console(file=io.StringIO(), force_terminal=True)
    with progress_bar(True, terminal) as bar:
        assert isinstance(bar, Progress)
    log = Log()
    with progress_bar(True, Console(file=log)) as bar:
        assert isinstance(bar, PlainProgress)
        bar.add_task("phase", total=2)
    assert log.lines() == ["phase: step 0/2 (0%)"]
    with progress_bar(False, Console(file=log)) as bar:
        assert bar is None
