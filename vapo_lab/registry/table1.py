"""The paper's Table 1, derived from the registries: its rows with the paper's score, and its grid.

Rows in the paper's order: the presets it reports (Vanilla PPO, DAPO), VAPO without each component
in registry order, then VAPO. The grid (``vapo-lab ablate --table1``, ``experiments/table1.yaml``)
runs one cell per row: the presets first, then each ablation.
"""

from __future__ import annotations

from dataclasses import dataclass

from vapo_lab.registry.components import COMPONENTS
from vapo_lab.registry.presets import PRESETS

ABLATED = "vapo"  # the preset whose components Table 1 drops one at a time


@dataclass(frozen=True)
class Row:
    """One row of Table 1 and the grid cell that reproduces it."""

    label: str  # e.g. "Vanilla PPO", "w/o clip_higher", "VAPO"
    paper: float | None  # the paper's AIME 2024 avg@32 (None: not a row of the paper's)
    cell: str  # the grid cell's name, e.g. "ppo", "vapo-no-clip_higher"
    algo: str
    drop: tuple[str, ...] = ()


def _preset_rows() -> list[Row]:
    return [
        Row(p.table1_row, float(p.table1), p.name, p.name) for p in PRESETS if p.table1 is not None
    ]


def _ablation_rows() -> list[Row]:
    return [
        Row(
            c.row,
            None if c.table1_without is None else float(c.table1_without),
            f"{ABLATED}-no-{c.name}",
            ABLATED,
            (c.name,),
        )
        for c in COMPONENTS
    ]


def rows() -> list[Row]:
    """Returns Table 1's rows in the paper's order (the ablated preset last)."""
    presets = _preset_rows()
    full = [r for r in presets if r.algo == ABLATED]
    return [r for r in presets if r.algo != ABLATED] + _ablation_rows() + full


def cells() -> list[Row]:
    """Returns the rows in the grid's order: the presets (registry order), then each ablation."""
    return _preset_rows() + _ablation_rows()


def paper_scores() -> dict[str, float]:
    """Returns {row label: the paper's score}, in the paper's order."""
    return {r.label: r.paper for r in rows() if r.paper is not None}


def row_name(name: str) -> str:
    """Returns how tables and figures name a preset ("ppo" -> "Vanilla PPO", "grpo" -> "GRPO") or
    VAPO without a component ("clip_higher" -> "w/o clip_higher")."""
    if name in PRESETS:
        return PRESETS.get(name).table1_row
    return COMPONENTS.get(name).row
