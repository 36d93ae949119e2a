"""Atomic, checksummed checkpoints that load without running any code from the file.

A checkpoint holds what an exact resume needs: policy, critic, optimisers, schedulers, every RNG
state, the data position and the step. It is written to a temporary folder, checksummed
(``manifest.json``, see :mod:`vapo_lab.integrity`), then renamed into place: the rename is the
commit point, so a crash while writing leaves the previous checkpoints as they were. Older ones
are pruned only after the new one is complete.

Safety: everything but the models (optimiser and scheduler state, RNG states, the data position,
the step) goes to ``trainer_state.pt`` as tensors and plain containers, read back with
``torch.load(weights_only=True)``, which refuses any object a pickle could use to run code; the
step is also in ``trainer_state.json`` for people and tools; models are safetensors. A file that needs more than ``weights_only`` is
refused with one line naming it, never loaded.

Corruption: :func:`latest_checkpoint` returns the newest checkpoint whose files match their
checksums; a damaged newer one is skipped with a warning (the run resumes from the one before).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vapo_lab.errors import CheckpointError
from vapo_lab.integrity import manifest_problem, write_manifest

STATE_FILE = "trainer_state.pt"
META_FILE = "trainer_state.json"


def rng_state(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """Returns the global and named RNG states: Python's as JSON-able lists, torch's as tensors."""
    version, internal, gauss = random.getstate()
    return {
        "python": [version, list(internal), gauss],
        "torch": torch.get_rng_state(),
        "generators": {name: g.get_state() for name, g in generators.items()},
    }


def set_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator]) -> None:
    """Restores what ``rng_state`` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    for name, g in generators.items():
        g.set_state(state["generators"][name])


def save_checkpoint(folder: Path, step: int, modules: dict[str, Any], state: dict[str, Any],
                    keep: int = 2, before_commit: Callable[[], None] | None = None,
                    tmp: Path | None = None) -> Path:
    """Returns the path of a new complete checkpoint ``folder/step_<step>``.

    Args:
        folder: the run's checkpoints folder.
        step: the training step just finished.
        modules: name -> object with ``save_pretrained(path)`` or ``save(path)`` (models).
        state: everything else, as tensors and plain containers (optimiser and scheduler state
            dicts, the trainer's own state with ``rng`` from :func:`rng_state`).
        keep: how many most recent checkpoints to keep (older ones are removed after this one is
            complete, so a damaged newest one always has a predecessor to fall back to).
        before_commit: called once every file is written, before the rename (fault tests).
        tmp: a temporary folder already holding part of the checkpoint (a sharded one's
            ``tmp_folder``, filled by every rank); None: a fresh one.
    """
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:06d}"
    if tmp is None:
        tmp = folder / f".tmp_step_{step:06d}_{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    for name, module in modules.items():
        if hasattr(module, "save_pretrained"):
            module.save_pretrained(tmp / name)  # safetensors
        else:
            module.save(tmp / name)
    torch.save({"step": step, **state}, tmp / STATE_FILE)
    (tmp / META_FILE).write_text(json.dumps({"step": step}) + "\n")
    write_manifest(tmp)
    if before_commit is not None:
        before_commit()
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    (folder / "latest.tmp").write_text(final.name)
    os.replace(folder / "latest.tmp", folder / "latest")
    for old in sorted(p for p in folder.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in folder.glob(".tmp_step_*"):  # a write killed before its rename
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def tmp_folder(folder: Path, step: int) -> Path:
    """Returns the temporary folder of a checkpoint that many ranks write together (one name for all)."""
    return folder / f".tmp_step_{step:06d}_ranks"


def latest_checkpoint(folder: Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """Returns the newest checkpoint in ``folder`` whose files match their checksums, or None.

    A newer checkpoint that is damaged (a zeroed, truncated or missing file) is skipped, and
    ``warn`` is told which one and why.
    """
    candidates = sorted((p for p in folder.glob("step_*") if p.is_dir() and p.name[5:].isdigit()), reverse=True)
    for i, path in enumerate(candidates):
        problem = manifest_problem(path)
        if problem is None:
            return path
        if warn is not None:
            older = candidates[i + 1].name if i + 1 < len(candidates) else "none left"
            warn(f"warning: checkpoint {path.name} is unusable ({problem}); falling back to the one before "
                 f"({older})")
    return None


def load_state(path: Path) -> dict[str, Any]:
    """Returns the non-model state saved in checkpoint ``path``, read without unpickling objects.

    Raises:
        CheckpointError: ``trainer_state.pt`` holds objects beyond tensors and plain containers
            (``torch.load(weights_only=True)`` refuses it: it could run code), or a file is unreadable.
    """
    file = path / STATE_FILE
    try:
        tensors = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load {file}: it holds Python objects beyond tensors, which could run code when "
            "unpickled (vapo-lab writes only tensors and plain containers there); use a checkpoint written by vapo-lab") from e
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"cannot read {file}: {str(e).splitlines()[0][:200]}") from e
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path / META_FILE}: {e}") from e
    state = {**tensors, "step": meta["step"]}
    if "python_rng" in meta:  # the layout before the Python RNG state moved into trainer_state.pt
        state.update({k: v for k, v in meta.items() if k != "python_rng"})
        state["rng"] = {**tensors["rng"], "python": meta["python_rng"]}
    return state
