"""A training run's checkpoints: everything a resumed run needs to log what an uninterrupted one would.

A checkpoint holds the policy and critic weights, the optimiser and schedule states, the rollout
and update RNGs (with the global ones), the data stream's position, the best eval so far and the
step. The files and their atomic write are :mod:`vapo_lab.runs.checkpoint`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vapo_lab import faults
from vapo_lab.models.value import ValueModel
from vapo_lab.runs.checkpoint import latest_checkpoint, load_state, rng_state, save_checkpoint, set_rng_state
from vapo_lab.runs.folder import CHECKPOINTS

if TYPE_CHECKING:
    from vapo_lab.trainer.run import Run


def save_run(run: Run) -> Path:
    """Returns the path of the checkpoint of ``run`` at its current step, written atomically."""
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
    path = latest_checkpoint(run.run_dir / CHECKPOINTS, warn=run.log)
    if path is None:
        run.log(f"no usable checkpoint in {run.run_dir}: starting from step 0")
        return
    from transformers import AutoModelForCausalLM

    state = load_state(path)  # first: it refuses an unsafe file before any model is touched
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


def _generators(run: Run) -> dict[str, Any]:
    """The run's own RNGs, by the names a checkpoint stores them under."""
    return {"rollout": run.gen_rollout, "update": run.gen_update}
