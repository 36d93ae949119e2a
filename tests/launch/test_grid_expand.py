"""Grid expansion composes each structure once (``BatchComposer``) and gives every cell the config,
hash and error a full ``compose_config`` gives it; grids are bounded (``MAX_RUNS``).

Before issue 49 every cell was a full Hydra compose (~0.15 s): a 10,000-cell `--dry-run` printed
nothing for ~25 minutes, and nothing capped a grid's size (`range(0,10**9)` was listed in memory).
"""

import pytest
from omegaconf import OmegaConf

from vapo_lab.config import batch
from vapo_lab.config.compose import compose_config
from vapo_lab.errors import ConfigError
from vapo_lab.launch.grid import MAX_RUNS, builtin_grids, load_grid


def _reference(spec):
    """The cell as the pre-issue-49 code composed it: Hydra, whole, for this cell alone."""
    composed = compose_config(algo=spec.algo, drop=spec.drop, overrides=spec.overrides)
    return OmegaConf.to_container(composed.cfg, resolve=True), dict(composed.choices)


# what a grid needs from its command line (its checkpoints and data), never read while composing
NEEDS = {"table1-small-gpu": ["model.path=/ckpt/qwen", "task.train_path=/data/train.jsonl"]}


@pytest.mark.parametrize("name", sorted(builtin_grids()))
def test_every_shipped_grid_expands_as_full_composition_does(name):
    for spec in load_grid(name, seeds=1).expand(NEEDS.get(name, [])):
        config, choices = _reference(spec)
        assert spec.config == config and spec.choices == choices, spec.key


GRID = """\
name: mixed
seeds: [0, 7]
overrides: [scale=cpu-free, "trainer.total_steps=30"]
sweep: {trainer.actor_lr: "1e-5,3e-5", rollout.group_size: "4,8"}
cells:
  - {name: vapo, algo: vapo}
  - {name: ppo, algo: ppo, overrides: ["+model.base.steps=7", "trainer.eval_every=10"]}
  - {name: no-ch, algo: vapo, drop: [clip_higher], overrides: ["loss.eps_high=0.25"]}
  - {name: named, algo: dapo, overrides: ["tracking.experiment=x y", "model.arch.num_layers=3"]}
"""


def test_a_grid_of_every_kind_of_override_expands_as_full_composition_does(tmp_path, monkeypatch):
    calls = []
    real = batch.compose_config
    monkeypatch.setattr(batch, "compose_config", lambda **kw: calls.append(kw) or real(**kw))
    (tmp_path / "g.yaml").write_text(GRID)
    specs = load_grid(tmp_path / "g.yaml").expand()
    assert len(specs) == 4 * 2 * 2 * 2
    for spec in specs:
        config, choices = _reference(spec)
        assert spec.config == config and spec.choices == choices, spec.key
    # rollout.group_size is read by an interpolation where group sampling is on
    # (group_sampling.n_samples): those cells are composed whole; PPO's (group sampling off) by
    # value; the four structures once each
    structures = [c for c in calls if not c.get("check", True)]
    assert len(structures) == 4
    assert len(calls) - len(structures) == 3 * 8


def test_a_sweep_of_values_composes_each_structure_once(tmp_path, monkeypatch):
    calls = []
    real = batch.compose_config
    monkeypatch.setattr(batch, "compose_config", lambda **kw: calls.append(kw) or real(**kw))
    (tmp_path / "g.yaml").write_text(
        "name: wide\nseeds: [0, 1, 2, 3, 4]\n"
        "sweep: {trainer.actor_lr: 'range(1,41)', loss.eps_low: '0.1,0.15,0.2'}\n"
        "cells:\n  - {name: vapo, algo: vapo}\n  - {name: dapo, algo: dapo}\n"
    )
    specs = load_grid(tmp_path / "g.yaml").expand()
    assert len(specs) == 2 * 40 * 3 * 5 == 1200
    assert len(calls) == 2  # one Hydra composition per cell's structure
    assert len({s.config_hash for s in specs}) == 1200
    spot = [specs[0], specs[377], specs[-1]]
    for spec in spot:
        assert spec.config == _reference(spec)[0]


@pytest.mark.parametrize(
    "override",
    [
        "trainer.actor_lr=abc",  # a type Hydra refuses
        "trainer.total_steps=0",  # a value validate refuses
        "trainer.no_such_key=1",  # a key the config does not have
        "loss.eps_low=nan",
    ],
)
def test_a_bad_value_is_refused_with_full_composition_s_message(tmp_path, override):
    (tmp_path / "g.yaml").write_text(
        "name: bad\nseeds: [0, 1]\ncells:\n"
        f"  - {{name: vapo, algo: vapo, overrides: ['{override}']}}\n"
    )
    with pytest.raises(ConfigError) as got:
        load_grid(tmp_path / "g.yaml").expand()
    with pytest.raises(ConfigError) as want:
        compose_config(algo="vapo", overrides=[override, "seed=0"])
    assert str(got.value) == f"grid bad, cell vapo (seed 0): {want.value}"


def test_a_grid_over_the_cap_is_refused_before_it_is_composed(tmp_path, monkeypatch):
    monkeypatch.setattr(batch, "compose_config", lambda **kw: pytest.fail("composed"))
    (tmp_path / "g.yaml").write_text(
        "name: huge\nseeds: [0, 1]\nsweep: {trainer.actor_lr: 'range(0,1000000000)'}\n"
        "cells:\n  - {name: vapo, algo: vapo}\n"
    )
    with pytest.raises(ConfigError) as e:  # its axis read no further than the cap
        load_grid(tmp_path / "g.yaml")
    assert str(e.value) == (
        f"grid huge: 1 cell(s) x {MAX_RUNS + 1} sweep value(s) x 2 seed(s) = "
        f"{2 * (MAX_RUNS + 1):,} runs, over the cap of {MAX_RUNS:,} a grid: split it into several "
        "grid files, or give fewer seeds or sweep values"
    )
    with pytest.raises(ConfigError, match=r"^grid table1: 10 cell\(s\) x 1001 seed\(s\) = 10,010"):
        load_grid("table1", seeds=1001)
    (tmp_path / "edge.yaml").write_text(
        "name: edge\nseeds: [0]\nsweep: {trainer.actor_lr: 'range(0,10000)'}\n"
        "cells:\n  - {name: vapo, algo: vapo}\n"
    )
    assert len(load_grid(tmp_path / "edge.yaml").sweep) == 1  # exactly the cap: accepted
