"""The checkpoint manager: saves and loads the stateful parts of a run it is handed, by name.

Models, optimisers, stateful parts alike on every rank (schedulers) and per-rank ones (RNG
streams); one process writes safetensors, many ranks torch distributed checkpoints.
``checkpoint_to_resume`` picks the newest checkpoint that matches its checksums and the run's
architecture before anything loads (docs/training.md#faults-resume-and-safety).
"""

from __future__ import annotations

import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from safetensors import SafetensorError
from torch import nn
from torch.optim import Optimizer

from vapo_lab import faults
from vapo_lab.distributed.dcp import load_sharded, save_sharded
from vapo_lab.distributed.world import World
from vapo_lab.errors import CheckpointError
from vapo_lab.runs.checkpoint import (
    META_FILE,
    abandon,
    first_line,
    latest_checkpoint,
    load_state,
    refuse_unsafe_files,
    resumable_checkpoint,
    save_checkpoint,
    tensor_bytes,
    tmp_folder,
    unsafe_file,
)

DCP_DIR = "dcp"  # a sharded checkpoint's models and optimiser states
# the keys of a Hugging Face config that fix its model's parameter names and shapes
ARCH_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class CheckpointManager:
    """Saves the parts it is handed into ``folder/step_<N>`` and loads the newest usable one."""

    def __init__(
        self,
        folder: Path,
        world: World,
        models: dict[str, nn.Module],
        optimizers: dict[str, tuple[str, Optimizer]],
        stateful: dict[str, Stateful],
        per_rank: dict[str, Stateful],
        log: Callable[[str], None] = print,
    ) -> None:
        self.folder, self.world, self.log = folder, world, log
        self.models, self.optimizers, self.stateful, self.per_rank = (
            models,
            optimizers,
            stateful,
            per_rank,
        )
        if world.main:  # a save killed before its rename: never resumed from, only in the way
            for stale in folder.glob(".tmp_step_*"):
                shutil.rmtree(stale, ignore_errors=True)

    def save(self, step: int) -> Path:
        """Returns the path of the checkpoint at ``step``, written atomically (every rank calls
        it)."""
        if self.world.initialized:
            return self._save_sharded(step)
        state = {
            **{name: opt.state_dict() for name, (_, opt) in self.optimizers.items()},
            **self._shared_state(),
        }
        return save_checkpoint(
            self.folder,
            step,
            self.models,
            state,
            meta=self._meta(),
            before_commit=lambda: faults.point("checkpoint", step),
        )

    def load(self, path: Path | None = None) -> Path | None:
        """Loads checkpoint ``path`` (None: the newest usable one) into the parts; returns its path
        (None: there is none).

        Raises:
            CheckpointError: a file would run code when loaded, the checkpoint does not fit the
                parts (another model's), or it was written by a sharded run and this one is one
                process (or the reverse).
        """
        path = path or latest_checkpoint(self.folder, warn=self.log if self.world.main else None)
        if path is None:
            return None
        try:
            self._load(path)
        except (
            RuntimeError,
            ValueError,
            KeyError,
        ) as e:  # a state that does not fit: never a traceback
            raise CheckpointError(
                f"{path} does not fit this run's models and optimisers ({first_line(e)}): "
                f"move it out of {self.folder} to resume from the run's own checkpoints"
            ) from e
        return path

    def _meta(self) -> dict[str, Any]:
        """What ``trainer_state.json`` records beside the step: each model's architecture and tensor
        shapes."""
        return {
            "models": {name: architecture(model) for name, model in self.models.items()},
            "shapes": {name: tensor_shapes(model) for name, model in self.models.items()},
        }

    def _load(self, path: Path) -> None:
        """Loads checkpoint ``path`` into the parts, its state file first (an unsafe one is refused
        before any model is touched)."""
        state = _current_layout(load_state(path))
        sharded = (path / DCP_DIR).is_dir()
        if sharded != self.world.initialized:
            raise CheckpointError(
                f"{path} was written by a "
                f"{'sharded (trainer.strategy=fsdp)' if sharded else 'one-process'} run and "
                f"this run is {'sharded' if self.world.initialized else 'one process'}: resume it "
                "with the "
                f"trainer.strategy it was saved with"
            )
        if sharded:
            self._load_sharded(path)
        else:
            for name, model in self.models.items():
                model.load_state_dict(_read_model(model, path / name).state_dict())
            for name, (_, opt) in self.optimizers.items():
                opt.load_state_dict(state[name])
        for name, part in self.stateful.items():
            part.load_state_dict(state[name])
        for name, part in self.per_rank.items():
            ranks = state[name]
            part.load_state_dict(
                ranks[self.world.rank] if len(ranks) == self.world.size else ranks[0]
            )

    def _shared_state(self) -> dict[str, Any]:
        """The stateful parts' states, and every rank's state of each per-rank part (a
        collective)."""
        return {
            **{name: part.state_dict() for name, part in self.stateful.items()},
            **{name: self.world.gather(part.state_dict()) for name, part in self.per_rank.items()},
        }

    def _sharded_state(self) -> dict[str, Any]:
        """The state dicts of the sharded models and optimisers, as DCP saves and loads them."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        state, paired = {}, set()
        for name, (model_name, opt) in self.optimizers.items():
            state[model_name], state[name] = get_state_dict(self.models[model_name], opt)
            paired.add(model_name)
        for name, model in self.models.items():
            if name not in paired:
                state[name] = get_model_state_dict(model)
        return state

    def _save_sharded(self, step: int) -> Path:
        world = self.world
        tmp = tmp_folder(self.folder, step)
        if world.main:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        world.barrier()
        final = self.folder / f"step_{step:06d}"
        shards = self._sharded_state()
        try:
            save_sharded(tmp / DCP_DIR, shards)
        except (KeyboardInterrupt, SystemExit):
            raise
        # DCP's CheckpointException (a BaseException), raised on every rank
        except BaseException as e:
            # {rank: (its exception, its stack)}, the first one told
            failures = getattr(e, "failures", None)
            cause = next(iter(failures.values()))[0] if failures else e
            # every rank's writes have ended: the main one removes the partial folder,
            world.barrier()
            error = (
                abandon(self.folder, final.name, tmp, cause, tensor_bytes(shards))
                if world.main
                else None
            )
            world.barrier()  # then the others tell the free space it leaves
            if error is None:
                error = abandon(self.folder, final.name, None, cause, tensor_bytes(shards))
            raise error from e
        state = self._shared_state()
        if world.main:
            final = save_checkpoint(
                self.folder,
                step,
                {},
                state,
                tmp=tmp,
                meta=self._meta(),
                before_commit=lambda: faults.point("checkpoint", step),
            )
        world.barrier()
        return final

    def _load_sharded(self, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        shards = self._sharded_state()
        load_sharded(path / DCP_DIR, shards)
        paired = set()
        for name, (model_name, opt) in self.optimizers.items():
            set_state_dict(
                self.models[model_name],
                opt,
                model_state_dict=shards[model_name],
                optim_state_dict=shards[name],
            )
            paired.add(model_name)
        for name, model in self.models.items():
            if name not in paired:
                set_model_state_dict(model, shards[name])


def _read_model(model: nn.Module, path: Path) -> nn.Module:
    """Returns the model saved at ``path``, read by the class of ``model`` (safetensors, and tensor
    files read with ``weights_only``: no code run).

    Raises:
        CheckpointError: a tensor file holds a pickle of other objects (one line, never torch's
            advice to load it unsafely), or a file is unreadable.
    """
    try:
        if hasattr(model, "save_pretrained"):
            return type(model).from_pretrained(path, dtype=model.dtype, use_safetensors=True)
        return type(model).load(path)
    except pickle.UnpicklingError as e:
        # torch's refusal names no file: name the folder's only one
        files = sorted(path.glob("*.pt"))
        raise unsafe_file(files[0] if len(files) == 1 else path) from e
    except (OSError, EOFError, SafetensorError) as e:
        raise CheckpointError(f"cannot read the model in {path}: {first_line(e)}") from e


def architecture(model: Any) -> dict[str, Any]:
    """Returns the ``ARCH_KEYS`` of ``model``'s config (a value model's: its backbone's); {} without
    one."""
    hf = getattr(model, "config", None) or getattr(getattr(model, "backbone", None), "config", None)
    if hf is None:
        return {}
    return {k: v for k in ARCH_KEYS if (v := getattr(hf, k, None)) is not None}


def tensor_shapes(model: nn.Module) -> dict[str, list[int]]:
    """Returns the shape of each tensor in ``model``'s state dict (a sharded one's: the whole
    tensor's)."""
    return {key: list(value.shape) for key, value in model.state_dict().items()}


