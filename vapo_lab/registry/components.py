"""The one registry of the seven VAPO components.

A component's name is its registry key, Hydra config group (``conf/<name>/{on,off}.yaml``),
``--drop`` value, MLflow tag and Table 1 row ("w/o <name>"). Its on/off *values* are read from the
config group's files, so ``vapo-lab components`` never shows values the trainer does not use.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import yaml

from vapo_lab.conf import conf_dir
from vapo_lab.errors import UnknownComponentError
from vapo_lab.registry import Registry

# Trainer stages a component may change; the first two act through the value model, so a
# component there needs a critic (algo.advantage=gae).
STAGES = ("critic_init", "advantages", "policy_loss", "rollout")
CRITIC_STAGES = ("critic_init", "advantages")


@dataclass(frozen=True)
class Component:
    """One VAPO component: what it does, where the paper has it, what it owns."""

    name: str
    title: str
    summary: str
    paper_section: str
    origin: str
    stage: str
    keys: tuple[str, ...]
    # the paper's AIME24 avg@32 for "VAPO without it" (VAPO.md Table 1); None for a component the
    # paper does not ablate (its grid cell runs, with no paper score beside it)
    table1_without: float | None

    @property
    def row(self) -> str:
        """Its Table 1 row: VAPO without it."""
        return f"w/o {self.name}"

    @property
    def needs_critic(self) -> bool:
        """True when it changes the value model or what is computed from it (GAE)."""
        return self.stage in CRITIC_STAGES


def _check_stage(component: Component) -> None:
    if component.stage not in STAGES:
        raise ValueError(f"component {component.name!r}: stage {component.stage!r} not in {STAGES}")


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


@cache
def option_values(name: str, option: str) -> dict[str, Any]:
    """Returns {dotted key: raw value} that conf/<name>/<option>.yaml sets, unresolved."""
    path = conf_dir() / name / f"{option}.yaml"
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    return _flatten(data)


def settings(component: Component) -> dict[str, tuple[Any, Any]]:
    """Returns {key: (on value, off value)} read from the component's config group."""
    on, off = option_values(component.name, "on"), option_values(component.name, "off")
    return {key: (on.get(key), off.get(key)) for key in component.keys}


COMPONENTS: Registry[Component] = Registry("component", UnknownComponentError, _check_stage)

COMPONENTS.register(
    Component(
        name="value_pretraining",
        title="Value pretraining",
        summary="train the critic alone on Monte-Carlo returns of the initial policy before RL",
        paper_section="§4.1",
        origin="VC-PPO",
        stage="critic_init",
        keys=("critic.pretrain.enabled",),
        table1_without=11,
    )
)
COMPONENTS.register(
    Component(
        name="decoupled_gae",
        title="Decoupled GAE",
        summary=(
            "critic targets from GAE with its own λ_critic = 1 (unbiased), policy keeps λ_policy"
        ),
        paper_section="§4.1",
        origin="VC-PPO",
        stage="advantages",
        keys=("gae.lam_critic_mode",),
        table1_without=33,
    )
)
COMPONENTS.register(
    Component(
        name="length_adaptive_gae",
        title="Length-adaptive GAE",
        summary="λ_policy = 1 − 1/(α·l) per response of length l instead of a fixed 0.95",
        paper_section="§4.2",
        origin="VAPO",
        stage="advantages",
        keys=("gae.lam_policy_mode",),
        table1_without=45,
    )
)
COMPONENTS.register(
    Component(
        name="clip_higher",
        title="Clip-Higher",
        summary="clip the ratio to [1 − ε_low, 1 + ε_high] with ε_high = 0.28 > ε_low = 0.2",
        paper_section="§4.3",
        origin="DAPO",
        stage="policy_loss",
        keys=("loss.eps_high",),
        table1_without=46,
    )
)
COMPONENTS.register(
    Component(
        name="token_level_loss",
        title="Token-level loss",
        summary="average the policy loss over all tokens of the batch, not per response first",
        paper_section="§4.2",
        origin="DAPO",
        stage="policy_loss",
        keys=("loss.agg",),
        table1_without=53,
    )
)
COMPONENTS.register(
    Component(
        name="positive_lm_loss",
        title="Positive-example LM loss",
        summary="add μ·NLL on the tokens of correct responses (μ = 0.1)",
        paper_section="§4.3",
        origin="self-imitation learning",
        stage="policy_loss",
        keys=("loss.mu",),
        table1_without=54,
    )
)
COMPONENTS.register(
    Component(
        name="group_sampling",
        title="Group sampling",
        summary="fewer prompts, G samples each, same responses per step (512 x 16 vs 8192 x 1)",
        paper_section="§4.3",
        origin="GRPO",
        stage="rollout",
        keys=("rollout.n_samples",),
        table1_without=55,
    )
)
