"""kill -9 at three points of a run, a corrupt latest checkpoint, a zeroed cache, a hostile
checkpoint: each run ends with the uninterrupted run's history, each step logged once, and a
hostile file never runs. Slow (a few minutes): `pytest -m slow tests/faults`."""

import json

import pytest
import torch

from vapo_lab.integrity import write_manifest

from .conftest import RUN, assert_like_reference, records, store, train

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fault", ["rollout@5", "update@5", "checkpoint@6"])
def test_kill_then_resume_logs_each_step_once_with_the_uninterrupted_values(workdir, fault):
    name = f"killed-{fault.replace('@', '-')}"
    killed = train(workdir, *RUN, f"tracking.uri={store(workdir)}", f"run_name={name}", fault=fault)
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL: no cleanup ran
    run_dir = workdir / "runs" / name
    before = records(run_dir)
    point, step = fault.split("@")
    # mid-checkpoint: the step was logged, its checkpoint never committed
    assert max(s for kind, s in before if kind == "train") == int(step) - (point != "checkpoint")
    resumed = train(workdir, f"resume=runs/{name}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed" in resumed.stderr and "differs" not in resumed.stderr
    assert_like_reference(run_dir, workdir / "runs" / "reference", store(workdir))


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(workdir):
    killed = train(
        workdir, *RUN, f"tracking.uri={store(workdir)}", "run_name=corrupt", fault="update@8"
    )
    assert killed.returncode == -9
    ckpts = workdir / "runs" / "corrupt" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000003", "step_000006"]
    weights = ckpts / "step_000006" / "policy" / "model.safetensors"
    weights.write_bytes(b"\0" * weights.stat().st_size)
    resumed = train(workdir, "resume=runs/corrupt")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (
        "checkpoint step_000006 is unusable" in resumed.stderr
        and "resumed runs/corrupt at step 3" in resumed.stderr
    )
    assert_like_reference(
        workdir / "runs" / "corrupt", workdir / "runs" / "reference", store(workdir)
    )


def test_zeroed_cache_entries_are_rebuilt_never_used(workdir):
    cache = workdir / ".vapo_cache"
    zeroed = [
        next((cache / kind).glob("*/model.safetensors"))
        for kind in ("base", "reward_model", "pretrained_critic")
    ]
    for f in zeroed:
        f.write_bytes(b"\0" * f.stat().st_size)
    rerun = train(workdir, *RUN, f"tracking.uri={store(workdir)}", "run_name=after-zeroed-cache")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    for what in ("base model", "reward model", "pretrained critic"):
        assert f"the cached {what} is unusable" in rerun.stderr, what
    assert all(f.read_bytes().strip(b"\0") for f in zeroed)  # rebuilt in place
    # the builds are deterministic: the rebuilt caches give the reference's run exactly
    assert_like_reference(
        workdir / "runs" / "after-zeroed-cache", workdir / "runs" / "reference", store(workdir)
    )


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_checkpoint_is_refused_and_nothing_runs(workdir):
    killed = train(workdir, *RUN, "tracking=none", "run_name=hostile", fault="update@5")
    assert killed.returncode == -9
    ckpt = workdir / "runs" / "hostile" / "checkpoints" / "step_000003"
    marker = workdir / "pwned"
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    state["actor_opt"] = Payload(marker)
    torch.save(state, ckpt / "trainer_state.pt")
    write_manifest(ckpt)  # checksums that match: a forger can make them; they are not the defence
    resumed = train(workdir, "resume=runs/hostile")
    assert resumed.returncode == 1
    lines = [line for line in resumed.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: refusing to load") and "trainer_state.pt" in lines[-1]
    assert "Traceback" not in resumed.stderr
    assert not marker.exists()
    metrics = json.loads(
        (workdir / "runs" / "hostile" / "metrics.jsonl").read_text().splitlines()[-1]
    )
    assert metrics["step"] == 4  # nothing was lost either
