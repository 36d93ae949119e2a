"""The algorithm presets: which of the seven components each turns on, and the paper's score.

A preset's other settings (advantage estimator, dynamic sampling, overlong shaping, KL) are in
``conf/algo/<name>.yaml``; its component choices are listed here only, and composition adds each
component's ``on`` or ``off`` group from them (``vapo_lab.config.compose``). VAPO turns on every
registered component, so a new component joins VAPO, its Table 1 row and the grid by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from vapo_lab.errors import ConfigError
from vapo_lab.registry import Registry
from vapo_lab.registry.components import COMPONENTS


@dataclass(frozen=True)
class Preset:
    """One algorithm preset (``--algo <name>``, ``conf/algo/<name>.yaml``)."""

    name: str
    label: str  # how tables and figures name it: VAPO, PPO, DAPO, GRPO
    components: tuple[str, ...] | None  # the components it turns on; None: every registered one
    table1: float | None = None  # the paper's AIME24 avg@32 (VAPO.md Table 1); None: not a row
    row: str | None = None  # its Table 1 row where that is not its label

    @property
    def table1_row(self) -> str:
        return self.row or self.label

    def on(self) -> list[str]:
        """Returns the components this preset turns on, in registry order."""
        return [c.name for c in COMPONENTS if self.components is None or c.name in self.components]

    def off(self) -> list[str]:
        """Returns the components this preset leaves off, in registry order."""
        on = set(self.on())
        return [c.name for c in COMPONENTS if c.name not in on]


def _check_components(preset: Preset) -> None:
    for name in preset.components or ():
        if name not in COMPONENTS:
            raise ValueError(f"preset {preset.name!r}: {name!r} is not a registered component")


# in the paper's Table 1 order (Vanilla PPO, DAPO, VAPO), which is also the Table 1 grid's
PRESETS: Registry[Preset] = Registry("algorithm preset", ConfigError, _check_components)

PRESETS.register(Preset(name="ppo", label="PPO", components=(), table1=5, row="Vanilla PPO"))
PRESETS.register(
    Preset(
        name="dapo",
        label="DAPO",
        components=("clip_higher", "token_level_loss", "group_sampling"),
        table1=50,
    )
)
PRESETS.register(Preset(name="vapo", label="VAPO", components=None, table1=60))
PRESETS.register(Preset(name="grpo", label="GRPO", components=("group_sampling",)))
