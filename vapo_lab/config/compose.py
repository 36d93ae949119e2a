"""The one compose function: preset + dropped components + Hydra overrides -> a validated config.

``vapo-lab config`` prints what this returns and ``vapo-lab train`` trains on it: one code path.
Every failure is a ``ConfigError`` whose message is one line per problem, naming the bad value
and the fix.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from vapo_lab.components import COMPONENTS, Registry, unknown_name_message
from vapo_lab.config import conf_dir
from vapo_lab.config.schema import VapoConfig
from vapo_lab.config.validate import validate
from vapo_lab.errors import ConfigError

ConfigStore.instance().store(name="base_schema", node=VapoConfig)


@dataclass
class Composed:
    """A composed run config and how it was chosen."""

    cfg: DictConfig
    algo: str
    dropped: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)  # config group -> chosen option

    def to_yaml(self) -> str:
        """Returns the fully resolved config as YAML."""
        return OmegaConf.to_yaml(self.cfg, resolve=True)


def options(group: str) -> list[str]:
    """Returns the options of a config group (file stems under conf/<group>/), sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def compose_config(
    algo: str | None = None,
    drop: Sequence[str] = (),
    overrides: Sequence[str] = (),
    registry: Registry = COMPONENTS,
    check: bool = True,
) -> Composed:
    """Returns the composed, resolved and validated config of one run.

    Args:
        algo: a preset under conf/algo/ (vapo, ppo, dapo, grpo); None keeps the default (vapo).
        drop: components to turn off, each one the preset has on ("VAPO without X").
        overrides: Hydra overrides, e.g. ``loss.eps_low=0.1`` or ``scale=paper``.
        registry: the component registry (tests pass their own).
        check: run ``validate`` and raise on any problem.

    Raises:
        ConfigError: unknown preset or component, a component dropped twice or already off,
            a malformed or unknown override, or an invalid value.
    """
    overrides = list(overrides)
    base = list(overrides)
    if algo is not None:
        valid = options("algo")
        if algo not in valid:
            raise ConfigError(unknown_name_message("algorithm preset", algo, valid))
        base = [f"algo={algo}", *base]

    dropped: list[str] = []
    for name in drop:
        registry.get(name)  # raises with the valid names and the closest one
        if name in dropped:
            raise ConfigError(f"--drop {name} is given twice: give each component once")
        dropped.append(name)
        for ov in overrides:
            if re.match(rf"^[~+]*{re.escape(name)}=", ov):
                raise ConfigError(
                    f"--drop {name} conflicts with the override {ov!r}: use one or the other")

    cfg, choices = _compose(base)
    chosen_algo = choices.get("algo", "vapo")
    for name in dropped:
        if choices.get(name) != "on":
            on = [c for c in registry.names() if choices.get(c) == "on"]
            raise ConfigError(
                f"cannot drop {name}: it is already off in preset {chosen_algo!r} "
                f"(components on there: {', '.join(on) or 'none'})")
    if dropped:
        cfg, choices = _compose(base + [f"{name}=off" for name in dropped])

    if check:
        problems = validate(cfg)
        if problems:
            raise ConfigError("\n".join(problems))
    return Composed(cfg=cfg, algo=chosen_algo, dropped=dropped, choices=choices)


def _compose(overrides: list[str]) -> tuple[DictConfig, dict[str, str]]:
    """Returns (config without the hydra node, group choices) for ``overrides``."""
    try:
        cfg = _hydra_compose(overrides)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        raise ConfigError(_one_line(e)) from e
    choices = {k: v for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra/")}
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg, choices


def _hydra_compose(overrides: list[str]) -> DictConfig:
    """Returns Hydra's composition of conf/config.yaml with ``overrides`` (hydra node included)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            return compose("config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def _one_line(error: Exception) -> str:
    """Returns Hydra's or OmegaConf's error as one line, with a fix."""
    text = str(error) if error.__cause__ is None else f"{error}\n{error.__cause__}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(error).__name__
    if head.startswith("Error parsing override"):
        detail = lines[1] if len(lines) > 1 else ""
        return (f"{head.replace('Error parsing override', 'malformed override')}: {detail}; "
                "overrides are key=value, e.g. loss.eps_low=0.1 or clip_higher=off")
    match = re.search(r"Could not override '([^']+)'", head) or re.search(
        r"Key '([^']+)' (?:is )?not in", " ".join(lines))
    if match:
        key = match.group(1)
        inner = re.search(r"Key '([^']+)' is not in struct", text)
        if inner and not key.endswith(inner.group(1)):
            key = f"{key}.{inner.group(1)}"
        hint = "; a free-form dict (task.options, model.base) takes new keys with a leading +, e.g. " \
               f"+{key}=..." if key.startswith(("task.options.", "model.base.")) else ""
        return f"unknown config key {key!r}{_closest_key(key)}{hint}; see `vapo-lab config` for the keys"
    match = re.search(r"Could not find '([^']+)'", head)
    if match:
        group, _, option = match.group(1).partition("/")
        if (conf_dir() / group).is_dir():
            return unknown_name_message(f"{group} option", option, options(group))
    match = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", " ".join(lines))
    key = re.search(r"full_key: (\S+)", " ".join(lines))
    if match:
        where = f"{key.group(1)}=" if key else ""
        kind = match.group(2).lower()
        return f"{where}{match.group(1)} is not a valid {kind}: give a {kind} value"
    return head


def _closest_key(key: str) -> str:
    """Returns '; did you mean X?' for the closest dotted key of the default config, or ''."""
    try:
        default = _hydra_compose([])
    except (HydraException, OmegaConfBaseException, ValueError):
        return ""
    tree = OmegaConf.to_container(default, resolve=False)
    tree.pop("hydra", None)  # type: ignore[union-attr]
    keys = _dotted_keys(tree)
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _dotted_keys(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        out: list[str] = []
        for k, v in node.items():
            out.extend(_dotted_keys(v, f"{prefix}{k}."))
        return out
    return [prefix[:-1]]
