"""The registries: exactly seven components, one name each, on/off values read from conf/; the
presets and Table 1 derived from them."""

from pathlib import Path

import pytest
import yaml

from vapo_lab.conf import conf_dir, options
from vapo_lab.errors import UnknownComponentError
from vapo_lab.registry import Registry, table1
from vapo_lab.registry.components import (
    COMPONENTS,
    CRITIC_STAGES,
    Component,
    _check_stage,
    _flatten,
    option_values,
    settings,
)
from vapo_lab.registry.presets import PRESETS

# The paper's Table 1 (VAPO.md), rows in its order: the tests' one copy of the paper's figures,
# against which the registries' data is checked. Every other list here is read from the registries.
PAPER_TABLE1 = [
    ("Vanilla PPO", 5),
    ("DAPO", 50),
    ("w/o value_pretraining", 11),
    ("w/o decoupled_gae", 33),
    ("w/o length_adaptive_gae", 45),
    ("w/o clip_higher", 46),
    ("w/o token_level_loss", 53),
    ("w/o positive_lm_loss", 54),
    ("w/o group_sampling", 55),
    ("VAPO", 60),
]


def _component(name: str = "x") -> Component:
    return Component(
        name=name,
        title="X",
        summary="s",
        paper_section="§0",
        origin="o",
        stage="policy_loss",
        keys=("loss.x",),
        table1_without=0,
    )


def test_the_papers_seven_in_paper_order():
    # the components the paper ablates are its seven rows "w/o <name>", in the paper's order
    ablated = [c for c in COMPONENTS if c.table1_without is not None]
    assert len(ablated) == 7
    assert [(c.row, c.table1_without) for c in ablated] == [
        r for r in PAPER_TABLE1 if r[0].startswith("w/o ")
    ]


def test_double_registration_raises():
    reg = Registry("component", UnknownComponentError, _check_stage)
    reg.register(_component("a"))
    with pytest.raises(ValueError, match="already registered"):
        reg.register(_component("a"))


def test_unknown_stage_raises():
    reg = Registry("component", UnknownComponentError, _check_stage)
    bad = Component(
        name="a",
        title="",
        summary="",
        paper_section="",
        origin="",
        stage="nowhere",
        keys=(),
        table1_without=0,
    )
    with pytest.raises(ValueError, match="stage"):
        reg.register(bad)


def test_unknown_name_lists_valid_and_suggests_closest():
    with pytest.raises(UnknownComponentError) as e:
        COMPONENTS.get("clip_hihger")
    msg = str(e.value)
    assert "\n" not in msg
    assert "did you mean clip_higher?" in msg
    for name in COMPONENTS.names():
        assert name in msg


def test_own_registry_is_independent():
    reg = Registry("component", UnknownComponentError, _check_stage)
    reg.register(_component("a"))
    assert reg.names() == ["a"] and "a" not in COMPONENTS and "clip_higher" not in reg


def test_table1_values_from_the_paper():
    assert list(table1.paper_scores().items()) == PAPER_TABLE1


def test_table1_grid_cells_come_from_the_registries():
    cells = [(r.cell, r.algo, r.drop) for r in table1.cells()]
    # the presets with a paper score first (registry order), then the ablated preset without each
    # component
    presets = [(p.name, p.name, ()) for p in PRESETS if p.table1 is not None]
    ablations = [(f"{table1.ABLATED}-no-{c.name}", table1.ABLATED, (c.name,)) for c in COMPONENTS]
    assert cells == presets + ablations
    # a cell per row
    assert sorted(r.label for r in table1.cells()) == sorted(r.label for r in table1.rows())


def test_presets_are_the_conf_algo_files_and_name_real_components():
    assert sorted(PRESETS.names()) == options("algo")
    for preset in PRESETS:
        # on and off split the registered components, each in registry order
        on, off = preset.on(), preset.off()
        assert [n for n in COMPONENTS.names() if n in on] + [
            n for n in COMPONENTS.names() if n in off
        ] == on + off
        assert sorted(on + off) == sorted(COMPONENTS.names()) and not set(on) & set(off)
    # VAPO is every component (so a new one joins it), vanilla PPO none of them
    assert PRESETS.get("vapo").on() == COMPONENTS.names() and PRESETS.get("ppo").on() == []
    with pytest.raises(ValueError, match="not a registered component"):
        Registry("algorithm preset", check=PRESETS._check).register(
            type(PRESETS.get("ppo"))(name="x", label="X", components=("clip_hihger",))
        )


def test_only_the_critic_stages_need_a_critic():
    for component in COMPONENTS:
        assert component.needs_critic == (component.stage in CRITIC_STAGES), component.name
    assert any(c.needs_critic for c in COMPONENTS) and not all(c.needs_critic for c in COMPONENTS)
    # a preset without a value model (group-relative advantages) turns on no component that needs
    # one
    for preset in PRESETS:
        if option_values("algo", preset.name).get("algo.advantage") == "group":
            assert not [n for n in preset.on() if COMPONENTS.get(n).needs_critic], preset.name


@pytest.mark.parametrize("name", COMPONENTS.names())
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
            full = (
                key
                if "@package _global_" in path.read_text() or path.name == "config.yaml"
                else f"{group}.{key}"
            )
            if full in owned and owned[full] != group:
                offenders.append(f"{path.relative_to(root)} sets {full}")
    assert offenders == []
