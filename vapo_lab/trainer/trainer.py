"""The trainer: one training run of VAPO, vanilla PPO, DAPO or GRPO, on one rank or many.

``Trainer(cfg)`` sets the run up (task, policy, sampler, critic, optimisers, its folder and tracking
run, then resumes from the latest checkpoint with ``resume=<run dir>``); ``train()`` runs steps to
``trainer.total_steps``, with the held-out avg@k before the first step and every ``eval_every``
steps and a checkpoint every ``save_every``; ``train_step()`` is one step's phases in order:

  rollouts (:mod:`~vapo_lab.trainer.collect`, scored by :mod:`~vapo_lab.trainer.scoring`) ->
  the models' log-probs and values (:mod:`~vapo_lab.trainer.forward`) -> advantages
  (:mod:`~vapo_lab.trainer.advantages`) -> critic update -> actor update
  (:mod:`~vapo_lab.trainer.update`) -> metrics (:mod:`~vapo_lab.trainer.metrics`).

Every VAPO component is a config key read through the maths in ``vapo_lab.algo``; no component
logic is written here. The departures from textbook PPO (Schulman et al. 2017), each a key:
  1. Advantages and critic targets may use different λ (decoupled GAE, ``gae.lam_critic_mode``).
  2. λ_policy may be set per response from its length (``gae.lam_policy_mode``).
  3. The clip range may be asymmetric (``loss.eps_high`` > ``loss.eps_low``), optionally dual-clip.
  4. The policy loss may be averaged over all tokens of a mini-batch (``loss.agg``).
  5. A positive-example NLL term μ·NLL over correct responses may be added (``loss.mu``).
  6. Prompts may be sampled G times (``rollout.n_samples``), enabling group-relative advantages
     without a critic (``algo.advantage=group``: DAPO, GRPO), DAPO's dynamic sampling and
     overlong shaping, and GRPO's KL to the reference policy in the loss (``kl``).
  7. The critic may be pretrained alone on Monte-Carlo returns of the initial policy before RL
     (``critic.pretrain.enabled``), and starts from a reward model (``critic.init``).
  8. Rewards come only at the last token (γ = 1), from a rule-based verifier; GAE advantages are
     whitened over the batch's valid tokens (``gae.whiten``; :mod:`~vapo_lab.trainer.advantages`).

The trainer is ``Stateful``: ``state_dict()`` holds its step, best held-out score, RNG streams and
data position; the :class:`~vapo_lab.trainer.checkpointer.CheckpointManager` saves it with the
models, optimisers and schedulers, and loads it back so a resumed run logs what an uninterrupted
one would.

On many ranks (``trainer.strategy=fsdp``) every rank runs the same code on its share of each step's
prompts: rank 0 builds the shared caches (base model, reward model, pretrained critic) first and
the others load them; the actor, critic and reference are sharded with FSDP2; rank 0 alone opens
the run's folder and tracking run and logs; statistics are reduced over ranks
(:class:`~vapo_lab.distributed.world.World`: identities on one process).
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from vapo_lab import faults
from vapo_lab.basemodel.build import ProgressFactory
from vapo_lab.distributed.fsdp import is_sharded, shard
from vapo_lab.distributed.offload import on_host
from vapo_lab.distributed.world import init_world
from vapo_lab.models.precision import fsdp_policy
from vapo_lab.rollout.replica import Replica
from vapo_lab.runs.checkpoint import latest_checkpoint, rng_state, set_rng_state
from vapo_lab.runs.folder import CHECKPOINTS
from vapo_lab.seeds import heldout_seed, rollout_reseed, rollout_seed, update_seed
from vapo_lab.stop import stop_point
from vapo_lab.trainer.advantages import compute_advantages
from vapo_lab.trainer.checkpointer import (
    CheckpointManager,
    architecture,
    checkpoint_to_resume,
    tensor_shapes,
)
from vapo_lab.trainer.collect import Batch, DataStream, collect
from vapo_lab.trainer.evaluation import evaluate
from vapo_lab.trainer.forward import batched_logprobs, batched_values, token_micro_batches
from vapo_lab.trainer.metrics import StepTimes, critic_metrics, step_metrics
from vapo_lab.trainer.record import RankRecord, RunRecord, folder_to_resume
from vapo_lab.trainer.scoring import RewardScorer
from vapo_lab.trainer.setup import (
    checked_policy,
    init_critic,
    make_sampling,
    prepare_process,
    seed_everything,
    task_for,
)
from vapo_lab.trainer.update import Updater, adamw, warmup_constant


@dataclass
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    run_id: str
    steps: int
    final_eval: float | None
    best_eval: float | None
    base_eval: float | None
    checkpoint: Path | None
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Returns the closing figures as JSON-able values (what ``vapo-lab train`` prints)."""
        return {
            "run_id": self.run_id,
            "run_dir": str(self.run_dir),
            "steps": self.steps,
            "base_eval": self.base_eval,
            "final_eval": self.final_eval,
            "best_eval": self.best_eval,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
        }


