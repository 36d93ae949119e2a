"""Composing many configs that differ only in values: Hydra once per structure, the rest by value.

A grid's cells (cells x sweep points x seeds) mostly share their structure (preset, dropped
components, group choices such as ``scale=`` or ``task=``) and differ in plain ``key=value``
overrides (``seed=3``, ``trainer.actor_lr=3e-5``). A full Hydra compose costs ~0.15 s, so a
10,000-cell grid would take half an hour to expand. ``BatchComposer`` composes each structure
once, converts each distinct ``key=value`` once through the structured config (the same type
checks and conversions Hydra applies), sets the values in a copy of the resolved config and checks
it (``check_values``, as ``compose_config`` does): the same config, hash and error for each cell.

Anything else goes through ``compose_config`` whole: an override that adds, deletes or forces a key,
selects a group or package, holds an interpolation or a missing value, or sets a key another key
interpolates (``rollout.group_size``, read by ``group_sampling.n_samples``). tests/launch/
test_grid_expand.py checks every shipped grid both ways.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from vapo_lab.conf import conf_dir
from vapo_lab.config.compose import compose_config
from vapo_lab.config.validate import check_values
from vapo_lab.errors import ConfigError

_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")


@dataclass
class _Structure:
    cfg: DictConfig  # composed with the structural overrides, unchecked
    resolved: dict[str, Any]
    choices: dict[str, str]
    referenced: frozenset[str]  # keys some interpolation reads
    scratch: DictConfig | None = None  # a copy of cfg that converts scalar values


class BatchComposer:
    """Returns ``(resolved config, group choices)`` of many ``compose_config`` calls, fast when they
    differ only in values (see the module docstring)."""

    def __init__(self) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self._parser = OverridesParser.create()
        self._groups = {p.name for p in conf_dir().iterdir() if p.is_dir()}
        self._parsed: dict[str, Any] = {}
        self._structures: dict[tuple[Any, ...], _Structure | None] = {}
        self._values: dict[tuple[Any, ...], Any] = {}
        self.full = self.fast = 0  # how many went each way (the benchmark and tests read them)

    def compose(
        self, algo: str, drop: Sequence[str], overrides: Sequence[str]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Returns what ``compose_config(algo, drop, overrides)`` would, resolved to a container.

        Raises:
            ConfigError: as ``compose_config`` does, with its message.
        """
        structural, values = [], []
        for text in overrides:
            ov = self._plain(text)
            if ov is None:
                structural.append(text)
            else:
                values.append(ov)
        key = (algo, tuple(drop), tuple(structural))
        if key not in self._structures:
            self._structures[key] = self._structure(algo, drop, structural)
        base = self._structures[key]
        if base is None or any(k in base.referenced for k, _ in values):
            return self._full(algo, drop, overrides)
        resolved = copy.deepcopy(base.resolved)
        for k, text in values:
            vkey = (key, k, text)
            if vkey not in self._values:
                self._values[vkey] = self._convert(base, k, text)
            value = self._values[vkey]
            if value is _INVALID:
                return self._full(algo, drop, overrides)  # raises Hydra's own message
            _set(resolved, k, copy.deepcopy(value))
        problems = check_values(resolved)
        if problems:
            raise ConfigError("\n".join(problems))
        self.fast += 1
        return resolved, dict(base.choices)

    def _full(
        self, algo: str, drop: Sequence[str], overrides: Sequence[str]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        self.full += 1
        composed = compose_config(algo=algo, drop=drop, overrides=overrides)
        resolved: dict[str, Any] = OmegaConf.to_container(  # type: ignore[assignment]
            composed.cfg, resolve=True
        )
        return resolved, dict(composed.choices)

    def _plain(self, text: str) -> tuple[str, str] | None:
        """Returns (key, value text) of a plain ``key=value`` override; None for any other."""
        if text not in self._parsed:
            self._parsed[text] = self._parse(text)
        return self._parsed[text]

    def _parse(self, text: str) -> tuple[str, str] | None:
        from hydra.core.override_parser.types import OverrideType
        from hydra.errors import HydraException

        try:
            (ov,) = self._parser.parse_overrides([text])
        except HydraException:
            return None  # compose_config says what is wrong with it
        key = ov.key_or_group
        value = ov.value()
        if (
            ov.type != OverrideType.CHANGE
            or ov.package is not None
            or ov.is_sweep_override()
            or "/" in key
            or ("." not in key and key in self._groups)
            or "${" in text
            or "???" in str(value)
        ):
            return None
        return key, text

    def _structure(
        self, algo: str, drop: Sequence[str], structural: list[str]
    ) -> _Structure | None:
        """Returns the composition of a structure; None when it fails or has missing keys (every
        cell of it then composes whole, and says why)."""
        try:
            composed = compose_config(algo=algo, drop=drop, overrides=structural, check=False)
            if OmegaConf.missing_keys(composed.cfg):
                return None
            resolved = OmegaConf.to_container(composed.cfg, resolve=True)
        except Exception:  # noqa: BLE001 - compose_config says it, cell by cell
            return None
        raw = OmegaConf.to_container(composed.cfg, resolve=False)
        referenced = frozenset(
            m.strip() for text in _strings(raw) for m in _INTERPOLATION.findall(text)
        )
        return _Structure(composed.cfg, resolved, composed.choices, referenced)  # type: ignore[arg-type]

    def _convert(self, base: _Structure, key: str, text: str) -> Any:
        """Returns the value ``key=...`` of ``text`` takes in the structured config (Hydra's parse,
        then OmegaConf's type check and conversion), or ``_INVALID``."""
        (ov,) = self._parser.parse_overrides([text])
        # a scalar replaces the node's value (checked first, so a refused one changes nothing): one
        # scratch copy a structure serves them all; a mapping merges, into a fresh copy
        if isinstance(ov.value(), dict) or base.scratch is None:
            scratch = copy.deepcopy(base.cfg)
            if not isinstance(ov.value(), dict):
                base.scratch = scratch
        else:
            scratch = base.scratch
        try:
            OmegaConf.update(scratch, key, ov.value(), merge=True)
            node = OmegaConf.select(scratch, key, throw_on_missing=True)
            if isinstance(node, (DictConfig, ListConfig)):
                return OmegaConf.to_container(node, resolve=True)
            return node
        except Exception:  # noqa: BLE001 - compose_config gives the message
            return _INVALID


_INVALID = object()


def _strings(node: Any) -> list[str]:
    """Returns every string in a nested container."""
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        tree = tree[part]
    tree[last] = value
