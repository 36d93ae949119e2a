"""Atomic, checksummed checkpoints that load without running any code from the file.

A checkpoint holds what an exact resume needs (policy, critic, optimisers, schedulers, every RNG
state, the data position, the step). It is written to a temporary folder, checksummed
(:mod:`vapo_lab.integrity`), then renamed into place: the rename is the commit point, so a crash
while writing leaves the previous checkpoints as they were. A write that fails (a full disk)
removes its partial folder and raises one line: the space needed and how to resume.

Models are safetensors; everything else goes to ``trainer_state.pt`` as tensors and plain
containers, read back with ``torch.load(weights_only=True)``, which refuses any object that could
run code (the step is also in ``trainer_state.json``, for people and tools). A damaged newer
checkpoint is skipped with a warning (:func:`latest_checkpoint`); checksums detect corruption, not
tampering.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from vapo_lab.errors import CheckpointError
from vapo_lab.integrity import manifest_problem, write_manifest

STATE_FILE = "trainer_state.pt"
META_FILE = "trainer_state.json"
# the name of the newest checkpoint, for people and tools (readers check every one)
LATEST = "latest"
# what a failed write raises: the OS's error, torch.save's RuntimeError, safetensors' own error
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


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


def save_checkpoint(
    folder: Path,
    step: int,
    modules: dict[str, Any],
    state: dict[str, Any],
    keep: int = 2,
    before_commit: Callable[[], None] | None = None,
    tmp: Path | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Returns the path of a new complete checkpoint ``folder/step_<step>`` (``folder``: the run's
    ``checkpoints``; ``step``: the one just finished).

    Args:
        modules: name -> object with ``save_pretrained(path)`` or ``save(path)`` (models).
        state: everything else, as tensors and plain containers (optimiser and scheduler state
            dicts, the trainer's own state with ``rng`` from :func:`rng_state`).
        keep: how many most recent checkpoints to keep (older ones are removed after this one is
            complete, so a damaged newest one always has a predecessor to fall back to).
        before_commit: called once every file is written, before the rename (fault tests).
        tmp: a temporary folder already holding part of the checkpoint (a sharded one's
            ``tmp_folder``, filled by every rank); None: a fresh one.
        meta: JSON-able facts written beside the step in ``trainer_state.json``.

    Raises:
        CheckpointError: a file could not be written (a full disk): one line with the space needed;
            the partial folder is removed and the previous checkpoints are as they were.
    """
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step_{step:06d}"
    fresh = tmp is None
    written = 0 if fresh else _bytes_in(tmp)  # a sharded checkpoint's shards, already there
    tmp = tmp or folder / f".tmp_step_{step:06d}_{os.getpid()}"
    try:
        _write(tmp, step, modules, state, meta, fresh)
    except WRITE_ERRORS as e:
        raise abandon(folder, final.name, tmp, e, written + tensor_bytes([modules, state])) from e
    # an interrupt: no half-written folder is left (the next write would clear it)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if before_commit is not None:
        before_commit()
    try:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        (folder / "latest.tmp").write_text(final.name)
        os.replace(folder / "latest.tmp", folder / LATEST)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        (folder / "latest.tmp").unlink(missing_ok=True)
        raise _write_failure(folder, final.name, e, None) from e
    for old in sorted(p for p in folder.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in folder.glob(".tmp_step_*"):  # a write killed before its rename
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _write(
    tmp: Path,
    step: int,
    modules: dict[str, Any],
    state: dict[str, Any],
    meta: dict[str, Any] | None,
    fresh: bool,
) -> None:
    """Writes every file of a checkpoint into ``tmp`` (new when ``fresh``), the manifest last."""
    if fresh:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    for name, module in modules.items():
        if hasattr(module, "save_pretrained"):
            module.save_pretrained(tmp / name)  # safetensors
        else:
            module.save(tmp / name)
    torch.save({"step": step, **state}, tmp / STATE_FILE)
    (tmp / META_FILE).write_text(json.dumps({"step": step, **(meta or {})}) + "\n")
    write_manifest(tmp)


def abandon(
    folder: Path, name: str, tmp: Path | None, error: BaseException, needed: int | None
) -> CheckpointError:
    """Removes ``tmp``, the partial folder of checkpoint ``name`` that ``error`` stopped (None:
    another process removes it), and returns the one-line error to raise."""
    _release(error)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return _write_failure(folder, name, error, needed)


def _write_failure(
    folder: Path, name: str, error: BaseException, needed: int | None
) -> CheckpointError:
    """Returns the one-line error of checkpoint ``name`` not written to ``folder`` (its partial
    folder already removed, so the free space is what the disk has for the next try); ``needed``:
    the bytes the checkpoint takes (None: it was written, its commit failed)."""
    free = shutil.disk_usage(folder).free
    done = sorted(p.name for p in folder.glob("step_*") if p.is_dir())
    resume = f"vapo-lab train resume={folder.parent}" + (
        f" (it continues from {done[-1]})" if done else " (it starts again from step 0)"
    )
    if _out_of_space(error) or (needed is not None and free < needed):
        need = f"it needs about {_size(needed)}, " if needed is not None else ""
        short = (
            f"at least {_size(needed - free)}" if needed is not None and needed > free else "space"
        )
        return CheckpointError(
            f"no space left to write checkpoint {name} in {folder}: {need}{_size(free)} "
            f"are free; free {short} there, then continue with: {resume}"
        )
    return CheckpointError(
        f"cannot write checkpoint {name} in {folder}: {first_line(error)}; fix that, "
        f"then continue with: {resume}"
    )


def _release(error: BaseException | None) -> None:
    """Clears the local variables of the frames ``error`` (and those it came from) passed through: a
    failed writer they hold keeps its file open, and a removed open file still takes its space."""
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__


def _out_of_space(error: BaseException | None) -> bool:
    """True when ``error`` or one it was raised from says the disk (or the user's quota) is full."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left" in str(error) or "Disk quota exceeded" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def tensor_bytes(obj: Any, seen: set[int] | None = None) -> int:
    """Returns the bytes of the tensors in ``obj`` (models, via their state dicts; containers), each
    storage once: what a checkpoint of them writes, give or take its headers. A sharded tensor
    (DTensor) counts whole: what every rank's shards of it take together."""
    seen = set() if seen is None else seen
    if hasattr(obj, "placements") and isinstance(obj, torch.Tensor):  # a DTensor: its global size
        return obj.numel() * obj.element_size()
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        obj = obj.state_dict()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in obj)
    return 0


