"""SIGTERM and Ctrl-C stop a run at its next safe point: never lost (a handler that raised lost the
signal when it ran inside a weakref or GC callback, as one of SQLAlchemy's under MLflow), the run
KILLED after the step in progress, one line saying so, and `resume=` continuing it exactly.

The handler's rules are checked in this process; the lost signal in a real run (slow: `pytest -m
slow tests/faults/test_signals.py`)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from vapo_lab import stop
from vapo_lab.runs.metrics_log import record_kind
from vapo_lab.stop import StopHandler, StopRequest, StopRequested, stop_on_signals, stop_point

from .conftest import RUN, assert_like_reference, records, store, train

# `vapo-lab train` with one test hook: at the start of step 3 an object dies whose weakref callback
# runs for as long as the test needs to send its one SIGTERM (it writes <marker> when it starts and
# waits for <marker>.sent), so the handler runs inside the callback, where an exception is dropped
IN_A_CALLBACK = """
import sys, time, weakref
from pathlib import Path
from vapo_lab.trainer.trainer import Trainer

marker = Path(sys.argv.pop(1))
real_step = Trainer.train_step

def slow_callback(ref):
    marker.write_text("in the callback")
    sent = marker.with_suffix(".sent")
    deadline = time.time() + 60
    while not sent.exists() and time.time() < deadline:
        pass
    end = time.time() + 0.5  # the handler runs at the next bytecode boundary: still in here
    while time.time() < end:
        pass

class Dying:
    pass

def step(self):
    if self.step == 2:
        dying = Dying()
        ref = weakref.ref(dying, slow_callback)
        del dying
    return real_step(self)

