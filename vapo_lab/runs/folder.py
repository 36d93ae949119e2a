"""The files of a run folder and the one answer to "can this folder be resumed?"."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from vapo_lab.errors import ConfigError

RUN_FILE = "run.json"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"


def is_run_dir(path: str | Path) -> bool:
    """True when ``path`` is a run folder that a run can continue: its ``run.json`` exists (written
    once the run's tracking is set up; a start that died before that left nothing to resume)."""
    return (Path(path) / RUN_FILE).is_file()


def resume_config(run_dir: str | Path) -> tuple[DictConfig, dict[str, str]]:
    """Returns (the saved config with resume=<run_dir>, the component choices) of a run."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir) or not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(
            f"resume={run_dir} is not a vapo-lab run directory (no {RUN_FILE} / {CONFIG_FILE}): "
            "give the folder printed when the run started, e.g. runs/vapo-seed0-..."
        )
    cfg = OmegaConf.load(run_dir / CONFIG_FILE)
    cfg.resume = str(run_dir)
    return cfg, json.loads((run_dir / RUN_FILE).read_text()).get("choices", {})


def run_name_taken(name: str, path: Path) -> str:
    """Returns the one-line refusal of a ``run_name`` whose folder ``path`` exists."""
    return (
        f"run_name={name}: {path} exists (another run's folder): continue that run with "
        f"resume={path}, or give another run_name"
    )
