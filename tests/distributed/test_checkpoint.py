"""Distributed checkpoints: an optimiser's whole state (tensors and the plain values of its param
groups, e.g. a scheduled learning rate) comes back exactly; a hostile .metadata never runs."""

import os
import pickle

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from vapo_lab.distributed.dcp import load_sharded, save_sharded
from vapo_lab.distributed.fsdp import full, shard
from vapo_lab.errors import CheckpointError


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def _trained(world, steps):
    model = shard(Net(), world, torch.device("cpu"), None)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 10)
    x = torch.linspace(-1, 1, 32).view(8, 4)
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
        sched.step()
    return model, opt


def test_a_saved_model_and_optimiser_load_exactly(group, tmp_path):
    model, opt = _trained(group, 3)
    m, o = get_state_dict(model, opt)
    save_sharded(tmp_path / "ck", {"m": m, "o": o})
    fresh, fresh_opt = _trained(group, 0)
    m2, o2 = get_state_dict(fresh, fresh_opt)
    state = {"m": m2, "o": o2}
    load_sharded(tmp_path / "ck", state)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["m"], optim_state_dict=state["o"])
    for (name, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert torch.equal(full(a.detach()), full(b.detach())), name
    assert (
        fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == pytest.approx(0.1 * 4 / 10)
    )
    for p, q in zip(opt.param_groups[0]["params"], fresh_opt.param_groups[0]["params"]):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(full(opt.state[p][k]), full(fresh_opt.state[q][k]))


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/vapo-hostile-dcp",))


def test_a_hostile_metadata_file_is_refused_without_running(group, tmp_path):
    model, opt = _trained(group, 1)
    m, o = get_state_dict(model, opt)
    save_sharded(tmp_path / "ck", {"m": m})
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(_Boom()))
    if os.path.exists("/tmp/vapo-hostile-dcp"):
        os.remove("/tmp/vapo-hostile-dcp")
    with pytest.raises(
        CheckpointError,
        match=r"refusing to load .*\.metadata: (posix|os)\.system is not a checkpoint",
    ):
        load_sharded(tmp_path / "ck", {"m": get_state_dict(model, opt)[0]})
    assert not os.path.exists("/tmp/vapo-hostile-dcp")