def checkpoint_to_resume(
    folder: Path,
    expected: dict[str, dict[str, Any]],
    warn: Callable[[str], None] | None = None,
    shapes: dict[str, dict[str, list[int]]] | None = None,
) -> Path | None:
    """Returns the checkpoint a resumed run continues from: the newest in ``folder`` that matches
    its checksums (``warn`` is told of a damaged newer one); None when the run never wrote one. It
    reads configs and the structure of the tensor files, no tensor: call it before anything of the
    run is reopened.

    Args:
        expected: model name -> the architecture (:func:`architecture`) the run's model has.
        shapes: model name -> its :func:`tensor_shapes`, for the models already built.

    Raises:
        CheckpointError: the run wrote checkpoints and none is usable, the newest usable one is
            another model's (one line naming the difference), or one of its tensor files holds more
            than tensors.
    """
    path = resumable_checkpoint(folder, warn)
    if path is None:
        return None
    problem = model_mismatch(path, expected, shapes)
    if problem is not None:
        raise CheckpointError(
            f"{path} is not a checkpoint of this run's model: {problem}; move it out of "
            f"{folder} to resume from the run's own checkpoints"
        )
    refuse_unsafe_files(path)
    return path


def model_mismatch(
    path: Path,
    expected: dict[str, dict[str, Any]],
    shapes: dict[str, dict[str, list[int]]] | None = None,
) -> str | None:
    """Returns how the models of checkpoint ``path`` differ from ``expected`` and ``shapes`` (one
    phrase), or None; a checkpoint that recorded no architecture (a sharded one of an older
    vapo-lab) is not judged, nor the shapes of one that recorded none. Shapes are compared for the
    tensors both
    name: the ``ARCH_KEYS`` miss some (a mixture of experts' expert count)."""
    meta = _json(path / META_FILE)
    saved = saved_architectures(path, meta)
    if saved is None:
        return None
    for name in [*expected, *sorted(set(saved) - set(expected))]:
        if name not in saved:
            return f"it has no {name}, and this run has one"
        if name not in expected:
            return f"it has a {name}, and this run has none"
        for key in ARCH_KEYS:
            theirs, mine = saved[name].get(key), expected[name].get(key)
            if theirs is not None and mine is not None and theirs != mine:
                return f"its {name} has {key}={theirs}, this run's has {key}={mine}"
    recorded = meta.get("shapes")
    for name, mine in (shapes or {}).items():
        theirs = recorded.get(name) if isinstance(recorded, dict) else None
        # in the model's own order
        for key, dims in mine.items() if isinstance(theirs, dict) else ():
            if key in theirs and list(theirs[key]) != dims:
                return f"its {name}'s {key} is {_dims(theirs[key])}, this run's is {_dims(dims)}"
    return None