Trainer.train_step = step
from vapo_lab.cli import main
sys.argv[0] = "vapo-lab"
main()
"""


@pytest.fixture
def handler():
    """A handler called by hand (not installed), its watchdog stopped after the test."""
    h = StopHandler()
    yield h
    h.close()


def test_a_signal_is_recorded_and_acted_on_at_the_next_stop_point(handler):
    handler.stop_point()  # nothing asked: nothing happens
    handler(signal.SIGTERM, None)  # inside a weakref callback this must not raise: it records
    assert handler.request.name == "SIGTERM"
    handler(signal.SIGINT, None)  # the same stop, arriving twice at once (terminal and torchrun)
    with pytest.raises(
        StopRequested, match=r"^SIGTERM: signal 15, received [\d.]+ s before this safe point$"
    ) as e:
        handler.stop_point()
    assert isinstance(e.value, KeyboardInterrupt) and e.value.reason == "SIGTERM"
    assert handler.request is None  # consumed: a later signal is a new stop
    handler.stop_point()


def test_a_second_signal_stops_at_once(handler):
    # the first, a while ago
    handler.request = StopRequest(signal.SIGTERM, time.time() - stop.SAME_STOP_S)
    with pytest.raises(StopRequested, match="^SIGTERM twice: signal 15, the run stopped at once"):
        handler(signal.SIGTERM, None)


def test_the_trainers_stop_point_asks_the_installed_handler_and_nothing_once_it_is_closed():
    stop_point()  # no handler installed (a run in a library call): nothing happens
    with stop_on_signals() as handler:
        handler(signal.SIGTERM, None)
        with pytest.raises(StopRequested, match="^SIGTERM: "):
            stop_point()
        handler(signal.SIGTERM, None)
    stop_point()  # the handler is gone with its request: a stale request stops nothing


def test_a_stop_with_no_safe_point_in_time_stops_where_the_run_is(monkeypatch):
    """A step longer than FORCE_AFTER_S: the run is stopped before SIGKILL (Slurm's KillWait)
    comes."""
    monkeypatch.setattr(stop, "FORCE_AFTER_S", 0.2)
    before = [signal.getsignal(signum) for signum in stop.SIGNALS]
    with (
        stop_on_signals() as handler,
        pytest.raises(StopRequested, match="^SIGTERM, no safe point within"),
    ):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.time() + 10
        while time.time() < deadline:  # a long step: Python code that never reaches a safe point
            pass
    assert handler.request is None
    assert [
        signal.getsignal(signum) for signum in stop.SIGNALS
    ] == before  # the previous handlers are back


def test_slurms_warning_waits_for_a_point_that_can_save_and_then_asks_for_a_save(handler):
    handler(signal.SIGUSR2, None)
    handler.stop_point(can_save=False)  # before a step of this attempt, or before an evaluation
    assert handler.request is not None  # kept for the next safe point
    with pytest.raises(StopRequested, match="^SIGUSR2: signal 12") as e:
        handler.stop_point(can_save=True)
    assert e.value.save and e.value.signum == signal.SIGUSR2
    # a plain stop never waits, and never saves
    handler(signal.SIGTERM, None)
    with pytest.raises(StopRequested) as e:
        handler.stop_point(can_save=False)
    assert not e.value.save


def test_slurms_warning_is_forced_only_after_its_own_deadline(monkeypatch):
    # SIGTERM's 10 s would cut most steps short; the warning's deadline is 0.75 of its delay
    monkeypatch.setattr(stop, "FORCE_AFTER_S", 0.1)
    previous = signal.getsignal(signal.SIGUSR2)
    with stop_on_signals():
        h = stop.sigterm_interrupts(save_within=0.6)
        assert h.previous_save_handler is previous  # submitit's, called to requeue
        start = time.time()
        with pytest.raises(StopRequested, match="^SIGUSR2, no safe point within 1 s") as e:
            os.kill(os.getpid(), signal.SIGUSR2)
            while time.time() < start + 10:  # a step that never reaches a safe point
                pass
        assert 0.5 < time.time() - start < 5 and not e.value.save
    signal.signal(signal.SIGUSR2, previous)


def test_ranks_agree_on_the_strongest_stop():
    # a plain stop on one rank outranks the warning on another: nobody waits to save
    assert stop._unrank(max(stop._rank(signal.SIGUSR2), stop._rank(signal.SIGTERM))) == 15
    assert stop._unrank(max(stop._rank(signal.SIGUSR2), stop._rank(0))) == signal.SIGUSR2
    assert stop._unrank(stop._rank(0)) == 0


@pytest.mark.slow
def test_the_warning_saves_the_step_it_stops_at_and_the_resumed_run_equals_the_reference(
    workdir, monkeypatch
):
    # no periodic save before the end (save_every 100): the warning during step 3 saves step 3
    from vapo_lab.config.compose import compose_config
    from vapo_lab.runs.folder import resume_config
    from vapo_lab.trainer.trainer import Trainer, running

    monkeypatch.chdir(workdir)
    real_step = Trainer.train_step

    def step(self):
        if self.step == 2:
            os.kill(os.getpid(), signal.SIGUSR2)
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", step)
    uri = store(workdir)
    args = [*RUN, f"tracking.uri={uri}", "run_name=warned", "trainer.save_every=100"]
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with stop_on_signals():
            stop.sigterm_interrupts(save_within=60)
            with pytest.raises(StopRequested) as e:
                with running(compose_config(overrides=args).cfg, log=lambda text: None) as trainer:
                    trainer.train()
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert e.value.save and trainer.step == 3
    run_dir = trainer.run_dir
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000003"]
    monkeypatch.setattr(Trainer, "train_step", real_step)
    resume, choices = resume_config(run_dir)  # as `vapo-lab train resume=...` reads it
    with running(resume, choices, log=lambda text: None) as resumed:
        assert resumed.step == 3
        # reading the checkpoint stands in for a save's time until this attempt saves
        assert resumed.clock.last["save"] > 0
        resumed.train()
    assert_like_reference(run_dir, workdir / "runs" / "reference", uri)


@pytest.mark.slow
def test_one_sigterm_inside_a_gc_callback_stops_the_run_after_that_step_and_resume_finishes_it(
    workdir,
):
    name = "sigterm-in-callback"
    marker = workdir / f"{name}.marker"
    args = [*RUN, f"tracking.uri={store(workdir)}", f"run_name={name}"]
    proc = subprocess.Popen(
        [sys.executable, "-c", IN_A_CALLBACK, str(marker), "train", "--quiet", *args],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 600
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert marker.exists(), proc.communicate()[1][-3000:]
    os.kill(proc.pid, signal.SIGTERM)  # exactly one, as Slurm sends
    sent = time.time()
    marker.with_suffix(".sent").touch()
    out, err = proc.communicate(timeout=600)
    latency = time.time() - sent

    run_dir = workdir / "runs" / name
    assert "Exception ignored" not in err, err[-3000:]  # before the fix: the signal dropped there
    assert proc.returncode == 130, err[-3000:]  # KeyboardInterrupt's, as for Ctrl-C
    steps = sorted(s for kind, s in records(run_dir) if kind == "train")
    # the step in progress finished and was logged, no further
    assert steps == [0, 1, 2, 3], err[-3000:]
    assert (run_dir / "checkpoints" / "step_000003").is_dir()  # save_every=3: saved before stopping
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert MlflowClient(store(workdir)).get_run(run_id).info.status == "KILLED"
    failure = (run_dir / "failure.txt").read_text()
    assert (
        failure.startswith("interrupted at step 3")
        and "StopRequested: SIGTERM: signal 15" in failure
    )
    lines = [ln for ln in err.splitlines() if ln.startswith("stopped")]
    assert lines == [
        f"stopped after step 3 of 8 (SIGTERM): continue it with: vapo-lab train resume=runs/{name}"
    ]
    assert err.rstrip().endswith(lines[0])  # the run's last word
    print(f"stopped {latency:.1f} s after the signal")  # the rest of step 3 and the close

    resumed = train(workdir, f"resume=runs/{name}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed" in resumed.stderr and "differs" not in resumed.stderr
    assert not (run_dir / "failure.txt").exists()
    assert_like_reference(run_dir, workdir / "runs" / "reference", store(workdir))


RANKS = [o for o in RUN if not o.startswith("trainer.threads")] + [
    "trainer.strategy=fsdp",
    "trainer.nproc_per_node=2",
    "trainer.threads=1",
]


def _rank_pid(parent: int, rank: int) -> int | None:
    """Returns the pid of rank ``rank`` among the descendants of process ``parent`` (torchrun's
    ranks)."""
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if f"RANK={rank}".encode() in env and parent in _ancestors(int(proc.name)):
            return int(proc.name)
    return None


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        out.append(pid)
    return out


def _logged(run_dir: Path) -> int:
    """Returns the last training step in ``run_dir``'s metrics.jsonl (-1: none yet)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return -1
    steps = []
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:  # a line being written
            continue
        if record_kind(r) == "train":
            steps.append(r["step"])
    return max(steps, default=-1)


@pytest.mark.slow
def test_a_sigterm_to_one_rank_stops_every_rank_after_the_same_step(workdir):
    """torchrun's ranks each get a stop, not always together: they agree at each safe point, so a
    run whose rank 1 alone is signalled stops cleanly on both (before: rank 0 failed in its next
    collective)."""
    name = "sigterm-rank1"
    run_dir = workdir / "runs" / name
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vapo_lab.cli",
            "train",
            "--quiet",
            *RANKS,
            f"tracking.uri={store(workdir)}",
            f"run_name={name}",
        ],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 900
    while _logged(run_dir) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    rank1 = _rank_pid(proc.pid, 1)
    assert rank1 is not None, proc.communicate()[1][-3000:]
    os.kill(rank1, signal.SIGTERM)
    # the signal came in step at + 1 at the latest: the ranks meet before each step
    at = _logged(run_dir)
    out, err = proc.communicate(timeout=600)

    assert proc.returncode != 0
    last = _logged(run_dir)
    assert at <= last <= at + 1 < 8, err[-3000:]
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert MlflowClient(store(workdir)).get_run(run_id).info.status == "KILLED", err[-3000:]
    # rank 0's alone
    (line,) = [ln for ln in err.splitlines() if ln.startswith("stopped after step")]
    stopped = int(line.split()[3])
    assert line == (
        f"stopped after step {stopped} of 8 (SIGTERM): continue it with: "
        f"vapo-lab train resume=runs/{name}"
    )
    # after the last logged step, or after the next one's update when it stopped before its
    # evaluation
    assert stopped == last or (stopped == last + 1 and stopped % 4 == 0), (stopped, last)
    assert (run_dir / "failure.txt").read_text().startswith(f"interrupted at step {stopped}")


