"""The config of one training run from a command line: composed, or a saved run's to resume."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from vapo_lab.config.compose import compose_config
from vapo_lab.errors import ConfigError
from vapo_lab.runs.folder import resume_config

# what may change when a run is resumed: how many ranks it runs on (the weights and optimiser
# state load re-sharded; the rollout streams start afresh, so the history departs from an
# uninterrupted run's)
RESUME_OVERRIDES = ("trainer.nproc_per_node", "trainer.nodes")


def train_config(algo: str | None, drop: Sequence[str], overrides: Sequence[str]) -> tuple[DictConfig, dict[str, str]]:
    """Returns (config, component choices) of ``vapo-lab train [--algo] [--drop] overrides``; with
    ``resume=<run dir>`` the run's saved config (only its rank counts may be overridden).

    Raises:
        ConfigError: a bad override, or resume= with overrides that would change the run.
    """
    composed = compose_config(algo=algo, drop=drop, overrides=overrides)
    if not composed.cfg.resume:
        return composed.cfg, composed.choices
    resume = composed.cfg.resume
    ranks = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in RESUME_OVERRIDES]
    others = [o for o in overrides if not o.startswith("resume=") and o not in ranks]
    if others or algo or drop:
        raise ConfigError(f"resume={resume} continues a run with its saved config: drop {others or '--algo/--drop'}")
    cfg, choices = resume_config(resume)
    for o in ranks:
        key, value = o.lstrip("+").split("=", 1)
        cfg.trainer[key.split(".")[1]] = int(value)
    return cfg, choices