def _dims(shape: list[int]) -> str:
    """Returns ``shape`` as a reader writes it: 64x128."""
    return "x".join(map(str, shape)) or "a scalar"


def saved_architectures(path: Path, meta: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """Returns {model name: architecture} of checkpoint ``path``: as ``meta`` (its
    ``trainer_state.json``) records them, each replaced by its folder's config.json where it has one
    (what loading reads); None: neither says (a sharded checkpoint of an older vapo-lab).

    Raises:
        CheckpointError: one of those files is not a JSON object.
    """
    recorded = meta.get("models")
    saved = (
        {n: a for n, a in recorded.items() if isinstance(a, dict)}
        if isinstance(recorded, dict)
        else {}
    )
    for config in sorted(path.glob("*/config.json")):
        saved[config.parent.name] = {k: v for k, v in _json(config).items() if k in ARCH_KEYS}
    return saved or None


def _json(file: Path) -> dict[str, Any]:
    """Returns the JSON object in ``file``."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {file}: {first_line(e)}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"cannot read {file}: it holds no JSON object")
    return data


def _current_layout(state: dict[str, Any]) -> dict[str, Any]:
    """Returns ``state`` in the current layout; a checkpoint written before the trainer's own state
    was one part (``trainer``, per rank) had its keys at the top level."""
    if "trainer" in state or "rng" not in state:
        return state
    own = {"step": state["step"], "best_eval": state["best_eval"], "data": state["data"]}
    if "rank_rng" not in state:
        return {**state, "trainer": [{**own, "rng": state["rng"], "world_size": 1}]}
    ranks = state["rank_rng"]
    size = int(state["world_size"])
    return {
        **state,
        "trainer": [
            {
                **own,
                "world_size": size,
                "rng": {
                    **state["rng"],
                    "torch": ranks["torch"][r],
                    "generators": {**state["rng"]["generators"], "rollout": ranks["rollout"][r]},
                },
            }
            for r in range(size)
        ],
    }
