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
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from vapo_lab.conf import conf_dir, default_choice, options
from vapo_lab.config.schema import VapoConfig
from vapo_lab.config.validate import validate
from vapo_lab.errors import ConfigError
from vapo_lab.registry import Registry, unknown_name_message
from vapo_lab.registry.components import COMPONENTS, Component
from vapo_lab.registry.presets import PRESETS

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


def compose_config(
    algo: str | None = None,
    drop: Sequence[str] = (),
    overrides: Sequence[str] = (),
    registry: Registry[Component] = COMPONENTS,
    check: bool = True,
) -> Composed:
    """Returns the composed, resolved and validated config of one run.

    The preset (``algo``, else an ``algo=`` override, else conf/config.yaml's default) chooses
    each component's ``on`` or ``off`` group (``vapo_lab.registry.presets``); a
    ``<component>=on|off`` override or ``drop`` changes that choice; Hydra composes the rest.

    Args:
        algo: a preset (vapo, ppo, dapo, grpo); None keeps the default (vapo).
        drop: components to turn off, each one the preset has on ("VAPO without X").
        overrides: Hydra overrides, e.g. ``loss.eps_low=0.1`` or ``scale=paper``.
        registry: the component registry (tests pass their own).
        check: run ``validate`` and raise on any problem.

    Raises:
        ConfigError: unknown preset or component, a component dropped twice or already off,
            a malformed or unknown override, or an invalid value.
    """
    overrides = list(overrides)
    given = algo or _choice_in(overrides, "algo")
    preset = PRESETS.get(given or default_choice("algo"))  # raises with the valid names
    base = [f"algo={algo}", *overrides] if algo is not None else overrides

    dropped: list[str] = []
    for name in drop:
        registry.get(name)  # raises with the valid names and the closest one
        if name in dropped:
            raise ConfigError(f"--drop {name} is given twice: give each component once")
        dropped.append(name)
        for ov in overrides:
            if re.match(rf"^[~+]*{re.escape(name)}=", ov):
                raise ConfigError(
                    f"--drop {name} conflicts with the override {ov!r}: use one or the other"
                )
        if name not in preset.on():
            raise ConfigError(
                f"cannot drop {name}: it is already off in preset {preset.name!r} "
                f"(components on there: {', '.join(preset.on()) or 'none'})"
            )

    # a component's choice goes in as its group (below), not as the command line's override
    rest = [ov for ov in base if ov.partition("=")[0].lstrip("+") not in registry]
    cfg, choices = _compose(rest + _component_groups(registry, preset.on(), dropped, overrides))
    if check:
        problems = validate(cfg)
        if problems:
            raise ConfigError("\n".join(problems))
    return Composed(cfg=cfg, algo=preset.name, dropped=dropped, choices=choices)


def _choice_in(overrides: list[str], group: str) -> str | None:
    """Returns the option an override ``group=option`` chooses, None when none does."""
    for ov in reversed(overrides):
        key, eq, value = ov.partition("=")
        if eq and key.lstrip("+") == group:
            return value
    return None


def _component_groups(
    registry: Registry[Component], on: list[str], dropped: list[str], overrides: list[str]
) -> list[str]:
    """Returns the overrides that add each component's group: the command line's choice
    (``clip_higher=off``), else ``off`` when dropped, else the preset's. Hydra adds a group that
    config.yaml does not list only with a leading +."""
    added = []
    for c in registry:
        choice = _choice_in(overrides, c.name) or (
            "off" if c.name in dropped or c.name not in on else "on"
        )
        added.append(f"+{c.name}={choice}")
    return added


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
    if isinstance(error, OverrideParseException):
        return _parse_error(error.override, error.message)
    text = str(error) if error.__cause__ is None else f"{error}\n{error.__cause__}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(error).__name__
    if head.startswith("Error parsing override"):
        detail = lines[1] if len(lines) > 1 else ""
        return (
            f"{head.replace('Error parsing override', 'malformed override')}: {detail}; "
            "overrides are key=value, e.g. loss.eps_low=0.1 or clip_higher=off"
        )
    match = re.search(r"Could not override '([^']+)'", head) or re.search(
        r"Key '([^']+)' (?:is )?not in", " ".join(lines)
    )
    if match:
        key = match.group(1)
        inner = re.search(r"Key '([^']+)' is not in struct", text)
        if inner and not key.endswith(inner.group(1)):
            key = f"{key}.{inner.group(1)}"
        hint = (
            "; a free-form dict (task.options, model.base) takes new keys with a leading +, e.g. "
            f"+{key}=..."
            if key.startswith(("task.options.", "model.base."))
            else ""
        )
        return (
            f"unknown config key {key!r}{_closest_key(key)}{hint}; "
            "see `vapo-lab config` for the keys"
        )
    match = re.search(r"Could not find '([^']+)'", head)
    if match:
        group, _, option = match.group(1).partition("/")
        if (conf_dir() / group).is_dir():
            return unknown_name_message(f"{group} option", option, options(group))
    match = re.search(
        r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", " ".join(lines)
    )
    key = re.search(r"full_key: (\S+)", " ".join(lines))
    if match:
        where = f"{key.group(1)}=" if key else ""
        kind = match.group(2).lower()
        article = "an" if kind[0] in "aeiou" else "a"
        fix = f"set {key.group(1)} to {article} {kind}" if key else f"give {article} {kind}"
        return f"{where}{match.group(1)} is not a valid {kind}: {fix}"
    match = re.search(r"Value '([^']*)' is not a valid bool", " ".join(lines))
    if match:
        where = f"{key.group(1)}=" if key else ""
        fix = f"set {key.group(1)} to true or false" if key else "give true or false"
        return f"{where}{match.group(1)} is not a valid bool: {fix}"
    return head


