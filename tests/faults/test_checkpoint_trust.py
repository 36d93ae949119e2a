"""Checkpoints that are not the run's own: one from another model copied into the run's folder,
checkpoints whose files no longer match their manifest, a tensor file that holds a pickle. Each
resume is refused in one line before the run's tracking run is reopened: nothing trains, nothing
from the file runs, and the run's status in MLflow stays what it was. The end-to-end tests are slow
(a few minutes): `pytest -m slow tests/faults/test_checkpoint_trust.py`."""

import json
import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from tests.trainer.conftest import SMALL
from vapo_lab.distributed.world import single
from vapo_lab.errors import CheckpointError
from vapo_lab.integrity import write_manifest
from vapo_lab.models.value import HEAD_FILE, ValueModel
from vapo_lab.trainer.checkpointer import (
    CheckpointManager,
    architecture,
    checkpoint_to_resume,
    tensor_shapes,
)

from .conftest import store, train

# a finished run with two checkpoints (steps 1 and 2)
FINISHED = [
    o for o in SMALL if o != "tracking=none" and not o.startswith("trainer.total_steps=")
] + ["trainer.total_steps=2"]


class Payload:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _policy(hidden):
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(config)


def _save(folder, hidden, step=1):
    """Saves a policy and critic of width ``hidden`` as the trainer does; returns the checkpoint."""
    policy = _policy(hidden)
    models = {"policy": policy, "critic": ValueModel.from_causal_lm(policy)}
    return CheckpointManager(folder, single(), models, {}, {}, {}, log=lambda m: None).save(
        step
    ), models


def _expected(hidden):
    arch = architecture(_policy(hidden))
    return {"policy": arch, "critic": arch}


def test_a_run_that_never_wrote_a_checkpoint_starts_from_step_0(tmp_path):
    assert checkpoint_to_resume(tmp_path / "checkpoints", _expected(16)) is None


def test_the_newest_usable_checkpoint_is_chosen_and_a_damaged_newer_one_named(tmp_path):
    first, _ = _save(tmp_path, 16, step=1)
    second, _ = _save(tmp_path, 16, step=2)
    (second / "trainer_state.json").write_text("{}\n")
    said = []
    assert checkpoint_to_resume(tmp_path, _expected(16), warn=said.append) == first
    assert len(said) == 1 and "step_000002 is unusable" in said[0]


def test_checkpoints_that_all_fail_their_checksums_are_refused_never_a_fresh_start(tmp_path):
    for step in (1, 2):
        path, _ = _save(tmp_path, 16, step=step)
        # complete, not what was written
        (path / "trainer_state.json").write_text(json.dumps({"step": 0}) + "\n")
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_resume(tmp_path, _expected(16))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"no usable checkpoint in {tmp_path}")
    assert (
        f"{tmp_path}/step_000002/trainer_state.json has " in message
        and "1 older one(s) unusable too" in message
    )
    assert "without resume=" in message
    for path in tmp_path.glob("step_*"):  # every folder gone: `latest` says one was committed
        shutil.rmtree(path)
    with pytest.raises(
        CheckpointError, match=r"no usable checkpoint .*names step_000002, and no step_\* folder"
    ):
        checkpoint_to_resume(tmp_path, _expected(16))


@pytest.mark.parametrize("drop_record", [False, True], ids=["recorded", "older-checkpoint"])
def test_another_models_checkpoint_is_refused_naming_the_difference(tmp_path, drop_record):
    path, _ = _save(tmp_path, 32)
    if drop_record:  # written before checkpoints recorded their models: the config.json files say
        meta = json.loads((path / "trainer_state.json").read_text())
        (path / "trainer_state.json").write_text(json.dumps({"step": meta["step"]}) + "\n")
        write_manifest(path)
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_resume(tmp_path, _expected(16))
    assert str(e.value) == (
        f"{path} is not a checkpoint of this run's model: its policy has hidden_size=32, "
        f"this run's has hidden_size=16; move it out of {tmp_path} to resume from the run's "
        "own checkpoints"
    )
    without_critic = {"policy": _expected(32)["policy"]}  # a run with no critic (grpo, dapo)
    with pytest.raises(CheckpointError, match="it has a critic, and this run has none"):
        checkpoint_to_resume(tmp_path, without_critic)
    assert checkpoint_to_resume(tmp_path, _expected(32)) == path


def _mixture(experts):
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=experts,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    return Qwen3MoeForCausalLM(config)


