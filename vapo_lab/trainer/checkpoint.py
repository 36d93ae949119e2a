"""Atomic checkpoints: write everything to a temporary folder, then rename it into place.

A checkpoint holds what an exact resume needs: policy, critic, optimisers, schedulers, every RNG
state, the data position and the step. A crash while writing leaves the previous checkpoint
intact (the rename is the commit point); ``latest`` only ever names a complete one.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"


def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Returns the global and named RNG states."""
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in generators.items()},
    }


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    """Restores what ``rng_state`` returned."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    for name, g in generators.items():
        g.set_state(state["generators"][name])


def save_checkpoint(folder: Path, step: int, modules: dict[str, Any], state: dict[str, Any],
                    keep: int = 2) -> Path:
    """Returns the path of a new complete checkpoint ``folder/step_<step>``.

    Args:
        folder: the run's checkpoints folder.
        step: the training step just finished.
        modules: name -> object with ``save_pretrained(path)`` or ``save(path)`` (models).
        state: everything else (optimiser/scheduler state dicts, RNG states, data position).
        keep: how many most recent checkpoints to keep.
    """
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:06d}"
    tmp = folder / f".tmp_step_{step:06d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    for name, module in modules.items():
        if hasattr(module, "save_pretrained"):
            module.save_pretrained(tmp / name)
        else:
            module.save(tmp / name)
    torch.save({"step": step, **state}, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    (folder / "latest.tmp").write_text(final.name)
    os.replace(folder / "latest.tmp", folder / "latest")
    for old in sorted(p for p in folder.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(folder: Path) -> Path | None:
    """Returns the newest complete checkpoint in ``folder``, or None."""
    pointer = folder / "latest"
    if pointer.is_file():
        path = folder / pointer.read_text().strip()
        if (path / STATE_FILE).is_file():
            return path
    done = sorted(p for p in folder.glob("step_*") if (p / STATE_FILE).is_file())
    return done[-1] if done else None


def load_state(path: Path) -> dict[str, Any]:
    """Returns the non-model state saved in checkpoint ``path``."""
    return torch.load(path / STATE_FILE, weights_only=False)