def test_an_overdue_warning_requeues_from_the_watchdog_without_interrupting_the_run():
    # a cell on Slurm: the main thread may sit in a collective where no interrupt reaches it, so
    # the watchdog thread itself calls the requeue (submitit's, from the last checkpoint)
    calls = []
    previous = signal.getsignal(signal.SIGUSR2)
    try:
        with stop_on_signals():
            h = stop.sigterm_interrupts(save_within=0.3, overdue=lambda: calls.append(time.time()))
            start = time.time()
            os.kill(os.getpid(), signal.SIGUSR2)
            while time.time() < start + 2:  # a step that never reaches a safe point
                pass
            assert len(calls) == 1 and 0.25 < calls[0] - start < 1.5  # once, at its deadline
            assert h.overdue_called  # the save that follows does not requeue a second time
            with pytest.raises(StopRequested) as e:  # the request still stands, now saving
                h.stop_point(can_save=True)
            assert e.value.save
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_the_job_deadline_stops_at_a_point_that_can_save_when_the_next_unit_cannot_fit():
    h = stop.StopHandler(deadline=time.time() + 100)
    try:
        h.stop_point(can_save=True, need_s=50)  # fits
        h.stop_point(can_save=False, need_s=500)  # the first unit of an attempt always runs
        with pytest.raises(StopRequested) as e:
            h.stop_point(can_save=True, need_s=500)
        assert e.value.reason == "time limit" and e.value.save
        assert e.value.signum == signal.SIGUSR2  # a cell requeues as for Slurm's warning
        assert "the next unit and a save need 500 s" in str(e.value)
    finally:
        h.close()
    clock = stop.AttemptClock()
    clock.add("step", 3.0)
    clock.add("step", 5.0)
    clock.add("save", 9.0)
    clock.add("save", 2.0)
    # the longest step, the last save and the margin
    assert clock.need("step") == 5.0 + 2.0 + stop.STOP_MARGIN_S
    assert clock.need("step", "eval") == 5.0 + 2.0 + stop.STOP_MARGIN_S  # no evaluation yet
