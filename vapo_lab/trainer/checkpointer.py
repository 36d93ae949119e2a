"""The checkpoint manager: saves and loads the stateful parts of a run it is handed.

It is given the parts by name and never sees the trainer's class:
  - ``models``: weights, saved as safetensors (``save_pretrained`` / ``save``) on one process;
  - ``optimizers``: name -> (the model's name, optimiser);
  - ``stateful``: anything with ``state_dict`` / ``load_state_dict`` that is the same on every rank
    (learning-rate schedulers);
  - ``per_rank``: stateful parts whose state differs by rank (the trainer's RNG streams): every
    rank's state is saved, and each rank loads its own; a checkpoint from another number of ranks
    gives each rank rank 0's, and the part decides what that means for it.

One process writes a checkpoint folder with :func:`vapo_lab.runs.checkpoint.save_checkpoint`;
many ranks (``trainer.strategy=fsdp``) write their shards of the models and optimiser states with
torch distributed checkpointing into ``dcp/`` (:mod:`vapo_lab.distributed.dcp`), which re-shards for
any rank count, and rank 0 commits the folder the same way. A new piece of saved state is a new
entry in ``stateful`` or ``per_rank`` (or a key of the trainer's own ``state_dict``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from torch import nn
from torch.optim import Optimizer

from vapo_lab import faults
from vapo_lab.distributed.dcp import load_sharded, save_sharded
from vapo_lab.distributed.world import World
from vapo_lab.errors import CheckpointError
from vapo_lab.runs.checkpoint import latest_checkpoint, load_state, save_checkpoint, tmp_folder

DCP_DIR = "dcp"  # a sharded checkpoint's models and optimiser states


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


class CheckpointManager:
    """Saves the parts it is handed into ``folder/step_<N>`` and loads the newest usable one."""

    def __init__(self, folder: Path, world: World, models: dict[str, nn.Module],
                 optimizers: dict[str, tuple[str, Optimizer]], stateful: dict[str, Stateful],
                 per_rank: dict[str, Stateful], log: Callable[[str], None] = print) -> None:
        self.folder, self.world, self.log = folder, world, log
        self.models, self.optimizers, self.stateful, self.per_rank = models, optimizers, stateful, per_rank

    def save(self, step: int) -> Path:
        """Returns the path of the checkpoint at ``step``, written atomically (every rank calls it)."""
        if self.world.initialized:
            return self._save_sharded(step)
        state = {**{name: opt.state_dict() for name, (_, opt) in self.optimizers.items()}, **self._shared_state()}
        return save_checkpoint(self.folder, step, self.models, state,
                               before_commit=lambda: faults.point("checkpoint", step))

    def load(self) -> Path | None:
        """Loads the newest usable checkpoint into the parts; returns its path (None: there is none).

        Raises:
            CheckpointError: a file would run code when loaded, or the checkpoint was written by a
                sharded run and this one is one process (or the reverse).
        """
        path = latest_checkpoint(self.folder, warn=self.log if self.world.main else None)
        if path is None:
            return None
        state = _current_layout(load_state(path))  # first: it refuses an unsafe file before any model is touched
        sharded = (path / DCP_DIR).is_dir()
        if sharded != self.world.initialized:
            raise CheckpointError(
                f"{path} was written by a {'sharded (trainer.strategy=fsdp)' if sharded else 'one-process'} run and "
                f"this run is {'sharded' if self.world.initialized else 'one process'}: resume it with the "
                f"trainer.strategy it was saved with")
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
            part.load_state_dict(ranks[self.world.rank] if len(ranks) == self.world.size else ranks[0])
        return path

    def _shared_state(self) -> dict[str, Any]:
        """The stateful parts' states, and every rank's state of each per-rank part (a collective)."""
        return {**{name: part.state_dict() for name, part in self.stateful.items()},
                **{name: self.world.gather(part.state_dict()) for name, part in self.per_rank.items()}}

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
        save_sharded(tmp / DCP_DIR, self._sharded_state())
        state = self._shared_state()
        final = self.folder / f"step_{step:06d}"
        if world.main:
            final = save_checkpoint(self.folder, step, {}, state, tmp=tmp,
                                    before_commit=lambda: faults.point("checkpoint", step))
        world.barrier()
        return final

    def _load_sharded(self, path: Path) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        shards = self._sharded_state()
        load_sharded(path / DCP_DIR, shards)
        paired = set()
        for name, (model_name, opt) in self.optimizers.items():
            set_state_dict(self.models[model_name], opt, model_state_dict=shards[model_name],
                           optim_state_dict=shards[name])
            paired.add(model_name)
        for name, model in self.models.items():
            if name not in paired:
                set_model_state_dict(model, shards[name])


def _read_model(model: nn.Module, path: Path) -> nn.Module:
    """Returns the model saved at ``path``, read by the class of ``model`` (safetensors, no code run)."""
    if hasattr(model, "save_pretrained"):
        return type(model).from_pretrained(path, dtype=model.dtype, use_safetensors=True)
    return type(model).load(path)


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
    return {**state, "trainer": [
        {**own, "world_size": size,
         "rng": {**state["rng"], "torch": ranks["torch"][r],
                 "generators": {**state["rng"]["generators"], "rollout": ranks["rollout"][r]}}}
        for r in range(size)]}
