"""vapo-lab's Hydra config tree, shipped inside the package as ``vapo_lab.conf``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def conf_dir() -> Path:
    """Returns the directory of the Hydra config tree (repository conf/, shipped as vapo_lab.conf)."""
    return Path(str(resources.files("vapo_lab.conf")))
