"""The checkpoint manager saves and loads the parts it is handed, exactly, on one process; it
reads the layout of checkpoints written before the trainer's state was one part; it never imports
the trainer."""

import random

import pytest
import torch
from torch import nn

from vapo_lab.distributed.world import single
from vapo_lab.errors import CheckpointError
from vapo_lab.runs.checkpoint import rng_state, save_checkpoint, set_rng_state
from vapo_lab.trainer.checkpointer import CheckpointManager


class Value(nn.Module):
    """A model saved and read as ``ValueModel`` is (``save`` / ``load``)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(3, 1)

    def save(self, path):
        path.mkdir(parents=True)
        torch.save(self.state_dict(), path / "w.pt")

    @classmethod
    def load(cls, path):
        m = cls()
        m.load_state_dict(torch.load(path / "w.pt", weights_only=True))
        return m


class Counter:
    """A per-rank stateful part: a step count and an RNG stream."""

    def __init__(self, seed):
        self.n, self.gen = 0, torch.Generator().manual_seed(seed)

    def state_dict(self):
        return {"n": self.n, "rng": rng_state({"g": self.gen})}

    def load_state_dict(self, state):
        self.n = state["n"]
        set_rng_state(state["rng"], {"g": self.gen})


def _parts(seed):
    torch.manual_seed(seed)
    model = Value()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return model, opt, sched, Counter(seed)


def _manager(folder, model, opt, sched, counter):
    return CheckpointManager(
        folder,
        single(),
        {"critic": model},
        {"critic_opt": ("critic", opt)},
        {"critic_sched": sched},
        {"trainer": counter},
        log=lambda m: None,
    )


def _train(model, opt, sched, counter, steps):
    for _ in range(steps):
        loss = model.head(torch.randn(4, 3, generator=counter.gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        counter.n += 1


def test_a_loaded_checkpoint_continues_exactly_as_the_saved_parts_would(tmp_path):
    a = _parts(0)
    _train(*a, steps=3)
    path = _manager(tmp_path, *a).save(3)
    assert path.name == "step_000003"
    _train(*a, steps=2)  # the uninterrupted parts go on

    b = _parts(1)  # other weights, optimiser state, schedule and stream: all replaced by the load
    assert _manager(tmp_path, *b).load() == path
    assert b[3].n == 3
    _train(*b, steps=2)
    assert b[3].n == a[3].n == 5
    for p, q in zip(a[0].parameters(), b[0].parameters()):
        assert torch.equal(p, q)
    assert b[2].get_last_lr() == a[2].get_last_lr()
    assert torch.equal(b[3].gen.get_state(), a[3].gen.get_state())


def test_a_dead_partial_save_is_removed_at_the_next_start_and_the_last_good_one_loads(tmp_path):
    a = _parts(0)
    _train(*a, steps=2)
    good = _manager(tmp_path, *a).save(2)
    # a save of step 3 killed before its rename (a sharded one's folder, and one process's)
    for name in (".tmp_step_000003_ranks", ".tmp_step_000003"):
        (tmp_path / name / "dcp").mkdir(parents=True)
        (tmp_path / name / "dcp" / "__0_0.distcp").write_bytes(b"half")
    b = _parts(1)
    manager = _manager(tmp_path, *b)
    assert not list(tmp_path.glob(".tmp_step_*"))  # gone at the start, before any save
    assert manager.load() == good and b[3].n == 2


def test_an_empty_folder_loads_nothing(tmp_path):
    assert _manager(tmp_path, *_parts(0)).load() is None


def test_a_sharded_checkpoint_is_refused_by_a_one_process_run(tmp_path):
    path = _manager(tmp_path, *_parts(0)).save(1)
    (path / "dcp").mkdir()
    from vapo_lab.integrity import write_manifest

    write_manifest(path)
    with pytest.raises(
        CheckpointError, match="written by a sharded .* resume it with the trainer.strategy"
    ):
        _manager(tmp_path, *_parts(0)).load()


def test_a_checkpoint_of_the_earlier_layout_loads(tmp_path):
    """Before the trainer's state was one part, its step, score, data position and RNG states were
    top-level keys of the state (the one-process layout)."""
    model, opt, sched, _ = _parts(0)
    random.seed(11)
    torch.manual_seed(12)
    gens = {
        "rollout": torch.Generator().manual_seed(13),
        "update": torch.Generator().manual_seed(14),
    }
    legacy = {
        "critic_opt": opt.state_dict(),
        "critic_sched": sched.state_dict(),
        "rng": rng_state(gens),
        "data": {"epoch": 1, "index": 5},
        "best_eval": 0.5,
    }
    save_checkpoint(tmp_path, 7, {"critic": model}, legacy)

    class Own:
        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            self.state = state

    own = Own()
    m2, o2, s2, _ = _parts(1)
    CheckpointManager(
        tmp_path,
        single(),
        {"critic": m2},
        {"critic_opt": ("critic", o2)},
        {"critic_sched": s2},
        {"trainer": own},
        log=lambda m: None,
    ).load()
    got = own.state
    assert (got["step"], got["best_eval"], got["data"], got["world_size"]) == (
        7,
        0.5,
        {"epoch": 1, "index": 5},
        1,
    )
    assert torch.equal(got["rng"]["generators"]["rollout"], gens["rollout"].get_state())
    assert got["rng"]["python"][1] == list(random.getstate()[1])


def test_the_checkpoint_manager_never_imports_the_trainer():
    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph("vapo_lab", exclude_type_checking_imports=False, cache_dir=None)
    assert not g.chain_exists(
        importer="vapo_lab.trainer.checkpointer", imported="vapo_lab.trainer.trainer"
    )
