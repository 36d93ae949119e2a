"""vapo-lab's Hydra config tree, shipped inside the package as ``vapo_lab.conf``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def conf_dir() -> Path:
    """Returns the directory of the Hydra config tree (repository conf/, shipped as
    vapo_lab.conf)."""
    return Path(str(resources.files("vapo_lab.conf")))


def options(group: str) -> list[str]:
    """Returns the options of a config group (file stems under conf/<group>/), sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def default_choice(group: str) -> str:
    """Returns the option that conf/config.yaml's defaults list chooses for ``group``."""
    import yaml

    with (conf_dir() / "config.yaml").open(encoding="utf-8") as f:
        defaults = yaml.safe_load(f)["defaults"]
    for entry in defaults:
        if isinstance(entry, dict) and group in entry:
            return str(entry[group])
    raise KeyError(f"conf/config.yaml chooses no default for group {group!r}")