def test_a_checkpoint_whose_tensors_have_other_shapes_is_refused_where_the_architecture_agrees(
    tmp_path,
):
    # the expert count is no ARCH_KEY: only the tensor shapes tell the models apart
    saved = _mixture(8)
    path = CheckpointManager(
        tmp_path, single(), {"policy": saved}, {}, {}, {}, log=lambda m: None
    ).save(1)
    mine = _mixture(4)
    assert architecture(mine) == architecture(saved)
    with pytest.raises(CheckpointError) as e:
        checkpoint_to_resume(
            tmp_path, {"policy": architecture(mine)}, shapes={"policy": tensor_shapes(mine)}
        )
    assert str(e.value) == (
        f"{path} is not a checkpoint of this run's model: its policy's "
        "model.layers.0.mlp.experts.gate_up_proj is 8x16x16, this run's is 4x16x16; move it out of "
        f"{tmp_path} to resume from the run's own checkpoints"
    )
    same = _mixture(8)
    assert (
        checkpoint_to_resume(
            tmp_path, {"policy": architecture(same)}, shapes={"policy": tensor_shapes(same)}
        )
        == path
    )
    # a checkpoint that recorded no shapes
    meta = json.loads((path / "trainer_state.json").read_text())
    (path / "trainer_state.json").write_text(
        json.dumps({k: v for k, v in meta.items() if k != "shapes"}) + "\n"
    )
    # as an older vapo-lab wrote it: judged by the architecture alone, which agrees
    write_manifest(path)
    assert (
        checkpoint_to_resume(
            tmp_path, {"policy": architecture(mine)}, shapes={"policy": tensor_shapes(mine)}
        )
        == path
    )


def test_a_tensor_file_holding_a_pickle_is_refused_in_one_line_before_and_at_loading(tmp_path):
    path, models = _save(tmp_path, 16)
    marker = tmp_path / "pwned"
    torch.save({"weight": Payload(marker)}, path / "critic" / HEAD_FILE)
    # a forger can recompute the checksums: they detect corruption, not tampering
    write_manifest(path)
    with pytest.raises(CheckpointError) as before:
        checkpoint_to_resume(tmp_path, _expected(16))
    manager = CheckpointManager(tmp_path, single(), models, {}, {}, {}, log=lambda m: None)
    # where it is read, too (a file changed since the check)
    with pytest.raises(CheckpointError) as loading:
        manager.load(path)
    for e in (before, loading):
        assert str(e.value).startswith(
            f"refusing to load {path / 'critic' / HEAD_FILE}: it holds Python objects"
        )
        assert "\n" not in str(e.value) and "weights_only" not in str(e.value)
    assert not marker.exists()


@pytest.fixture(scope="module")
def trust_dir(tmp_path_factory):
    """A working directory whose caches are built once (by a first finished run)."""
    path = tmp_path_factory.mktemp("trust")
    done = train(path, *FINISHED, f"tracking.uri={store(path)}", "run_name=first")
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def finished_run(workdir, name):
    """Returns the folder of a new finished run ``name`` (tracked in ``workdir``'s MLflow store)."""
    done = train(workdir, *FINISHED, f"tracking.uri={store(workdir)}", f"run_name={name}")
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = workdir / "runs" / name
    assert _status(workdir, run_dir) == "FINISHED"
    return run_dir


def _status(workdir, run_dir):
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    return MlflowClient(store(workdir)).get_run(run_id).info.status


def refused(workdir, run_dir, *expected):
    """Resumes ``run_dir``; checks it is refused in one line holding ``expected`` and changes
    nothing."""
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    done = train(workdir, f"resume=runs/{run_dir.name}")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], lines[-8:]
    for phrase in expected:
        assert phrase in errors[0], errors[0]
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics  # nothing trained, nothing logged
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == checkpoints
    return errors[0], done.stderr


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_refused_in_one_line_and_no_status_changes(trust_dir):
    run_dir = finished_run(trust_dir, "mine")
    other = train(
        trust_dir,
        *FINISHED,
        "model.arch.hidden_size=32",
        "model.arch.intermediate_size=64",
        "trainer.total_steps=3",
        "trainer.save_every=3",
        f"tracking.uri={store(trust_dir)}",
        "run_name=other-model",
    )
    assert other.returncode == 0, other.stderr[-3000:]
    other_dir = trust_dir / "runs" / "other-model"
    shutil.copytree(
        other_dir / "checkpoints" / "step_000003", run_dir / "checkpoints" / "step_000003"
    )
    refused(trust_dir, run_dir, "step_000003", "hidden_size", "32", "64")
    assert _status(trust_dir, run_dir) == "FINISHED" and _status(trust_dir, other_dir) == "FINISHED"


@pytest.mark.slow
def test_a_run_whose_checkpoints_all_fail_their_checksums_is_refused_never_started_over(trust_dir):
    run_dir = finished_run(trust_dir, "replaced")
    ckpts = run_dir / "checkpoints"
    # the two checkpoints' state files swapped: each file complete, neither what its manifest says
    one, two = (ckpts / f"step_00000{s}" / "trainer_state.pt" for s in (1, 2))
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b)
    two.write_bytes(a)
    refused(trust_dir, run_dir, "no usable checkpoint", "step_000002", "without resume=")
    assert _status(trust_dir, run_dir) == "FINISHED"


@pytest.mark.slow
def test_a_tensor_file_holding_a_pickle_is_refused_in_one_line_and_never_runs(trust_dir):
    run_dir = finished_run(trust_dir, "pickled")
    ckpt = run_dir / "checkpoints" / "step_000002"
    marker = trust_dir / "pwned"
    torch.save({"weight": Payload(marker)}, ckpt / "critic" / "value_head.pt")
    # a forger can recompute the checksums: they detect corruption, not tampering
    write_manifest(ckpt)
    _, stderr = refused(trust_dir, run_dir, "refusing to load", "critic/value_head.pt")
    assert "weights_only" not in stderr
    assert not marker.exists()
    assert _status(trust_dir, run_dir) == "FINISHED"
