"""The trainer's state sent to host memory for the rollout and back (vapo_lab.distributed.offload):
every parameter, gradient and AdamW state tensor lands in new host storage (pinned from CUDA),
comes back bit-equal, and the next steps equal a twin's that never left, for each AdamW kernel,
on one process and FSDP2-sharded on 2 gloo ranks; a trainer run with
``trainer.offload_during_rollout=true`` steps as one without: same metrics, weights and AdamW
state."""

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import vapo_lab.distributed.offload as offload_module
import vapo_lab.trainer.phases as phases_module
from tests.distributed.rank_offload import IMPLS, Tiny, optimizer, roundtrip, tensors, train
from vapo_lab.config.compose import compose_config
from vapo_lab.distributed.offload import on_host, to_host
from vapo_lab.trainer.trainer import Trainer

from .conftest import torchrun

SCRIPT = Path(__file__).with_name("rank_offload.py")
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _failed(checks: dict[str, bool]) -> list[str]:
    return [name for name, ok in checks.items() if not ok]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", IMPLS)
def test_offload_and_back_keeps_every_tensor_and_the_next_steps(impl, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    dev = torch.device(device)

    def make():
        torch.manual_seed(0)
        model = Tiny().to(dev)
        return model, copy.deepcopy(model)

    checks = roundtrip(make, impl, dev)
    assert ("pinned" in checks) == (device == "cuda")  # CPU: the host is the device, nothing to pin
    assert _failed(checks) == []


def test_offload_and_back_on_two_fsdp_ranks(tmp_path):
    torchrun(2, SCRIPT, str(tmp_path), timeout=120)
    for rank in (0, 1):
        checks = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert sorted(checks) == sorted(IMPLS)
        for impl, c in checks.items():
            assert "fsdp storage follows (device)" in c
            assert _failed(c) == [], (rank, impl)


def test_a_failed_offload_or_rollout_puts_everything_back():
    torch.manual_seed(0)
    model = Tiny()
    opt = optimizer(model, "fused")
    train(model, opt, 1, seed=1, device=torch.device("cpu"))
    saved = {k: t.detach().clone() for k, t in tensors(model, opt).items()}

    def unchanged() -> bool:
        now = tensors(model, opt)
        return now.keys() == saved.keys() and all(torch.equal(now[k], saved[k]) for k in now)

    # the second module holds the first one's head: moving it would move those parameters twice
    with pytest.raises(ValueError, match="shares parameters with a module offloaded before it"):
        to_host([model, nn.Sequential(model.head)], [opt])
    assert unchanged()
    with pytest.raises(KeyError), on_host([model], [opt]) as offloaded:  # a rollout that raises
        raise KeyError("rollout")
    assert offloaded.modules == [] and offloaded.states == [] and unchanged()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh working directory (caches are looked up in the cwd, then in the shipped entries)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# the embedded default, whose base model is shipped (nothing is built): a critic started from the
# policy with no value pretraining (their caches would be built for a smaller batch), one prompt
# (8 samples) a step, short responses
EMBEDDED = [
    "tracking=none",
    "value_pretraining=off",
    "critic.init=policy",
    "rollout.responses_per_step=8",
    "trainer.mini_batch_size=8",
    "rollout.max_new_tokens=64",
    "trainer.threads=2",
]


def test_a_run_with_offload_during_rollout_steps_the_same(workdir, monkeypatch):
    moved = []

    def spy(modules, optimizers, host="cpu"):
        modules, optimizers = list(modules), list(optimizers)
        moved.append((sum(m is not None for m in modules), sum(o is not None for o in optimizers)))
        return on_host(modules, optimizers, host)

    monkeypatch.setattr(phases_module, "on_host", spy)

    def run(offload: bool) -> tuple[list[dict], Trainer]:
        composed = compose_config(
            overrides=[
                *EMBEDDED,
                f"run_name=offload-{offload}",
                f"trainer.offload_during_rollout={offload}",
            ]
        )
        trainer = Trainer(composed.cfg, composed.choices, log=lambda m: None)
        # 2 steps: the first offload finds no AdamW state yet, the second finds it and the gradients
        steps = [trainer.train_step() for _ in range(2)]
        return [
            {k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in steps
        ], trainer

    plain, a = run(False)
    assert moved == []  # off by default
    offloaded, b = run(True)
    # the policy and the critic (no reference: kl.coef=0), both AdamWs
    assert moved == [
        (2, 2),
        (2, 2),
    ]
    assert "critic/value_loss" in plain[1] and "actor/grad_norm" in plain[1]
    assert json.dumps(offloaded, sort_keys=True) == json.dumps(plain, sort_keys=True)
    for x, y in [(a.policy, b.policy), (a.critic, b.critic)]:
        assert all(torch.equal(p, q) for p, q in zip(x.parameters(), y.parameters(), strict=True))
    for x, y in [(a.actor_opt, b.actor_opt), (a.critic_opt, b.critic_opt)]:
        sx, sy = x.state_dict()["state"], y.state_dict()["state"]
        assert sx.keys() == sy.keys() and all(
            torch.equal(sx[i][k], sy[i][k]) for i in sx for k in sx[i]
        )


@pytest.mark.parametrize("offload", [True, False])
def test_the_engine_sleeps_before_the_state_comes_back(offload, monkeypatch):
    # Phases.rollout under trainer.offload_during_rollout: the state goes to host memory, the
    # engine samples, the engine sleeps, the state comes back. Sleeping after the state came back
    # held both on the device at the end of every rollout (the evaluation's peak). On CPU the
    # host is the device, but each move copies into new storage: the parameter's storage tells
    # which copy is live when the engine sleeps.
    torch.manual_seed(0)
    model = Tiny()
    opt = optimizer(model, "foreach")
    train(model, opt, 1, seed=1, device=torch.device("cpu"))
    weight = model.head.weight
    events, storage = [], {}

    def collect(*args):
        events.append("sampled")
        storage["sampling"] = weight.data_ptr()
        return "batch", {}

    class Engine:
        def sleep(self):
            events.append("asleep")
            storage["asleep"] = weight.data_ptr()

    to_device = offload_module.to_device

    def back(offloaded):
        events.append("state back")
        to_device(offloaded)

    monkeypatch.setattr(phases_module, "collect", collect)
    monkeypatch.setattr(offload_module, "to_device", back)
    parts = SimpleNamespace(
        sampling=SimpleNamespace(engine=Engine()),
        scorer=None,
        world=None,
        device=torch.device("cpu"),
    )
    trainer = SimpleNamespace(offload_during_rollout=offload)
    phases = phases_module.Phases(parts, trainer, temperature=1.0)
    before = weight.data_ptr()
    out = phases.rollout(None, False, None, None, None, [model], [opt])
    assert out == ("batch", {})
    if offload:
        assert events == ["sampled", "asleep", "state back"]
        # sampled and asleep with the host copy; the device copy is new storage after
        assert storage["sampling"] != before and storage["asleep"] == storage["sampling"]
        assert weight.data_ptr() != storage["asleep"]
    else:
        assert events == ["sampled", "asleep"] and storage["asleep"] == before
