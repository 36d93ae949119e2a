"""The TRL virtual envs the benchmark's TRL workers run in: where they are, how to create them.

Each comparison needs its own TRL release, hence its own env; both get the main env's torch.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from vapo_lab.bench.trl.spec import TrlBenchError

# TRL releases, each in its own env: PPOTrainer was removed in 1.13.
TRL_PPO_VERSION = "1.12.0"
TRL_GRPO_VERSION = "1.16.0"
# the torch of the main env, a CPU wheel on local disk (a bare `torch` would pull a CUDA build)
TORCH_PIN = "2.13.0"
ENV_ROOT = Path(".bench-venv")
ENVS = {"ppo": ("trl112", TRL_PPO_VERSION), "grpo": ("trl-latest", TRL_GRPO_VERSION)}


def setup_command(part: str) -> str:
    """Returns the shell commands that create the TRL env for ``part`` (ppo or grpo)."""
    name, version = ENVS[part]
    env = ENV_ROOT / name
    return (
        f"python -m venv {env} && {env}/bin/pip install torch=={TORCH_PIN} && "
        f"{env}/bin/pip install trl=={version}"
    )


def default_python(part: str) -> Path:
    """Returns the interpreter of the TRL env for ``part`` (relative to the working directory)."""
    return ENV_ROOT / ENVS[part][0] / "bin" / "python"


def check_trl_python(part: str, python: str | Path) -> Path:
    """Returns ``python`` if it exists; else raises a one-line error naming the setup command."""
    path = Path(python)
    if not path.is_file():
        name, version = ENVS[part]
        raise TrlBenchError(
            f"TRL env for the {part.upper()} comparison not found "
            f"({path} is missing; it needs trl=={version}): "
            f"create it with `vapo-lab bench trl --setup` (or: {setup_command(part)}), "
            f"or pass --trl{'' if part == 'ppo' else '-grpo'}-python PATH"
        )
    return path


def setup_trl_envs(
    parts: Sequence[str] = ("ppo", "grpo"), log: Callable[[str], None] = lambda text: None
) -> list[Path]:
    """Creates the TRL virtual envs under .bench-venv/ (torch first, from the local CPU wheel).

    Returns the interpreters. An existing env is reused; pip only installs what is missing.
    """
    pythons = []
    for part in parts:
        name, version = ENVS[part]
        env = ENV_ROOT / name
        if not (env / "bin" / "python").is_file():
            log(f"creating {env}")
            subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
        for requirement in (f"torch=={TORCH_PIN}", f"trl=={version}"):
            log(f"{env}: pip install {requirement}")
            done = subprocess.run(pip + [requirement])
            if done.returncode:
                raise TrlBenchError(
                    f"pip install {requirement} into {env} failed (exit {done.returncode}): "
                    f"see pip's output above; retry with `{setup_command(part)}`"
                )
        pythons.append(env / "bin" / "python")
    return pythons
