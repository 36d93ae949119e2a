"""The fault suite's shared pieces: a small run, an uninterrupted reference, and the checks that a
faulted-then-resumed run ends with the reference's history, each step logged once, everywhere."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.trainer.conftest import SMALL
from vapo_lab.runs.metrics_log import RESERVED, VOLATILE, record_kind

# checkpoints every 3 steps, so a kill leaves steps logged after the last checkpoint to recompute
STEPS = ["trainer.total_steps=8", "trainer.eval_every=4", "trainer.save_every=3"]
RUN = [o for o in SMALL if o != "tracking=none"] + STEPS


def train(
    workdir: Path, *args: str, fault: str | None = None, rank: int | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    """Runs `vapo-lab train --quiet ARGS` in ``workdir`` (``fault``: VAPO_FAULT, a SIGKILL
    point; ``rank``: VAPO_FAULT_RANK, the one rank it kills)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VAPO_FAULT", "VAPO_FAULT_RANK")}
    if fault:
        env["VAPO_FAULT"] = fault
    if rank is not None:
        env["VAPO_FAULT_RANK"] = str(rank)
    return subprocess.run(
        [sys.executable, "-m", "vapo_lab.cli", "train", "--quiet", *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def store(workdir: Path) -> str:
    return f"sqlite:///{workdir / 'mlflow.db'}"


def records(run_dir: Path) -> dict[tuple[str, int], dict]:
    """Returns {(kind, step): stable metrics} from metrics.jsonl, failing on any repeated step."""
    out: dict[tuple[str, int], dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = (record_kind(r), r["step"])
        assert key not in out, f"{key} logged twice in {run_dir / 'metrics.jsonl'}"
        out[key] = {k: v for k, v in r.items() if k not in RESERVED and not k.startswith(VOLATILE)}
    return out


def assert_like_reference(run_dir: Path, reference: Path, uri: str) -> None:
    """The run's history equals the reference's (each step once, the same values) in metrics.jsonl
    and in MLflow, and its MLflow run is FINISHED."""
    mine, ref = records(run_dir), records(reference)
    assert sorted(mine) == sorted(ref)
    for key in ref:
        assert mine[key] == ref[key], key
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    full = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        for k, v in r.items():
            if k not in RESERVED:
                full.setdefault(k, []).append((r["step"], v))
    for k, expected in full.items():
        got = sorted((m.step, _same_nan(m.value)) for m in client.get_metric_history(run_id, k))
        # each (key, step) once, the value metrics.jsonl holds
        assert got == sorted((step, _same_nan(v)) for step, v in expected), k


def _same_nan(value):
    """``value``, with any NaN as the string "nan": NaN != NaN, and a metric may be NaN (the
    critic's explained variance of returns that do not vary)."""
    return "nan" if isinstance(value, float) and math.isnan(value) else value


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory whose caches (base, reward model, critic) and reference run are built
    once."""
    path = tmp_path_factory.mktemp("faults")
    done = train(path, *RUN, f"tracking.uri={store(path)}", "run_name=reference")
    assert done.returncode == 0, done.stderr[-3000:]
    return path


MB = 1 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 40 MiB tmpfs at ``tmp_path/disk``, unmounted afterwards (skips where mounting is
    refused)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot mount a tmpfs to fill up ({e}): run as root to test a full disk")
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs to fill up ({done.stderr.strip()}): "
            "run as root to test a full disk"
        )
    try:
        yield mount
    finally:  # lazily where a failed write's file is still open (its exception keeps the handle)
        if (
            subprocess.run(
                ["umount", str(mount)], capture_output=True, timeout=60, check=False
            ).returncode
            != 0
        ):
            subprocess.run(["umount", "-l", str(mount)], check=True, timeout=60)


def fill(disk: Path, leave: int) -> Path:
    """Writes a file that leaves ``leave`` bytes free on ``disk``; returns it (delete it to free
    the space)."""
    filler = disk / "filler"
    size = shutil.disk_usage(disk).free - leave
    with filler.open("wb") as f:
        for _ in range(size // MB):
            f.write(b"\1" * MB)
        f.write(b"\1" * (size % MB))
    return filler
