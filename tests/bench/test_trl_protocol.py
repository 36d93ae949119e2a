"""The pipe between driver and workers, and the worker entry point a TRL env's interpreter runs."""

import subprocess
import sys

import pytest

from vapo_lab.bench.trl.protocol import WorkerProcess, worker_argv, worker_env
from vapo_lab.bench.trl.spec import TrlBenchError


def test_dead_worker_is_one_line_error_with_its_last_words(tmp_path, small_spec):
    worker = WorkerProcess(
        "broken",
        [sys.executable, "-c", "import sys; sys.exit('boom: no model')"],
        tmp_path / "w.log",
        worker_env(small_spec),
    )
    with pytest.raises(
        TrlBenchError, match=r"worker broken exited with code 1: boom: no model"
    ) as info:
        worker.recv(timeout=60)
    worker.close()
    assert "\n" not in str(info.value)


def test_worker_entry_runs_by_path_where_vapo_lab_is_not_installed(tmp_path, small_spec):
    # python -S: no site-packages, so neither vapo-lab nor torch, as for the package in a TRL env;
    # the entry point loads vapo_lab from this tree and reaches the worker dispatch (unknown kind)
    argv = worker_argv(sys.executable, "nope", tmp_path / "model", small_spec, tmp_path)
    done = subprocess.run(
        [argv[0], "-S", *argv[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        env=worker_env(small_spec),
    )
    assert (
        done.returncode == 1
        and done.stderr.strip().splitlines()[-1] == "unknown worker kind 'nope'"
    )
