"""Checkpoints load without running code, fall back past a damaged one, and keep exact state."""

import json
import os
import random

import pytest
import torch

from vapo_lab.errors import CheckpointError
from vapo_lab.integrity import write_manifest
from vapo_lab.runs.checkpoint import (
    STATE_FILE,
    latest_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


class Payload:
    """Unpickling this runs ``touch <marker>``: what a hostile checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _state():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched.step()
    return {
        "actor_opt": opt.state_dict(),
        "actor_sched": sched.state_dict(),
        "rng": rng_state({"g": torch.Generator().manual_seed(5)}),
        "data": {"epoch": 1, "index": 7},
        "best_eval": 0.25,
    }


def test_state_round_trips_exactly(tmp_path):
    state = _state()
    back = load_state(save_checkpoint(tmp_path, 4, {}, state))
    assert (
        back["step"] == 4 and back["data"] == {"epoch": 1, "index": 7} and back["best_eval"] == 0.25
    )
    assert torch.equal(
        back["actor_opt"]["state"][0]["exp_avg"], state["actor_opt"]["state"][0]["exp_avg"]
    )
    assert back["actor_sched"] == state["actor_sched"]
    g = torch.Generator()
    set_rng_state(back["rng"], {"g": g})
    assert torch.equal(g.get_state(), torch.Generator().manual_seed(5).get_state())


def test_rng_restore_gives_the_same_draws(tmp_path):
    random.seed(1)
    torch.manual_seed(1)
    path = save_checkpoint(tmp_path, 1, {}, {"rng": rng_state({})})
    first = (random.random(), torch.rand(3).tolist())
    set_rng_state(load_state(path)["rng"], {})
    assert (random.random(), torch.rand(3).tolist()) == first


def test_a_malicious_state_file_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = save_checkpoint(tmp_path / "ckpt", 2, {}, _state())
    torch.save({"actor_opt": Payload(marker)}, path / STATE_FILE)
    # a forged checkpoint can carry matching checksums: they are not the defence
    write_manifest(path)
    with pytest.raises(
        CheckpointError, match=r"refusing to load .*trainer_state\.pt.*could run code"
    ):
        load_state(path)
    assert not marker.exists()
    # the same file through torch.load's unsafe mode would have run it (the test's payload is real)
    torch.load(path / STATE_FILE, weights_only=False)
    assert marker.exists()


def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before(tmp_path):
    save_checkpoint(tmp_path, 1, {}, _state())
    newest = save_checkpoint(tmp_path, 2, {}, _state())
    assert latest_checkpoint(tmp_path) == newest
    data = (newest / STATE_FILE).read_bytes()
    (newest / STATE_FILE).write_bytes(b"\0" * len(data))  # zeroed, same size
    said = []
    assert latest_checkpoint(tmp_path, warn=said.append) == tmp_path / "step_000001"
    assert len(said) == 1 and "step_000002 is unusable" in said[0] and "step_000001" in said[0]
    (tmp_path / "step_000001" / "trainer_state.json").write_text("{")  # truncated
    assert latest_checkpoint(tmp_path) is None


def test_a_write_killed_before_its_rename_leaves_the_previous_checkpoints(tmp_path):
    first = save_checkpoint(tmp_path, 1, {}, _state())

    def killed():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, {}, _state(), before_commit=killed)
    assert latest_checkpoint(tmp_path) == first
    assert json.loads((first / "trainer_state.json").read_text())["step"] == 1
    save_checkpoint(tmp_path, 2, {}, _state())  # the next write clears the half-written folder
    assert not list(tmp_path.glob(".tmp_step_*"))
