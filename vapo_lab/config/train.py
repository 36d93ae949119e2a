"""The config of one training run from a command line: composed, or a saved run's to resume."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from vapo_lab.config.compose import compose_config
from vapo_lab.config.validate import validate
from vapo_lab.errors import ConfigError
from vapo_lab.runs.folder import resume_config

# what may change when a run is resumed: how many ranks it runs on and how they shard (the weights
# and optimiser state load re-sharded; on another rank count the rollout streams start afresh, so
# the history departs from an uninterrupted run's)
RESUME_OVERRIDES = ("trainer.nproc_per_node", "trainer.nodes", "trainer.mesh")


def saved_config(run_dir: str) -> tuple[DictConfig, dict[str, str]]:
    """Returns (the saved config of the run in ``run_dir``, with resume=<run_dir>, its component
    choices); a key the run's vapo-lab version did not have yet gets the schema's default, which is
    the behaviour that version had (e.g. trainer.strategy=single)."""
    from omegaconf import OmegaConf

    from vapo_lab.config.schema import VapoConfig

    cfg, choices = resume_config(run_dir)
    defaults = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(VapoConfig)))
    return OmegaConf.merge(defaults, cfg), choices


def train_config(
    algo: str | None, drop: Sequence[str], overrides: Sequence[str]
) -> tuple[DictConfig, dict[str, str]]:
    """Returns (config, component choices) of ``vapo-lab train [--algo] [--drop] overrides``; with
    ``resume=<run dir>`` the run's saved config (only its rank counts and mesh may be overridden).

    Raises:
        ConfigError: a bad override, or resume= with overrides that would change the run.
    """
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), None)
    if not resume or resume == "null":
        composed = compose_config(algo=algo, drop=drop, overrides=overrides)
        return composed.cfg, composed.choices
    ranks = [o for o in overrides if o.split("=", 1)[0].lstrip("+") in RESUME_OVERRIDES]
    others = [o for o in overrides if not o.startswith("resume=") and o not in ranks]
    if others or algo or drop:
        raise ConfigError(
            f"resume={resume} continues a run with its saved config: drop "
            f"{others or '--algo/--drop'}"
        )
    cfg, choices = saved_config(resume)
    for o in ranks:
        key, value = o.lstrip("+").split("=", 1)
        if key == "trainer.mesh":
            cfg.trainer.mesh = value  # validate() below names a bad one
            continue
        try:
            cfg.trainer[key.split(".")[1]] = int(value)
        except ValueError:
            raise ConfigError(f"{key}={value} is not a whole number of ranks") from None
    problems = validate(cfg)
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg, choices
