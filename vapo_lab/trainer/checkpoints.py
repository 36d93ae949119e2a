"""A training run's checkpoints: everything a resumed run needs to log what an uninterrupted one would.

A checkpoint holds the policy and critic weights, the optimiser and schedule states, the rollout
and update RNGs (with the global ones), the data stream's position, the best eval so far and the
step. The files and their atomic write are :mod:`vapo_lab.runs.checkpoint`'s.

A sharded run (``trainer.strategy=fsdp``) writes its models and optimiser states with torch
distributed checkpointing into ``dcp/`` (each rank its shards, :mod:`vapo_lab.distributed.dcp`),
and every rank's RNG states beside them; rank 0 then checksums and commits the folder as above.
It resumes on the same number of ranks exactly; on another number it loads the same weights and
optimiser state (re-sharded), and each rank's rollout RNG is derived afresh from (seed, step, rank).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vapo_lab import faults
from vapo_lab.distributed.dcp import load_sharded, save_sharded
from vapo_lab.errors import CheckpointError
from vapo_lab.models.value import ValueModel
from vapo_lab.runs.checkpoint import (
    latest_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
    tmp_folder,
)
from vapo_lab.runs.folder import CHECKPOINTS

DCP_DIR = "dcp"  # a sharded checkpoint's models and optimiser states

if TYPE_CHECKING:
    from vapo_lab.trainer.run import Run


def save_run(run: Run) -> Path:
    """Returns the path of the checkpoint of ``run`` at its current step, written atomically."""
    if run.world.initialized:
        return _save_sharded(run)
    modules: dict[str, Any] = {"policy": run.policy}
    if run.critic is not None:
        modules["critic"] = run.critic
    state = {
        "actor_opt": run.actor_opt.state_dict(), "actor_sched": run.actor_sched.state_dict(),
        "critic_opt": run.critic_opt.state_dict() if run.critic_opt else None,
        "critic_sched": run.critic_sched.state_dict() if run.critic_sched else None,
        "rng": rng_state(_generators(run)),
        "data": run.data.state(), "best_eval": run.best_eval,
    }
    return save_checkpoint(run.run_dir / CHECKPOINTS, run.step, modules, state,
                           before_commit=lambda: faults.point("checkpoint", run.step))


def resume_run(run: Run) -> None:
    """Loads the latest usable checkpoint of ``run``'s folder into it (none: it starts at step 0)."""
    path = latest_checkpoint(run.run_dir / CHECKPOINTS, warn=run.log if run.world.main else None)
    if path is None:
        run.log(f"no usable checkpoint in {run.run_dir}: starting from step 0")
        return
    state = load_state(path)  # first: it refuses an unsafe file before any model is touched
    sharded = (path / DCP_DIR).is_dir()
    if sharded != run.world.initialized:
        raise CheckpointError(
            f"{path} was written by a {'sharded (trainer.strategy=fsdp)' if sharded else 'one-process'} run and "
            f"this run is {'sharded' if run.world.initialized else 'one process'}: resume it with the "
            f"trainer.strategy it was saved with")
    if sharded:
        _load_sharded(run, path, state)
        return
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(path / "policy", dtype=run.policy.dtype, use_safetensors=True)
    run.policy.load_state_dict(policy.state_dict())
    if run.critic is not None:
        run.critic.load_state_dict(ValueModel.load(path / "critic").state_dict())
    run.actor_opt.load_state_dict(state["actor_opt"])
    run.actor_sched.load_state_dict(state["actor_sched"])
    if run.critic_opt is not None:
        run.critic_opt.load_state_dict(state["critic_opt"])
        run.critic_sched.load_state_dict(state["critic_sched"])
    set_rng_state(state["rng"], _generators(run))
    run.data.load(state["data"])
    run.step, run.best_eval = int(state["step"]), state["best_eval"]
    if run.sampling.engine is not None:
        run.sampling.engine.push_weights(run.policy)
    run.log(f"resumed {run.run_dir} at step {run.step}")


def _sharded_state(run: Run) -> dict[str, Any]:
    """The state dicts of the sharded models and optimisers, as DCP saves and loads them."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    policy, actor_opt = get_state_dict(run.policy, run.actor_opt)
    state = {"policy": policy, "actor_opt": actor_opt}
    if run.critic is not None:
        state["critic"], state["critic_opt"] = get_state_dict(run.critic, run.critic_opt)
    return state


def _save_sharded(run: Run) -> Path:
    """Writes a sharded checkpoint (every rank calls it); returns its path."""
    world, folder = run.world, run.run_dir / CHECKPOINTS
    tmp = tmp_folder(folder, run.step)
    if world.main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    world.barrier()
    save_sharded(tmp / DCP_DIR, _sharded_state(run))
    rngs = world.gather(rng_state(_generators(run)))
    final = folder / f"step_{run.step:06d}"
    if world.main:
        state = {
            "actor_sched": run.actor_sched.state_dict(),
            "critic_sched": run.critic_sched.state_dict() if run.critic_sched else None,
            "rng": rngs[0], "rank_rng": {"torch": [r["torch"] for r in rngs],
                                         "rollout": [r["generators"]["rollout"] for r in rngs]},
            "data": run.data.state(), "best_eval": run.best_eval, "world_size": world.size,
        }
        final = save_checkpoint(folder, run.step, {}, state, tmp=tmp,
                                before_commit=lambda: faults.point("checkpoint", run.step))
    world.barrier()
    return final


def _load_sharded(run: Run, path: Path, state: dict[str, Any]) -> None:
    """Loads sharded checkpoint ``path`` (its non-model ``state`` already read) into ``run``."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    world = run.world
    shards = _sharded_state(run)
    load_sharded(path / DCP_DIR, shards)
    set_state_dict(run.policy, run.actor_opt, model_state_dict=shards["policy"],
                   optim_state_dict=shards["actor_opt"])
    if run.critic is not None:
        set_state_dict(run.critic, run.critic_opt, model_state_dict=shards["critic"],
                       optim_state_dict=shards["critic_opt"])
    run.actor_sched.load_state_dict(state["actor_sched"])
    if run.critic_sched is not None:
        run.critic_sched.load_state_dict(state["critic_sched"])
    run.step, run.best_eval = int(state["step"]), state["best_eval"]
    set_rng_state(state["rng"], _generators(run))  # python's and the update RNG: the same on every rank
    if int(state.get("world_size", 0)) == world.size:
        torch.set_rng_state(state["rank_rng"]["torch"][world.rank])
        run.gen_rollout.set_state(state["rank_rng"]["rollout"][world.rank])
    else:  # another rank count: each rank's stream afresh from (seed, step, rank)
        run.gen_rollout.manual_seed(int(run.cfg.seed) + 1_000_003 * world.rank + 7919 * run.step)
        run.log(f"resuming a {state.get('world_size')}-rank checkpoint on {world.size} ranks: same weights and "
                "optimiser state, rollout RNG streams derived afresh (the history will not match an uninterrupted run)")
    run.data.load(state["data"])
    run.sampling.engine.push_weights(run.policy)
    run.log(f"resumed {run.run_dir} at step {run.step} on {world.size} rank(s)")


def _generators(run: Run) -> dict[str, Any]:
    """The run's own RNGs, by the names a checkpoint stores them under."""
    return {"rollout": run.gen_rollout, "update": run.gen_update}
