"""Config: the typed schema, the conf/ tree's location, and the one compose function.

``compose_config`` lives in ``vapo_lab.config.compose`` (imported lazily by callers) so that the
component registry can find conf/ without importing Hydra's composition machinery.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def conf_dir() -> Path:
    """Returns the directory of the Hydra config tree (repository conf/, shipped as vapo_lab.conf)."""
    return Path(str(resources.files("vapo_lab.conf")))