class Trainer:
    """One training run: set up from ``cfg``, trained by ``train()``.

    Args:
        cfg: the composed, validated config (``resume=<run dir>`` continues that run).
        choices: the component choices (recorded as tags and in run.json).
        progress: the progress bar of a base-model build (see ``basemodel.build.build_base``); None: none.
        log: where one-line notices go.
        command: the command line recorded with the run (default: this process's).
        tags, parent_run_id: extra tracking tags; the tracking run to nest this one under.
    """

    def __init__(
        self,
        cfg: DictConfig,
        choices: dict[str, str] | None = None,
        progress: ProgressFactory | None = None,
        log: Callable[[str], None] = print,
        command: str = "",
        tags: dict[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> None:
        self.cfg, self.log = cfg, log
        self.device = prepare_process(cfg)
        self.world = world = init_world(cfg, self.device)
        resume_dir = folder_to_resume(cfg)
        seed_everything(cfg)
        self.task = task_for(cfg)
        policy, self.tokenizer, policy_key, policy_path = checked_policy(
            cfg, self.task, self.device, log, progress, world
        )
        self.sampling = make_sampling(cfg, policy, self.tokenizer, policy_path, self.task)
        self.scorer = RewardScorer(
            self.task,
            self.tokenizer,
            float(cfg.reward.correct),
            float(cfg.reward.wrong),
            cfg.reward.overlong,
        )
        pool = (
            cfg.trainer.prompt_pool
        )  # a small pool repeats its prompts (the group-sampling setting)
        self.data = DataStream(list(self.task.train)[:pool], int(cfg.seed))
        self.ref = self._reference(policy, policy_path) if cfg.kl.coef > 0 else None
        # rank 0 samples as a one-process run does; each other rank from its own stream
        self.gen_rollout = torch.Generator().manual_seed(rollout_seed(int(cfg.seed), world.rank))
        self.gen_update = torch.Generator().manual_seed(update_seed(int(cfg.seed)))
        self.critic = self.critic_opt = self.critic_sched = None
        self.step, self.best_eval, self.warned_lambda = 0, None, False

        # chosen before the tracking run is reopened: a refused checkpoint leaves the run's status as it was
        resume_from = self._checkpoint_to_resume(resume_dir, policy) if resume_dir else None
        self.record = self._record(choices, resume_dir, command, tags, parent_run_id)
        self.run_dir, self.run_id, self.tracker = (
            self.record.run_dir,
            self.record.run_id,
            self.record.tracker,
        )
        try:  # inside the tracking run: a failure is recorded there and in failure.txt
            self.record.open()
            t = cfg.trainer
            # every rank takes part (reward model, value pretraining)
            if cfg.algo.advantage == "gae":
                self.critic = init_critic(
                    cfg,
                    policy,
                    policy_key,
                    self.task,
                    self.sampling,
                    self.scorer,
                    self.device,
                    self.record.log_metrics,
                    log,
                    world,
                    self._shard,
                    policy_path,
                )
                self.critic_opt = adamw(self.critic.parameters(), float(t.critic_lr), t)
                self.critic_sched = warmup_constant(self.critic_opt, int(t.warmup_steps))
            self.policy = policy  # sharded after the critic's start, which copies the whole policy
            if world.initialized and not is_sharded(policy):
                # the built-in sampler keeps a full copy (rollout.replica)
                if self.sampling.engine is None:
                    self.sampling.engine = Replica(policy)
                    self.policy = copy.deepcopy(policy)
                self.policy = self._shard(self.policy)
                self.ref = self._shard(self.ref) if self.ref is not None else None
            self.actor_opt = adamw(self.policy.parameters(), float(t.actor_lr), t)
            self.actor_sched = warmup_constant(self.actor_opt, int(t.warmup_steps))
            self.updater = Updater(
                cfg,
                self.policy,
                self.critic,
                self.ref,
                self.actor_opt,
                self.critic_opt,
                self.gen_update,
                world,
            )
            self.checkpoints = self._checkpoint_manager()
            if resume_dir:
                self._resume(resume_from)
        except BaseException as e:
            self.record.close_on_error(e, self.step)
            raise

    # -- the run ---------------------------------------------------------------------------------

    def train(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
        """Returns the result of training from the current step to ``trainer.total_steps``, calling
        ``on_step(step, metrics)`` after each step (rank 0); the tracking run ends FINISHED, or
        FAILED / KILLED (with failure.txt) when a step raises.

        A stop asked by SIGTERM or Ctrl-C (``vapo_lab.stop``) is acted on at the safe points:
        before each step (the one before it logged and saved) and before each evaluation; the run
        ends as an interrupt does, and says in one line where it stopped and how to continue it."""
        t = self.cfg.trainer
        total, key = int(t.total_steps), self._eval_key()
        history: list[dict[str, Any]] = []
        base_eval = None
        checkpoint = None  # the one this call wrote last (no need to re-verify it at the end)
        try:
            if self.step == 0:
                stop_point(self.world)
                e = self.evaluate()
                base_eval = e[key]
                self.record.log_metrics(e, 0)
            while self.step < total:
                stop_point(self.world)
                metrics = self.train_step()
                if self.step % int(t.eval_every) == 0 or self.step == total:
                    stop_point(
                        self.world
                    )  # an evaluation can be long; the step is redone on resume
                    e = self.evaluate()
                    metrics.update(e)
                    self.best_eval = (
                        e[key] if self.best_eval is None else max(self.best_eval, e[key])
                    )
                self.record.log_metrics(metrics, self.step)
                history.append({"step": self.step, **metrics})
                if self.step % int(t.save_every) == 0 or self.step == total:
                    checkpoint = self.checkpoints.save(self.step)
                if on_step and self.world.main:
                    on_step(self.step, metrics)
        except BaseException as e:
            self.record.close_on_error(e, self.step)
            if isinstance(e, KeyboardInterrupt) and self.world.main:  # else the output just stops
                why = getattr(e, "reason", None) or str(e) or "interrupted"
                self.log(
                    f"stopped after step {self.step} of {total} ({why}): continue it with: "
                    f"vapo-lab train resume={self.run_dir}"
                )
            raise
        self.record.close("FINISHED", self.step)
        final = history[-1].get(key) if history else None
        return TrainResult(
            self.run_dir,
            self.run_id,
            self.step,
            final,
            self.best_eval,
            base_eval,
            checkpoint or latest_checkpoint(self.run_dir / CHECKPOINTS),
            history,
        )

    def train_step(self) -> dict[str, float]:
        """Runs the next step (``step`` + 1) and returns its metrics: collect and score rollouts,
        value them, compute advantages, update the critic, then the actor."""
        cfg, world, step = self.cfg, self.world, self.step + 1
        t0 = time.perf_counter()
        # trainer.offload_during_rollout; back before the first forward
        with self._on_host_for_rollout():
            batch, m = collect(cfg, self.sampling, self.data, self.scorer, self.gen_rollout, world)
        t_rollout = time.perf_counter()
        faults.point("rollout", step)
        if int(world.sum(len(batch.problems))) == 0:
            self.step = step
            return {**m, "rollout/empty_batch": 1.0}
        self._model_outputs(batch)
        engine = self.sampling.engine
        if hasattr(engine, "sleep"):  # vLLM: free its KV cache (and weights) for the update
            engine.sleep()
        compute_advantages(cfg, batch, world)
        t1 = time.perf_counter()
        if self.critic is not None:
            m.update(critic_metrics(batch, world))
            m.update(self.updater.critic_update(batch, self.step))
            self.critic_sched.step()
            m["critic/lr"] = self.critic_sched.get_last_lr()[0]
        t2 = time.perf_counter()
        faults.point("update", step)
        m.update(self.updater.actor_update(batch, self.step))
        self.actor_sched.step()
        if engine is not None:
            engine.push_weights(self.policy)
        times = StepTimes(t0, t_rollout, t1, t2, time.perf_counter())
        m.update(step_metrics(batch, world, self.actor_sched.get_last_lr()[0], times))
        self._warn_about_lambda(m)
        self.step = step
        return m

    def evaluate(self) -> dict[str, float]:
        """Returns the held-out avg@k after ``step`` steps (its sampling seed: ``seeds.heldout_seed``);
        on many ranks every rank samples its share of the problems and gets the whole result."""
        return evaluate(
            self.sampling.generate,
            self.tokenizer,
            self.task,
            self.scorer,
            self.cfg,
            heldout_seed(int(self.cfg.seed), self.step),
            self.world,
        )

    # -- Stateful --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state: step, best held-out score, data position, this rank's RNG streams."""
        return {
            "step": self.step,
            "best_eval": self.best_eval,
            "data": self.data.state(),
            "rng": rng_state(self._generators()),
            "world_size": self.world.size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state_dict()``'s; one saved on another number of ranks keeps the step, score,
        data position and update stream, and derives each rank's rollout stream afresh."""
        self.step, self.best_eval = int(state["step"]), state["best_eval"]
        self.data.load(state["data"])
        set_rng_state(state["rng"], self._generators())
        saved = int(state["world_size"])
        if saved != self.world.size:
            self.gen_rollout.manual_seed(
                rollout_reseed(int(self.cfg.seed), self.world.rank, self.step)
            )
            self.log(
                f"resuming a {saved}-rank checkpoint on {self.world.size} ranks: same weights and optimiser "
                "state, rollout RNG streams derived afresh (the history will not match an uninterrupted run)"
            )

    # -- set-up and step helpers -----------------------------------------------------------------

    def _generators(self) -> dict[str, torch.Generator]:
        """The run's own RNGs, by the names a checkpoint stores them under."""
        return {"rollout": self.gen_rollout, "update": self.gen_update}

    def _checkpoint_manager(self) -> CheckpointManager:
        models: dict[str, Any] = {"policy": self.policy}
        optimizers: dict[str, Any] = {"actor_opt": ("policy", self.actor_opt)}
        schedulers: dict[str, Any] = {"actor_sched": self.actor_sched}
        if self.critic is not None:
            models["critic"] = self.critic
            optimizers["critic_opt"] = ("critic", self.critic_opt)
            schedulers["critic_sched"] = self.critic_sched
        return CheckpointManager(
            self.run_dir / CHECKPOINTS,
            self.world,
            models,
            optimizers,
            schedulers,
            {"trainer": self},
            self.log,
        )

    def _resume(self, path: Path | None) -> None:
        """Continues from checkpoint ``path`` (``_checkpoint_to_resume``'s); None: the run stopped
        before its first checkpoint, so it starts again from step 0."""
        if path is None:
            self.log(
                f"no checkpoint in {self.run_dir} yet (it stopped before its first): starting from step 0"
            )
            return
        self.checkpoints.load(path)
        if self.sampling.engine is not None:
            self.sampling.engine.push_weights(self.policy)
        ranks = f" on {self.world.size} rank(s)" if self.world.initialized else ""
        self.log(f"resumed {self.run_dir} at step {self.step}{ranks}")

    def _checkpoint_to_resume(self, run_dir: Path, policy: torch.nn.Module) -> Path | None:
        """Returns the checkpoint of ``run_dir`` to continue from, checked against the run's models
        before any is built further (a critic has its policy's architecture, whatever critic.init;
        the policy's tensor shapes are checked too).

        Raises:
            CheckpointError: none is usable though the run wrote some, or it is another model's.
        """
        arch = architecture(policy)
        expected = {
            "policy": arch,
            **({"critic": arch} if self.cfg.algo.advantage == "gae" else {}),
        }
        return checkpoint_to_resume(
            run_dir / CHECKPOINTS,
            expected,
            self.log if self.world.main else None,
            shapes={"policy": tensor_shapes(policy)},
        )

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """Returns ``model`` sharded over the run's ranks with FSDP2, under its precision policy
        (float32 shards, computing in ``model.dtype``: :mod:`vapo_lab.models.precision`)."""
        return shard(model, self.world, self.device, fsdp_policy(model))

    def _reference(self, policy: torch.nn.Module, path: Path) -> torch.nn.Module:
        """Returns the frozen reference policy of a KL term: a copy of ``policy``, or where the policy
        was built sharded, another sharded build from its checkpoint (no rank holds a whole copy)."""
        if is_sharded(policy):
            from vapo_lab.models.sharded import load_sharded_causal_lm

            cfg = self.cfg
            ref = load_sharded_causal_lm(
                path, self.world, self.device, cfg.model.dtype, cfg.model.trust_remote_code
            )
        else:
            ref = copy.deepcopy(policy)
        return ref.eval().requires_grad_(False)

    def _record(
        self,
        choices: dict[str, str] | None,
        resume_dir: Any,
        command: str,
        tags: dict[str, str] | None,
        parent_run_id: str | None,
    ) -> RunRecord | RankRecord:
        """Rank 0's RunRecord; on the other ranks a RankRecord of the same folder and tracking run."""
        if self.world.main:
            record = RunRecord(
                self.cfg, choices or {}, resume_dir, command, tags, parent_run_id, self.log
            )
        shared = self.world.broadcast(
            (str(record.run_dir), record.run_id) if self.world.main else None
        )
        return record if self.world.main else RankRecord(Path(shared[0]), shared[1])

    def _eval_key(self) -> str:
        return f"eval/avg_at_{int(self.cfg.rollout.eval_samples)}"

    def _model_outputs(self, batch: Batch) -> None:
        """Fills in the batch what the models say of its rows before any update: the policy's
        log-probs (recomputed where the sampler's engine computes them differently: vLLM), the
        critic's values, the reference policy's log-probs."""
        temperature = float(self.cfg.rollout.temperature)
        micro = token_micro_batches(
            torch.arange(len(batch.problems)),
            batch.rows,
            int(self.cfg.trainer.max_tokens_per_micro_batch),
        )
        extra = int(self.world.max(len(micro))) - len(
            micro
        )  # a sharded model's ranks make equal passes
        engine = self.sampling.engine
        if engine is not None and getattr(engine, "recompute_logprobs", True):
            batch.old_logprobs = batched_logprobs(
                self.policy, batch.rows, micro, temperature, extra
            )
        if self.critic is not None:
            batch.values = batched_values(self.critic, batch.rows, micro, extra)
        if self.ref is not None:
            batch.ref_logprobs = batched_logprobs(self.ref, batch.rows, micro, temperature, extra)

    def _on_host_for_rollout(self) -> contextlib.AbstractContextManager[Any]:
        """Returns the context a step's rollout runs in: with ``trainer.offload_during_rollout``, the
        actor, critic and reference and their optimisers' state in host memory
        (:mod:`~vapo_lab.distributed.offload`), back on the device when it ends; else nothing."""
        if not self.cfg.trainer.get("offload_during_rollout", False):
            return contextlib.nullcontext()
        # the built-in sampler of one process generates with the policy itself: on an accelerator it
        # stays there (its optimiser state still goes); on CPU the host is the device, so it moves too
        samples_with_policy = self.sampling.engine is None and self.device.type != "cpu"
        return on_host(
            [None if samples_with_policy else self.policy, self.critic, self.ref],
            [self.actor_opt, self.critic_opt],
        )

    def _warn_about_lambda(self, m: dict[str, float]) -> None:
        """Warns once a run when most responses get λ_policy = 0 (length-adaptive GAE with too small an α)."""
        zero = m.get("gae/lam_policy_zero_frac", 0.0)
        if zero > 0.5 and not self.warned_lambda:
            self.warned_lambda = True
            alpha = self.cfg.gae.alpha
            self.log(
                f"warning: {100 * zero:.0f}% of responses get lambda_policy = 0 (one-step TD) at "
                f"gae.alpha={alpha}: responses shorter than 1/alpha = {1 / alpha:.0f} tokens. Raise "
                "gae.alpha to scale it to these lengths."
            )


def train(
    cfg: DictConfig,
    choices: dict[str, str] | None = None,
    progress: ProgressFactory | None = None,
    log: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    command: str = "",
) -> TrainResult:
    """Returns the result of training with ``cfg`` (a composed, validated config)."""
    return Trainer(cfg, choices, progress=progress, log=log, command=command).train(on_step)
