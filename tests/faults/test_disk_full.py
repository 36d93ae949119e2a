"""A disk that fills up while a checkpoint is written: one line that names the folder, the space the
checkpoint needs and how to resume; the partial folder removed, the previous checkpoint intact, and
the run resumed after freeing space ends with the uninterrupted run's history.

Each test mounts a small tmpfs (root, or a system that lets this user mount): without one it is
skipped, saying so. The end-to-end test is slow: `pytest -m slow tests/faults/test_disk_full.py`.
"""

import json

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import save_file

# a fixture: a process group of this process
from tests.distributed.conftest import group  # noqa: F401
from vapo_lab.distributed.fsdp import shard
from vapo_lab.errors import CheckpointError
from vapo_lab.integrity import manifest_problem
from vapo_lab.runs.checkpoint import latest_checkpoint, load_state, save_checkpoint
from vapo_lab.trainer.checkpointer import CheckpointManager

from .conftest import MB, RUN, assert_like_reference, fill, store, train


class Weights:
    """A model as the checkpoint writer sees one: ``state_dict`` and ``save`` (one safetensors
    file)."""

    def __init__(self, mib: int):
        self.weight = torch.ones(mib * MB // 4)

    def state_dict(self):
        return {"weight": self.weight}

    def save(self, path):
        path.mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict(), str(path / "model.safetensors"))


def _state(mib: int):
    return {"actor_opt": {"state": {0: {"exp_avg": torch.ones(mib * MB // 4)}}}, "best_eval": 0.5}


# free space left after the first checkpoint: the second fails in the model's safetensors file
# (safetensors raises its own error), or in trainer_state.pt (torch raises a RuntimeError)
@pytest.mark.parametrize("leave_mib, where", [(1, "safetensors"), (4, "torch.save")])
def test_a_full_disk_is_one_line_and_leaves_the_previous_checkpoint(small_disk, leave_mib, where):
    folder = small_disk / "run" / "checkpoints"
    first = save_checkpoint(folder, 1, {"policy": Weights(2)}, _state(4))
    filler = fill(small_disk, leave_mib * MB)
    with pytest.raises(CheckpointError) as raised:
        save_checkpoint(folder, 2, {"policy": Weights(2)}, _state(4))
    message = str(raised.value)
    assert "\n" not in message
    assert str(folder) in message and "step_000002" in message
    # 2 MiB of weights and 4 of optimiser state; the free space once the partial folder is gone
    assert f"needs about 6.0 MiB, {leave_mib}.0 MiB are free" in message
    assert f"vapo-lab train resume={folder.parent}" in message and "step_000001" in message
    assert not list(folder.glob(".tmp_step_*"))  # the partial folder is gone
    assert latest_checkpoint(folder) == first and manifest_problem(first) is None
    assert load_state(first)["step"] == 1
    filler.unlink()  # space freed: the same checkpoint is written
    second = save_checkpoint(folder, 2, {"policy": Weights(2)}, _state(4))
    assert latest_checkpoint(folder) == second


def test_a_write_error_that_is_not_space_names_the_error(tmp_path, monkeypatch):
    folder = tmp_path / "run" / "checkpoints"
    first = save_checkpoint(folder, 1, {}, _state(1))

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(folder / "x"))

    monkeypatch.setattr(torch, "save", refused)
    with pytest.raises(
        CheckpointError, match=r"cannot write checkpoint step_000002 .*Permission denied.*resume="
    ) as e:
        save_checkpoint(folder, 2, {}, _state(1))
    assert "\n" not in str(e.value)
    assert not list(folder.glob(".tmp_step_*")) and latest_checkpoint(folder) == first


def test_a_full_disk_under_a_sharded_checkpoint_is_one_line_and_leaves_the_previous_one(
    small_disk,
    group,  # noqa: F811
):
    """A sharded run's models and optimisers are written by torch's distributed checkpointing, which
    raises its own CheckpointException (every rank's failures and stacks) on every rank."""
    torch.manual_seed(0)
    net = torch.nn.Module()
    # what shard() wraps
    net.layers = torch.nn.ModuleList([torch.nn.Linear(512, 512), torch.nn.Linear(512, 1)])
    net.forward = lambda x: net.layers[1](net.layers[0](x))
    model = shard(net, group, torch.device("cpu"), None)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 512)).sum().backward()
    opt.step()  # AdamW's state exists: 3 x 1.0 MiB of parameters, moments
    folder = small_disk / "run" / "checkpoints"
    manager = CheckpointManager(
        folder, group, {"policy": model}, {"actor_opt": ("policy", opt)}, {}, {}
    )
    first = manager.save(1)
    filler = fill(small_disk, 1 * MB)
    with pytest.raises(CheckpointError) as raised:
        manager.save(2)
    message = str(raised.value)
    assert "\n" not in message and "CheckpointException" not in message
    assert message.startswith(
        f"no space left to write checkpoint step_000002 in {folder}: it needs about 3.0 MiB, "
        "1.0 MiB are free; free at least 2.0 MiB there"
    ), message
    assert f"vapo-lab train resume={folder.parent} (it continues from step_000001)" in message
    assert not list(folder.glob(".tmp_step_*")) and latest_checkpoint(folder) == first
    assert manifest_problem(first) is None
    filler.unlink()  # space freed: the same checkpoint is written
    second = manager.save(2)
    assert latest_checkpoint(folder) == second and manifest_problem(second) is None


@pytest.mark.slow
def test_a_disk_full_mid_run_fails_in_one_line_then_resumes_exactly(workdir, small_disk):
    reference = workdir / "runs" / "reference"
    size = sum(
        f.stat().st_size
        for f in (reference / "checkpoints" / "step_000006").rglob("*")
        if f.is_file()
    )
    # room for the checkpoint of step 3 and half of step 6's (checkpoints every 3 steps)
    filler = fill(small_disk, int(1.5 * size))
    run_dir = small_disk / "runs" / "full"
    failed = train(
        workdir,
        *RUN,
        f"tracking.uri={store(workdir)}",
        "run_name=full",
        f"output_dir={small_disk / 'runs'}",
    )
    assert failed.returncode == 1, failed.stderr[-3000:]
    lines = [line for line in failed.stderr.splitlines() if line.strip()]
    assert "Traceback" not in failed.stderr, failed.stderr[-3000:]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == lines[-1], lines[-5:]
    assert (
        "no space left" in errors[0] and "step_000006" in errors[0] and "needs about" in errors[0]
    )
    assert f"vapo-lab train resume={run_dir}" in errors[0]
    checkpoints = run_dir / "checkpoints"
    assert sorted(
        p.name for p in checkpoints.iterdir() if p.name.startswith(("step_", ".tmp"))
    ) == ["step_000003"]
    assert manifest_problem(checkpoints / "step_000003") is None
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    # the run's record (trainer/record.py) says it failed, and why
    assert MlflowClient(store(workdir)).get_run(run_id).info.status == "FAILED"
    assert "no space left" in (run_dir / "failure.txt").read_text()

    filler.unlink()
    resumed = train(workdir, f"resume={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed {run_dir} at step 3" in resumed.stderr and "differs" not in resumed.stderr
    assert_like_reference(run_dir, reference, store(workdir))
