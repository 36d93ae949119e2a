"""The registries: exactly seven components, one name each, on/off values read from conf/; the
presets and Table 1 derived from them."""

from pathlib import Path

import pytest
import yaml

from vapo_lab.conf import conf_dir, options
from vapo_lab.registry import Registry
from vapo_lab.registry import table1
from vapo_lab.registry.components import (
    COMPONENTS,
    Component,
    _check_stage,
    _flatten,
    option_values,
    settings,
)
from vapo_lab.registry.presets import PRESETS
from vapo_lab.errors import UnknownComponentError

SEVEN = [
    "value_pretraining",
    "decoupled_gae",
    "length_adaptive_gae",
    "clip_higher",
    "token_level_loss",
    "positive_lm_loss",
    "group_sampling",
]


def _component(name: str = "x") -> Component:
    return Component(name=name, title="X", summary="s", paper_section="§0", origin="o",
                     stage="policy_loss", keys=("loss.x",), table1_without=0)


def test_exactly_the_seven_in_paper_order():
    assert COMPONENTS.names() == SEVEN
    assert len(COMPONENTS) == 7


def test_double_registration_raises():
    reg = Registry("component", UnknownComponentError, _check_stage)
    reg.register(_component("a"))
    with pytest.raises(ValueError, match="already registered"):
        reg.register(_component("a"))


def test_unknown_stage_raises():
    reg = Registry("component", UnknownComponentError, _check_stage)
    bad = Component(name="a", title="", summary="", paper_section="", origin="", stage="nowhere",
                    keys=(), table1_without=0)
    with pytest.raises(ValueError, match="stage"):
        reg.register(bad)


def test_unknown_name_lists_valid_and_suggests_closest():
    with pytest.raises(UnknownComponentError) as e:
        COMPONENTS.get("clip_hihger")
    msg = str(e.value)
    assert "\n" not in msg
    assert "did you mean clip_higher?" in msg
    for name in SEVEN:
        assert name in msg


def test_own_registry_is_independent():
    reg = Registry("component", UnknownComponentError, _check_stage)
    reg.register(_component("a"))
    assert reg.names() == ["a"] and "a" not in COMPONENTS and "clip_higher" not in reg


def test_table1_values_from_the_paper():
    # VAPO.md, Table 1
    assert {c.name: c.table1_without for c in COMPONENTS} == {
        "value_pretraining": 11, "decoupled_gae": 33, "length_adaptive_gae": 45, "clip_higher": 46,
        "token_level_loss": 53, "positive_lm_loss": 54, "group_sampling": 55,
    }
    paper = table1.paper_scores()
    assert paper["Vanilla PPO"] == 5 and paper["DAPO"] == 50 and paper["VAPO"] == 60
    # VAPO.md's Table 1, rows in the paper's order
    assert list(paper.items()) == [
        ("Vanilla PPO", 5), ("DAPO", 50), ("w/o value_pretraining", 11), ("w/o decoupled_gae", 33),
        ("w/o length_adaptive_gae", 45), ("w/o clip_higher", 46), ("w/o token_level_loss", 53),
        ("w/o positive_lm_loss", 54), ("w/o group_sampling", 55), ("VAPO", 60)]


def test_table1_grid_cells_come_from_the_registries():
    cells = [(r.cell, r.algo, r.drop) for r in table1.cells()]
    assert cells == [("ppo", "ppo", ()), ("dapo", "dapo", ()), ("vapo", "vapo", ())] + [
        (f"vapo-no-{name}", "vapo", (name,)) for name in SEVEN]


def test_presets_are_the_conf_algo_files_and_name_real_components():
    assert sorted(PRESETS.names()) == options("algo")
    assert PRESETS.get("vapo").on() == SEVEN and PRESETS.get("ppo").on() == []
    assert PRESETS.get("dapo").on() == ["clip_higher", "token_level_loss", "group_sampling"]
    assert PRESETS.get("grpo").on() == ["group_sampling"]
    with pytest.raises(ValueError, match="not a registered component"):
        Registry("algorithm preset", check=PRESETS._check).register(
            type(PRESETS.get("ppo"))(name="x", label="X", components=("clip_hihger",)))


def test_only_the_critic_stages_need_a_critic():
    assert [c.name for c in COMPONENTS if c.needs_critic] == SEVEN[:3]


@pytest.mark.parametrize("name", SEVEN)
def test_on_and_off_set_exactly_the_owned_keys(name):
    component = COMPONENTS.get(name)
    assert set(option_values(name, "on")) == set(component.keys)
    assert set(option_values(name, "off")) == set(component.keys)
    # and the two choices differ on every key they own
    for key, (on, off) in settings(component).items():
        assert on != off, key


def test_settings_read_the_paper_values():
    got = {c.name: settings(c) for c in COMPONENTS}
    assert got["clip_higher"] == {"loss.eps_high": (0.28, "${loss.eps_low}")}
    assert got["token_level_loss"] == {"loss.agg": ("token-mean", "seq-mean-token-mean")}
    assert got["positive_lm_loss"] == {"loss.mu": (0.1, 0.0)}
    assert got["group_sampling"] == {"rollout.n_samples": ("${rollout.group_size}", 1)}
    assert got["value_pretraining"] == {"critic.pretrain.enabled": (True, False)}
    assert got["decoupled_gae"] == {"gae.lam_critic_mode": ("decoupled", "shared")}
    assert got["length_adaptive_gae"] == {"gae.lam_policy_mode": ("length_adaptive", "fixed")}


def test_no_other_config_file_sets_a_component_key():
    owned = {key: c.name for c in COMPONENTS for key in c.keys}
    root = conf_dir()
    offenders = []
    for path in sorted(Path(root).rglob("*.yaml")):
        group = path.relative_to(root).parts[0]
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        data.pop("defaults", None)
        for key in _flatten(data):
            # files of a group other than _global_ ones nest under the group name
            full = key if "@package _global_" in path.read_text() or path.name == "config.yaml" \
                else f"{group}.{key}"
            if full in owned and owned[full] != group:
                offenders.append(f"{path.relative_to(root)} sets {full}")
    assert offenders == []
