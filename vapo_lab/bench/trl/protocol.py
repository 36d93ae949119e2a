"""The pipe between the benchmark's driver and its worker processes: JSON lines, steps on command.

Worker end: :class:`Channel` and :class:`Gate`. Driver end: :class:`WorkerProcess`,
:func:`worker_env` and :func:`worker_argv`. The TRL workers import this module too, so it imports
only the standard library and :mod:`.spec`.
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vapo_lab.bench.trl.spec import BenchSpec, TrlBenchError

# driver-side wait for one worker message (setup or a block of steps) before giving up
MESSAGE_TIMEOUT_S = 900.0
# the worker entry point, run by path: a TRL env's interpreter cannot import an uninstalled
# package by name
WORKER_MAIN = Path(__file__).resolve().with_name("__main__.py")


class Channel:
    """A worker's end of the pipe: JSON lines in on stdin, out on the original stdout.

    The original stdout is kept for the protocol and fd 1 is pointed at stderr, so prints and
    progress output of the libraries cannot corrupt the messages.
    """

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, **message: Any) -> None:
        self._out.write(json.dumps(message) + "\n")
        self._out.flush()

    def recv(self) -> dict[str, Any]:
        line = sys.stdin.readline()
        if not line:  # the driver is gone
            os._exit(0)
        return json.loads(line)


def peak_rss_mib() -> float:
    """Returns this process's peak resident set size in MiB (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Gate:
    """Counts steps for the driver: runs ``n`` steps per ``run`` command, then reports and waits.

    ``begin`` is called before the first step, ``end(tokens)`` after each; the time of a step is
    from the previous ``end`` (or the go) to this one, so everything a trainer does between two
    steps is counted.
    """

    def __init__(self, channel: Channel, info: dict[str, Any]) -> None:
        self.channel, self.info = channel, info
        self.remaining = 0
        self.times: list[float] = []
        self.tokens: list[int] = []
        self.t0 = 0.0

    def begin(self) -> None:
        self.channel.send(event="ready", rss_mib=peak_rss_mib(), **self.info)
        self._wait()

    def end(self, tokens: int) -> None:
        now = time.perf_counter()
        self.times.append(now - self.t0)
        self.tokens.append(int(tokens))
        self.remaining -= 1
        if self.remaining <= 0:
            self.channel.send(
                event="done", seconds=self.times, tokens=self.tokens, rss_mib=peak_rss_mib()
            )
            self.times, self.tokens = [], []
            self._wait()
        else:
            self.t0 = time.perf_counter()

    def _wait(self) -> None:
        command = self.channel.recv()
        if command.get("cmd") != "run":
            os._exit(0)
        self.remaining = int(command["steps"])
        self.t0 = time.perf_counter()


class WorkerProcess:
    """A persistent worker process driven over its stdin / stdout; stderr goes to a log file."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict[str, str], hint: str = ""
    ) -> None:
        self.name, self.log_path, self.hint = name, log_path, hint
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            bufsize=1,
        )

    def send(self, **message: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None

    def recv(self, timeout: float = MESSAGE_TIMEOUT_S) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TrlBenchError(
                f"worker {self.name} sent nothing in {timeout:.0f}s: see {self.log_path}"
            )
        line = self.proc.stdout.readline()
        if not line:
            raise self._died()
        return json.loads(line)

    def _died(self) -> Exception:
        code = self.proc.wait(timeout=30)
        self._log.flush()
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else "no output"
        return TrlBenchError(
            f"worker {self.name} exited with code {code}: {last} (full log: {self.log_path})"
            + self.hint
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(cmd="stop")
            except Exception:  # noqa: BLE001 - already gone
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def worker_env(spec: BenchSpec) -> dict[str, str]:
    """Returns every worker's environment: ``spec.threads`` threads, offline, CPU only, quiet."""
    env = dict(os.environ)
    threads = str(spec.threads)
    env.update(
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        ACCELERATE_USE_CPU="true",
        PYTHONUNBUFFERED="1",
        CUDA_VISIBLE_DEVICES="",
    )
    env.pop("PYTHONPATH", None)  # a TRL env must not see the main env's packages
    return env


def worker_argv(
    python: str | Path, kind: str, model_dir: Path, spec: BenchSpec, workdir: Path
) -> list[str]:
    """Returns the command line that starts a worker of ``kind``.

    ``kind`` is ``ours-<algo>``, ``trl-ppo`` or ``trl-grpo`` (each TRL kind also with ``-nogc``).
    """
    return [
        str(python),
        str(WORKER_MAIN),
        "--worker",
        kind,
        "--model",
        str(model_dir),
        "--workdir",
        str(workdir),
        "--spec",
        json.dumps(asdict(spec)),
    ]