def _bytes_in(path: Path) -> int:
    """Returns the bytes of the files under ``path`` (0: it does not exist)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def _size(n: int) -> str:
    """Returns ``n`` bytes for people: "6.0 MiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1024:.1f} KiB"


def first_line(error: BaseException) -> str:
    """Returns the first line of ``error``'s message (else its type), at most 200 characters."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def tmp_folder(folder: Path, step: int) -> Path:
    """Returns the temporary folder that many ranks write a checkpoint into (one name for all)."""
    return folder / f".tmp_step_{step:06d}_ranks"


def latest_checkpoint(folder: Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """Returns the newest checkpoint in ``folder`` whose files match their checksums, or None.

    A newer checkpoint that is damaged (a zeroed, truncated or missing file) is skipped, and
    ``warn`` is told which one and why.
    """
    path, skipped = _newest_usable(folder)
    for line in _fallback_warnings(skipped, path) if warn is not None else []:
        warn(line)
    return path


def resumable_checkpoint(folder: Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """Returns the checkpoint a resumed run continues from: the newest in ``folder`` that matches
    its checksums (a damaged newer one is skipped, told to ``warn``); None when the run never
    committed one.

    Raises:
        CheckpointError: the run committed checkpoints and none matches its checksums: a damaged
            checkpoint is never a reason to start a run over in its own folder.
    """
    path, skipped = _newest_usable(folder)
    if path is None and (skipped or (folder / LATEST).exists()):
        what = (
            skipped[0][1]
            + (f"; {len(skipped) - 1} older one(s) unusable too" if len(skipped) > 1 else "")
            if skipped
            else f"{folder / LATEST} names {_read_latest(folder)}, and no step_* folder is left"
        )
        raise CheckpointError(
            f"no usable checkpoint in {folder}: {what}. "
            "A checkpoint that fails its checksums is never loaded, "
            "and a run is not started over in its folder: put the checkpoint back, "
            "or start a new run without resume= "
            f"(the run's command is in {folder.parent / 'run.json'})"
        )
    for line in _fallback_warnings(skipped, path) if warn is not None else []:
        warn(line)
    # None: it stopped before its first checkpoint, so nothing is lost by starting again
    return path


def _newest_usable(folder: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """Returns (the newest checkpoint in ``folder`` that matches its manifest or None, the newer
    damaged ones with what is wrong with each); older ones are not read."""
    skipped: list[tuple[Path, str]] = []
    for path in sorted(
        (p for p in folder.glob("step_*") if p.is_dir() and p.name[5:].isdigit()), reverse=True
    ):
        problem = manifest_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def _fallback_warnings(skipped: list[tuple[Path, str]], found: Path | None) -> list[str]:
    """Returns a warning line per damaged checkpoint skipped (newest first) before ``found``."""
    older = [p.name for p, _ in skipped[1:]] + [found.name if found is not None else "none left"]
    return [
        f"warning: checkpoint {path.name} is unusable ({problem}); "
        f"falling back to the one before ({name})"
        for (path, problem), name in zip(skipped, older)
    ]


def _read_latest(folder: Path) -> str:
    """Returns the name that ``folder/latest`` holds (a short stand-in where it cannot be read)."""
    try:
        return (folder / LATEST).read_text(encoding="utf-8").strip()[:100] or "a checkpoint"
    except (OSError, UnicodeDecodeError):
        return "a checkpoint"


def refuse_unsafe_files(path: Path) -> None:
    """Checks that every ``.pt`` file of checkpoint ``path`` holds only tensors and plain
    containers, reading its tensors memory-mapped (the structure only is read: cheap at any size).

    Raises:
        CheckpointError: a file holds other objects (it could run code), or cannot be read.
    """
    for file in sorted(path.rglob("*.pt")):
        try:
            torch.load(file, weights_only=True, map_location="cpu", mmap=True)
        except pickle.UnpicklingError as e:
            raise unsafe_file(file) from e
        except (OSError, RuntimeError, EOFError) as e:
            raise CheckpointError(f"cannot read {file}: {first_line(e)}") from e


def unsafe_file(file: Path) -> CheckpointError:
    """Returns the error refusing ``file``: it needs more than ``torch.load(weights_only=True)``."""
    return CheckpointError(
        f"refusing to load {file}: it holds Python objects beyond tensors, "
        "which could run code when unpickled "
        "(vapo-lab writes only tensors and plain containers there); "
        "use a checkpoint written by vapo-lab"
    )


def load_state(path: Path) -> dict[str, Any]:
    """Returns the non-model state saved in checkpoint ``path``, read without unpickling objects.

    Raises:
        CheckpointError: ``trainer_state.pt`` holds objects beyond tensors and plain containers
            (``torch.load(weights_only=True)`` refuses it: it could run code), or a file is
            unreadable.
    """
    file = path / STATE_FILE
    try:
        tensors = torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise unsafe_file(file) from e
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"cannot read {file}: {first_line(e)}") from e
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path / META_FILE}: {e}") from e
    state = {**tensors, "step": meta["step"]}
    if "python_rng" in meta:  # the layout before the Python RNG state moved into trainer_state.pt
        state.update({k: v for k, v in meta.items() if k != "python_rng"})
        state["rng"] = {**tensors["rng"], "python": meta["python_rng"]}
    return state