def _parse_error(override: str, detail: str) -> str:
    """Returns the one line for an override Hydra cannot parse: which one, what is wrong, the
    fix."""
    lines = [
        ln.strip()
        for ln in detail.splitlines()
        if ln.strip() and not ln.strip().startswith(("Error parsing override", "See https://", "^"))
    ]
    detail = lines[0] if lines else "cannot be parsed"
    if detail.startswith("LexerNoViableAltException"):
        detail = "it holds a character the override grammar does not accept here"
    key, eq, value = override.partition("=")
    key = key.lstrip("+~")
    quote = "'trainer.adam_betas=[0.9,0.999]'"  # a list-valued key, to show the shell quoting
    if not eq:
        return (
            f"malformed override {override!r}: overrides are key=value ({detail}); "
            "e.g. loss.eps_low=0.1 or clip_higher=off"
        )
    for opening, closing in ("[]", "{}", "()"):
        if value.count(opening) == value.count(closing):
            continue
        inner = value.strip("[]{}() ")
        problem = (
            f"'{opening}' is not closed"
            if value.count(opening) > value.count(closing)
            else f"'{closing}' closes nothing"
        )
        if isinstance(_default_value(key), (list, dict)):
            whole = f"{opening}{inner}{closing}"
            return (
                f"malformed override {override!r}: {problem}; write the "
                f"{'list' if opening == '[' else 'value'} "
                f"whole and quote the override for the shell: '{key}={whole}'"
            )
        return (
            f"malformed override {override!r}: {problem}; {key} takes one value: write "
            f"{key}={inner} "
            f"(a list is written whole and quoted for the shell, e.g. {quote})"
        )
    if value.count("'") % 2 or value.count('"') % 2:
        return (
            f"malformed override {override!r}: a quote is not closed; quote the whole value, "
            f"e.g. {key}='text with spaces' (itself inside double quotes in a shell)"
        )
    if any(ch.isspace() for ch in value):
        return (
            f"malformed override {override!r}: a value with spaces must be quoted; write "
            f"{key}='{value}' (itself inside double quotes in a shell)"
        )
    return (
        f"malformed override {override!r}: {detail}; overrides are key=value, e.g. "
        "loss.eps_low=0.1 or "
        f"clip_higher=off, and a list is quoted for the shell, e.g. {quote}"
    )


def _default_value(key: str) -> object:
    """Returns the default config's value at dotted ``key`` (None when there is no such key)."""
    node: object = _default_tree()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _closest_key(key: str) -> str:
    """Returns '; did you mean X?' for the closest dotted key of the default config, else the keys
    of ``key``'s group ('; trainer has: ...'), or ''."""
    keys = _dotted_keys(_default_tree())
    close = closest_key(key, keys)
    if close:
        return f"; did you mean {close}?"
    group = key.rpartition(".")[0]
    siblings = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == group)
    return f"; {group} has: {', '.join(siblings)}" if group and siblings else ""


def closest_key(key: str, keys: Sequence[str]) -> str | None:
    """Returns the key of ``keys`` that ``key`` most likely misspells, or None when none is close.

    Compares the last part with the keys of the same group (``trainer.keep`` is nothing like any
    ``trainer.*`` key: None, not ``trainer.device``, which shares only the group's name), then a
    misspelt group (``trainr.total_steps``), then the same last part in another group
    (``trainer.eps_low`` -> ``loss.eps_low``).
    """
    group, _, leaf = key.rpartition(".")
    groups = {k.rpartition(".")[0] for k in keys}
    if group not in groups:
        near = difflib.get_close_matches(group, sorted(groups - {""}), n=1, cutoff=0.75)
        if near and f"{near[0]}.{leaf}" in keys:
            return f"{near[0]}.{leaf}"
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == group]
    near = difflib.get_close_matches(leaf, siblings, n=1, cutoff=0.75)
    if near:
        return f"{group}.{near[0]}" if group else near[0]
    elsewhere = [k for k in keys if k.rpartition(".")[2] == leaf]
    return elsewhere[0] if len(elsewhere) == 1 else None


def _default_tree() -> dict:
    """Returns the default config (unresolved, without the hydra node) as nested dicts; {} if it
    fails."""
    try:
        default = _hydra_compose([])
    except (HydraException, OmegaConfBaseException, ValueError):
        return {}
    tree = OmegaConf.to_container(default, resolve=False)
    tree.pop("hydra", None)  # type: ignore[union-attr]
    return tree  # type: ignore[return-value]


def _dotted_keys(node: object, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        out: list[str] = []
        for k, v in node.items():
            out.extend(_dotted_keys(v, f"{prefix}{k}."))
        return out
    return [prefix[:-1]]
