"""Composition of conf/: every file composes, presets and drops set exactly the right keys,
bad input fails with one line naming the fix."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vapo_lab.conf import conf_dir, options
from vapo_lab.config.compose import compose_config
from vapo_lab.errors import ConfigError, UnknownComponentError
from vapo_lab.launch.registry import LAUNCHERS
from vapo_lab.registry.components import COMPONENTS
from vapo_lab.registry.presets import PRESETS

REPO = Path(__file__).resolve().parents[1]

# what some options need before they validate (a checkpoint path, a data file)
NEEDS = {
    ("model", "hf"): ["model.path=/models/x"],
    ("task", "math"): ["task.train_path=data.jsonl"],
    ("scale", "paper"): ["model.path=/models/x", "task.train_path=data.jsonl"],
    ("scale", "small-gpu"): ["model.path=/models/x", "task.train_path=data.jsonl"],
    ("experiments", "table1-small-gpu"): ["model.path=/models/x", "task.train_path=data.jsonl"],
}
# options that cannot be combined with the default VAPO preset (no critic in group advantages)
ALGO_FOR = {}


def _flat(cfg) -> dict:
    def walk(node, prefix=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from walk(v, f"{prefix}{k}.")
        else:
            yield prefix[:-1], node

    return dict(walk(OmegaConf.to_container(cfg, resolve=True)))


def _diff(a, b) -> dict:
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    return {k: (fa[k], fb[k]) for k in fa if fa[k] != fb[k]}


@pytest.fixture(scope="module")
def default():
    return compose_config().cfg


def test_every_file_under_conf_and_experiments_composes():
    root = conf_dir()
    files = sorted(p for p in Path(root).rglob("*.yaml") if p.name != "config.yaml")
    files += sorted((REPO / "experiments").rglob("*.yaml"))
    composed = 0
    for path in files:
        if path.is_relative_to(root):
            group, option = path.parent.name, path.stem
            overrides = [f"{group}={option}", *NEEDS.get((group, option), [])]
            algo = "dapo" if (group, option) in ALGO_FOR else None
            composed += compose_config(algo=algo, overrides=overrides) is not None
        else:  # a grid file: every cell of it composes
            from vapo_lab.launch.grid import load_grid

            composed += len(load_grid(path).expand(NEEDS.get(("experiments", path.stem), []))) > 0
    assert composed == len(files)
    # among them every registered component's on and off, every preset and every launcher
    names = {(p.parent.name, p.stem) for p in files}
    assert {(c.name, option) for c in COMPONENTS for option in ("on", "off")} <= names
    assert {("algo", name) for name in PRESETS.names()} | {
        ("launcher", name) for name in LAUNCHERS.names()
    } <= names


def test_default_is_vapo_on_the_embedded_default(default):
    c = _flat(default)
    assert c["algo.name"] == "vapo" and c["model.name"] == "tiny" and c["task.name"] == "arith"
    assert c["scale.name"] == "cpu" and c["rollout.backend"] == "builtin"
    assert c["loss.eps_low"] == 0.2 and c["loss.eps_high"] == 0.28
    assert c["loss.agg"] == "token-mean" and c["loss.mu"] == 0.1
    assert c["gae.gamma"] == 1.0 and c["gae.lam_critic"] == 1.0
    assert c["gae.lam_policy_mode"] == "length_adaptive" and c["gae.lam_critic_mode"] == "decoupled"
    assert c["critic.pretrain.enabled"] is True
    assert c["rollout.n_samples"] == c["rollout.group_size"] == 8
    assert c["rollout.responses_per_step"] == 64


def test_drop_clip_higher_changes_only_eps_high(default):
    dropped = compose_config(drop=["clip_higher"]).cfg
    assert _diff(default, dropped) == {"loss.eps_high": (0.28, 0.2)}
    # eps_high follows eps_low when clip-higher is off
    moved = compose_config(drop=["clip_higher"], overrides=["loss.eps_low=0.1"]).cfg
    assert moved.loss.eps_high == moved.loss.eps_low == 0.1


@pytest.mark.parametrize("name", [c.name for c in COMPONENTS])
def test_each_drop_changes_exactly_its_own_keys(default, name):
    composed = compose_config(drop=[name])
    assert composed.dropped == [name] and composed.choices[name] == "off"
    diff = _diff(default, composed.cfg)
    assert set(diff) == set(COMPONENTS.get(name).keys)


def test_ppo_has_all_seven_off():
    composed = compose_config(algo="ppo")
    assert all(composed.choices[c.name] == "off" for c in COMPONENTS)
    c = _flat(composed.cfg)
    # VAPO.md vanilla PPO: λ 0.95 for both, ε 0.2, sample-level loss, 1 sample per prompt
    assert c["loss.eps_high"] == c["loss.eps_low"] == 0.2
    assert c["loss.agg"] == "seq-mean-token-mean" and c["loss.mu"] == 0.0
    assert c["rollout.n_samples"] == 1 and c["critic.pretrain.enabled"] is False
    assert c["gae.lam_policy_mode"] == "fixed" and c["gae.lam_policy"] == 0.95
    assert c["gae.lam_critic_mode"] == "shared"
    assert c["algo.advantage"] == "gae" and c["critic.init"] == "reward_model"


def test_vapo_differs_from_ppo_in_exactly_the_component_keys(default):
    diff = _diff(default, compose_config(algo="ppo").cfg)
    owned = {k for comp in COMPONENTS for k in comp.keys}
    assert set(diff) - {"algo.name"} == owned


def test_dapo_and_grpo_presets():
    dapo = compose_config(algo="dapo")
    on = {n for n, v in dapo.choices.items() if v == "on" and n in COMPONENTS}
    assert on == set(PRESETS.get("dapo").on())
    c = _flat(dapo.cfg)
    assert c["algo.advantage"] == "group" and c["algo.dynamic_sampling"] is True
    assert c["reward.overlong.enabled"] is True and c["kl.coef"] == 0.0
    assert c["loss.eps_high"] == 0.28 and c["loss.agg"] == "token-mean"
    grpo = compose_config(algo="grpo")
    on = {n for n, v in grpo.choices.items() if v == "on" and n in COMPONENTS}
    assert on == set(PRESETS.get("grpo").on())
    c = _flat(grpo.cfg)
    assert c["algo.advantage"] == "group" and c["kl.coef"] > 0 and c["kl.estimator"] == "k3"
    assert c["loss.agg"] == "seq-mean-token-mean" and c["loss.eps_high"] == 0.2


def test_paper_scale_values():
    c = _flat(
        compose_config(overrides=["scale=paper", "model.path=/m", "task.train_path=d.jsonl"]).cfg
    )
    assert c["model.name"] == "hf" and c["rollout.backend"] == "vllm" and c["task.name"] == "math"
    assert c["rollout.responses_per_step"] == 8192 and c["rollout.n_samples"] == 16
    assert c["trainer.mini_batch_size"] == 512
    assert c["trainer.actor_lr"] == 1e-6 and c["trainer.critic_lr"] == 2e-6
    assert c["rollout.max_new_tokens"] == 20480 and c["gae.alpha"] == 0.05
    assert c["rollout.eval_samples"] == 32 and c["rollout.eval_top_p"] == 0.7
    ppo = _flat(
        compose_config(
            algo="ppo", overrides=["scale=paper", "model.path=/m", "task.train_path=d.jsonl"]
        ).cfg
    )
    # vanilla PPO at paper scale: 8192 prompts x 1 sample
    assert ppo["rollout.n_samples"] == 1 and ppo["rollout.responses_per_step"] == 8192


def test_unknown_drop_lists_valid_names_and_suggests():
    with pytest.raises(UnknownComponentError) as e:
        compose_config(drop=["clip_hihger"])
    assert "did you mean clip_higher?" in str(e.value)
    assert all(name in str(e.value) for name in COMPONENTS.names())


@pytest.mark.parametrize("typo", ["CLIP_HIGHER", "Clip-Higher", "clip-higher"])
def test_a_drop_in_other_case_or_with_dashes_suggests_the_name(typo):
    with pytest.raises(UnknownComponentError, match="did you mean clip_higher\\?"):
        compose_config(drop=[typo])


def test_every_float_setting_refuses_nan_and_infinity_in_one_line_each(default):
    """The float settings are found from the composed default (typed by the schema), not listed by
    hand."""
    from vapo_lab.config.validate import _float_settings

    keys = [k for k, _ in _float_settings(OmegaConf.to_container(default, resolve=True))]
    assert {
        "trainer.actor_lr",
        "loss.eps_low",
        "rollout.top_p",
        "rollout.temperature",
        "gae.alpha",
    } <= set(keys)
    plain = [k for k in keys if "[" not in k]
    for value in ("nan", "inf", "-inf"):
        with pytest.raises(ConfigError) as e:
            compose_config(overrides=[f"{k}={value}" for k in plain])
        lines = str(e.value).splitlines()
        assert sorted(lines) == sorted(
            f"{k}={value} is not a finite number: set {k} to a finite value" for k in plain
        )
    with pytest.raises(ConfigError, match=r"^trainer.adam_betas\[1\]=nan is not a finite number"):
        compose_config(overrides=["trainer.adam_betas=[0.9,nan]"])


def test_drop_of_component_already_off_in_preset():
    with pytest.raises(ConfigError, match="already off in preset 'ppo'"):
        compose_config(algo="ppo", drop=["clip_higher"])
    with pytest.raises(ConfigError, match="already off in preset 'dapo'"):
        compose_config(algo="dapo", drop=["value_pretraining"])


def test_drop_twice_and_drop_with_conflicting_override():
    with pytest.raises(ConfigError, match="twice"):
        compose_config(drop=["clip_higher", "clip_higher"])
    with pytest.raises(ConfigError, match="conflicts"):
        compose_config(drop=["clip_higher"], overrides=["clip_higher=on"])


def test_unknown_algo_suggests():
    with pytest.raises(ConfigError, match="did you mean dapo"):
        compose_config(algo="dapoo")


@pytest.mark.parametrize(
    "override, expect",
    [
        ("loss.eps_low==", "malformed override"),
        ("loss.eps_hgh=0.3", "did you mean loss.eps_high?"),
        ("loss.eps_low=wide", "loss.eps_low=wide is not a valid float"),
        ("clip_higher=maybe", "unknown clip_higher option 'maybe'"),
    ],
)
def test_bad_overrides_give_one_line(override, expect):
    with pytest.raises(ConfigError) as e:
        compose_config(overrides=[override])
    assert expect in str(e.value)
    assert "\n" not in str(e.value)


def test_validation_reports_all_problems_with_fixes():
    with pytest.raises(ConfigError) as e:
        compose_config(overrides=["loss.eps_high=0.1", "rollout.group_size=6"])
    lines = str(e.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("loss.eps_high=0.1 is below eps_low=0.2")
    assert "clip_higher=off" in lines[0]
    assert "rollout.responses_per_step=64 is not divisible by rollout.n_samples=6" in lines[1]


def test_validation_ranges_and_required_values():
    with pytest.raises(
        ConfigError, match=r"gae.gamma=1.5 is out of range: it must be \(0.0, 1.0\]"
    ):
        compose_config(overrides=["gae.gamma=1.5"])
    with pytest.raises(ConfigError, match="model.path is required"):
        compose_config(overrides=["model=hf"])
    with pytest.raises(ConfigError, match="loss.agg=mean is not a valid choice"):
        compose_config(overrides=["loss.agg=mean"])


@pytest.mark.parametrize(
    "overrides, expect",
    [
        (
            ["trainer.strategy=ddp"],
            r"trainer.strategy=ddp is not a valid choice: "
            r"set trainer.strategy to one of single, fsdp",
        ),
        (["trainer.nproc_per_node=2"], r"= 2 ranks needs trainer.strategy=fsdp"),
        (
            ["trainer.strategy=fsdp", "trainer.nproc_per_node=3"],
            r"8 prompts per step \(rollout.responses_per_step / rollout.n_samples\) "
            r"do not divide among 3 ranks: "
            r"choose rollout.responses_per_step as a multiple of 24",
        ),
        (["trainer.nodes=0"], r"trainer.nodes=0 is out of range: it must be >= 1"),
        (
            ["trainer.strategy=fsdp", "trainer.nproc_per_node=4", "trainer.mesh=hsdp"],
            r"^trainer.mesh=hsdp shards within a node and replicates across nodes, but "
            r"trainer.nodes=1: set trainer.mesh=flat \(one node shards over all its ranks\), or "
            r"trainer.nodes to the number of nodes$",
        ),
        (
            ["trainer.mesh=2d"],
            r"trainer.mesh=2d is not a valid choice: set trainer.mesh to one of flat, hsdp",
        ),
        (
            ["rollout=vllm", "rollout.vllm.sleep_level=3"],
            r"rollout.vllm.sleep_level=3 is out of range: it must be \[1, 2\]",
        ),
        (
            [
                "rollout=vllm",
                "trainer.strategy=fsdp",
                "trainer.nproc_per_node=2",
                "rollout.vllm.tensor_parallel_size=4",
            ],
            r"rollout.vllm.tensor_parallel_size=4 does not divide trainer.nproc_per_node=2",
        ),
        (
            # 8 ranks on 2 nodes of 4: TP 8 divides the world but would straddle the nodes
            [
                "rollout=vllm",
                "trainer.strategy=fsdp",
                "trainer.nproc_per_node=4",
                "trainer.nodes=2",
                "rollout.responses_per_step=256",
                "rollout.vllm.tensor_parallel_size=8",
            ],
            r"tensor_parallel_size=8 does not divide trainer.nproc_per_node=4: an engine spans tp "
            r"consecutive ranks of one node",
        ),
        (
            # vLLM's SamplingParams refuses it, at the first rollout; the built-in sampler takes it
            ["rollout=vllm", "rollout.eval_temperature=2.5"],
            r"rollout.eval_temperature=2.5: vLLM samples at temperatures in \[0, 2\]",
        ),
    ],
)
def test_rank_settings_are_checked_before_anything_runs(overrides, expect):
    with pytest.raises(ConfigError, match=expect):
        compose_config(overrides=overrides)


def test_a_temperature_above_2_is_the_built_in_samplers_alone():
    cfg = compose_config(overrides=["rollout.temperature=2.5"]).cfg
    assert cfg.rollout.temperature == 2.5


def test_a_valid_many_rank_config_composes():
    cfg = compose_config(
        overrides=["trainer.strategy=fsdp", "trainer.nproc_per_node=2", "trainer.nodes=2"]
    ).cfg
    assert (cfg.trainer.strategy, cfg.trainer.nproc_per_node, cfg.trainer.nodes) == ("fsdp", 2, 2)


def test_hsdp_composes_on_many_nodes_and_flat_is_the_default():
    many = ["trainer.strategy=fsdp", "trainer.nproc_per_node=2", "trainer.nodes=2"]
    assert compose_config(overrides=many).cfg.trainer.mesh == "flat"
    assert compose_config(overrides=[*many, "trainer.mesh=hsdp"]).cfg.trainer.mesh == "hsdp"


def test_a_resumed_run_may_change_its_mesh_with_its_node_count(tmp_path):
    import json

    from vapo_lab.config.train import train_config

    saved = compose_config(
        overrides=[
            "trainer.strategy=fsdp", "trainer.nproc_per_node=2", "trainer.nodes=2",
            "trainer.mesh=hsdp", "tracking=none",
        ]
    ).cfg  # fmt: skip
    OmegaConf.save(saved, tmp_path / "config.yaml")
    (tmp_path / "run.json").write_text(json.dumps({"choices": {}}))
    resume = f"resume={tmp_path}"
    # DCP re-shards the checkpoint for either layout (tests/distributed/test_hsdp.py)
    cfg, _ = train_config(None, [], [resume, "trainer.mesh=flat"])
    assert (cfg.trainer.mesh, cfg.trainer.nodes) == ("flat", 2)
    # onto one node of 4 the saved hsdp has nothing to replicate across: refused, then allowed flat
    one_node = [resume, "trainer.nodes=1", "trainer.nproc_per_node=4"]
    with pytest.raises(ConfigError, match=r"trainer.mesh=hsdp .* but trainer.nodes=1"):
        train_config(None, [], one_node)
    cfg, _ = train_config(None, [], [*one_node, "trainer.mesh=flat"])
    assert (cfg.trainer.mesh, cfg.trainer.nodes, cfg.trainer.nproc_per_node) == ("flat", 1, 4)
    with pytest.raises(ConfigError, match="trainer.mesh=ring is not a valid choice"):
        train_config(None, [], [resume, "trainer.mesh=ring"])


def test_group_advantage_refuses_critic_components():
    with pytest.raises(ConfigError, match="value_pretraining=on needs a critic"):
        compose_config(algo="dapo", overrides=["value_pretraining=on"])
    with pytest.raises(ConfigError, match="needs groups"):
        compose_config(algo="grpo", overrides=["group_sampling=off"])


def test_option_listing():
    # a group's options, sorted: for algo and launcher, the registries' names
    assert options("algo") == sorted(PRESETS.names())
    assert options("launcher") == sorted(LAUNCHERS.names())


def test_a_component_override_with_a_preset_is_given_once_to_hydra():
    # the same choice whether the preset comes from --algo or from an algo= override, and the
    # command line's component override reaches Hydra only as that component's group
    via_option = compose_config(algo="ppo", overrides=["clip_higher=on"])
    via_override = compose_config(overrides=["algo=ppo", "clip_higher=on"])
    assert via_option.choices == via_override.choices and via_option.choices["clip_higher"] == "on"
    assert OmegaConf.to_yaml(via_option.cfg) == OmegaConf.to_yaml(via_override.cfg)
    assert via_option.cfg.loss.eps_high == 0.28 and via_option.cfg.loss.agg == "seq-mean-token-mean"
