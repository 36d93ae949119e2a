"""The trainer: one training run of VAPO, vanilla PPO, DAPO or GRPO, on one rank or many.

``Trainer(cfg)`` builds the run (the config typed once here, its parts, folder and tracking run);
``start()`` brings the critic from the shared caches (built on first use), shards the models,
makes the optimisers and, resuming, loads the checkpoint; ``train()`` runs the steps, with the
held-out avg@k before the first and every ``trainer.eval_every``; ``train_step()`` is one step's
phases (:mod:`~vapo_lab.trainer.phases`); ``close()`` leaves the ranks. ``running`` does all of
it for ``vapo-lab train``, grid cells and ranks.

The departures from textbook PPO are config keys, listed with the components in
docs/training.md#the-seven-components-as-config; no component logic is written here.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from vapo_lab import faults
from vapo_lab.basemodel.build import ProgressFactory
from vapo_lab.config.schema import VapoConfig, typed
from vapo_lab.distributed.fsdp import is_sharded, shard
from vapo_lab.distributed.world import close_world
from vapo_lab.models.precision import fsdp_policy
from vapo_lab.rollout.replica import Replica
from vapo_lab.runs.checkpoint import latest_checkpoint, rng_state, set_rng_state
from vapo_lab.runs.folder import CHECKPOINTS
from vapo_lab.seeds import heldout_seed, rollout_reseed, rollout_seed, update_seed
from vapo_lab.stop import AttemptClock, StopRequested, stop_point
from vapo_lab.trainer.advantages import compute_advantages
from vapo_lab.trainer.caches import start_critic
from vapo_lab.trainer.checkpointer import (
    CheckpointManager,
    architecture,
    checkpoint_to_resume,
    tensor_shapes,
)
from vapo_lab.trainer.collect import DataStream
from vapo_lab.trainer.evaluation import evaluate
from vapo_lab.trainer.metrics import (
    StepTimes,
    critic_metrics,
    stage_rates,
    stage_summary,
    step_metrics,
)
from vapo_lab.trainer.phases import Phases
from vapo_lab.trainer.record import RankRecord, RunRecord, folder_to_resume
from vapo_lab.trainer.setup import build_parts
from vapo_lab.trainer.update import ActorUpdate, CriticUpdate, Descent, adamw, warmup_constant


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
            "stages": stage_summary(self.metrics),
        }


class Trainer:
    """One training run: built from ``cfg``, started by ``start()``, trained by ``train()``.

    Args:
        cfg: the composed, validated config, or its typed form (``resume=<run dir>`` continues
            that run).
        choices: the component choices (recorded as tags and in run.json).
        progress: the progress bar of a base-model build; None: none.
        log: where one-line notices go.
        command: the command line recorded with the run (default: this process's).
        tags, parent_run_id: extra tracking tags; the tracking run to nest this one under.
    """

    def __init__(
        self,
        cfg: DictConfig | VapoConfig,
        choices: dict[str, str] | None = None,
        progress: ProgressFactory | None = None,
        log: Callable[[str], None] = print,
        command: str = "",
        tags: dict[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> None:
        self.config = config = typed(cfg)
        self.log = log
        resume_dir = folder_to_resume(config.resume)
        self.parts = parts = build_parts(config, log, progress)
        self.world, self.device, self.task = parts.world, parts.device, parts.task
        self.tokenizer, self.sampling = parts.tokenizer, parts.sampling
        self.policy = parts.policy
        # a small pool repeats its prompts (the group-sampling setting)
        self.data = DataStream(list(self.task.train)[: config.trainer.prompt_pool], config.seed)
        self.ref = self._reference() if config.kl.coef > 0 else None
        # rank 0 samples as a one-process run does; each other rank from its own stream
        self.gen_rollout = torch.Generator().manual_seed(rollout_seed(config.seed, self.world.rank))
        self.gen_update = torch.Generator().manual_seed(update_seed(config.seed))
        self.phases = Phases(parts, config.trainer, config.rollout.temperature)
        self.critic = self.critic_opt = self.critic_sched = None
        self.step, self.best_eval, self.warned_lambda = 0, None, False
        self.clock = AttemptClock()  # this attempt's step, evaluation and save times
        self.started = self.closed = False
        # chosen before the tracking run is reopened: a refused checkpoint leaves its status as it
        # was
        self.resume_dir = resume_dir
        self.resume_from = self._checkpoint_to_resume(resume_dir) if resume_dir else None
        self.record = self._record(choices, resume_dir, command, tags, parent_run_id)
        self.run_dir, self.run_id = self.record.run_dir, self.record.run_id
        self.tracker = self.record.tracker
        try:  # inside the tracking run: a failure is recorded there and in failure.txt
            self.record.open()
        except BaseException as e:
            self.record.close_on_error(e, self.step)
            raise

    def start(self) -> None:
        """Brings the critic from the shared caches (building them on first use: every rank takes
        part), shards the models, makes the optimisers and, resuming, loads the checkpoint."""
        if self.started:
            return
        config, world = self.config, self.world
        t = config.trainer
        try:
            if config.algo.advantage == "gae":
                self.critic = start_critic(
                    config, self.parts, self.record.log_metrics, self.log, self.clock
                )
                self.critic_opt = adamw(self.critic.parameters(), t.critic_lr, t)
                self.critic_sched = warmup_constant(self.critic_opt, t.warmup_steps)
            # sharded after the critic's start, which copies the whole policy
            if world.initialized and not is_sharded(self.policy):
                if self.sampling.engine is None:  # the built-in sampler keeps a whole copy
                    self.sampling.engine = Replica(self.policy)
                    self.policy = copy.deepcopy(self.policy)
                self.policy = self._shard(self.policy)
                self.ref = self._shard(self.ref) if self.ref is not None else None
            self.actor_opt = adamw(self.policy.parameters(), t.actor_lr, t)
            self.actor_sched = warmup_constant(self.actor_opt, t.warmup_steps)
            descent = Descent(t, self.gen_update, world)
            self.critic_update = None
            if self.critic is not None:
                self.critic_update = CriticUpdate(
                    descent, config.critic, self.critic, self.critic_opt
                )
            self.actor_update = ActorUpdate(
                descent,
                config.loss,
                config.kl,
                config.rollout.temperature,
                self.policy,
                self.actor_opt,
                self.ref,
            )
            self.stage_rates = stage_rates(
                self.parts.policy, self.critic is not None, t.ppo_epochs, config.model.dtype
            )
            self.checkpoints = self._checkpoint_manager()
            if self.resume_dir:
                self._resume(self.resume_from)
        except BaseException as e:
            self.record.close_on_error(e, self.step)
            raise
        self.started = True

    def close(self) -> None:
        """Leaves the process group of the run's ranks (once; nothing to leave on one process)."""
        if not self.closed:
            self.closed = True
            close_world(self.world)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the run ---------------------------------------------------------------------------------

    def train(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
        """Returns the result of training from the current step to ``trainer.total_steps``, calling
        ``on_step(step, metrics)`` after each step (rank 0); the tracking run ends FINISHED, or
        FAILED / KILLED (with failure.txt) when a step raises.

        A stop asked by SIGTERM or Ctrl-C (``vapo_lab.stop``) is acted on at the safe points:
        before each step and before each evaluation; the run says in one line where it stopped and
        how to continue it."""
        self.start()
        t = self.config.trainer
        total, key = t.total_steps, self._eval_key()
        history: list[dict[str, Any]] = []
        base_eval = None
        checkpoint = None  # the one this call wrote last (no need to re-verify it at the end)
        # a resumed run has its step's checkpoint; a save-and-stop waits for a step of this call's
        started = saved = self.step
        logged = self.step  # the last step whose metrics were logged: what a stop reports done
        clock = self.clock
        try:
            if self.step == 0:
                stop_point(self.world, can_save=False)
                e = self.evaluate()
                base_eval = e[key]
                self.record.log_metrics(e, 0)
            while self.step < total:
                # the next step, its evaluation if it has one and a save must fit the job's time
                need = clock.need("step", *(["eval"] if self._evaluates(self.step + 1) else []))
                try:
                    stop_point(self.world, can_save=self.step > started, need_s=need)
                except StopRequested as stop:
                    if stop.save and saved != self.step:  # Slurm's time limit is near: keep it
                        with clock.timing("save"):
                            checkpoint, saved = self.checkpoints.save(self.step), self.step
                    raise
                with clock.timing("step"):
                    metrics = self.train_step()
                if self._evaluates(self.step):
                    # an evaluation can be long; the step is redone on resume
                    stop_point(self.world, can_save=False)
                    with clock.timing("eval"):
                        e = self.evaluate()
                    metrics.update(e)
                    best = self.best_eval
                    self.best_eval = e[key] if best is None else max(best, e[key])
                self.record.log_metrics(metrics, self.step)
                logged = self.step
                history.append({"step": self.step, **metrics})
                if self.step % t.save_every == 0 or self.step == total:
                    with clock.timing("save"):
                        checkpoint, saved = self.checkpoints.save(self.step), self.step
                if on_step and self.world.main:
                    on_step(self.step, metrics)
        except BaseException as e:
            self.record.close_on_error(e, self.step)
            if isinstance(e, KeyboardInterrupt) and self.world.main:  # else the output just stops
                why = getattr(e, "reason", None) or str(e) or "interrupted"
                self.log(
                    f"stopped after step {logged} of {total} ({why}): continue it with: "
                    f"vapo-lab train resume={self.run_dir}"
                )
            raise
        self.record.close("FINISHED", self.step)
        final = history[-1].get(key) if history else None
        checkpoint = checkpoint or latest_checkpoint(self.run_dir / CHECKPOINTS)
        return TrainResult(
            self.run_dir,
            self.run_id,
            self.step,
            final,
            self.best_eval,
            base_eval,
            checkpoint,
            history,
        )

    def train_step(self) -> dict[str, float]:
        """Runs the next step (``step`` + 1) and returns its metrics: collect and score rollouts,
        value them, compute advantages, update the critic, then the actor."""
        self.start()
        config, world, step, phases = self.config, self.world, self.step + 1, self.phases
        t0 = time.perf_counter()
        batch, m = phases.rollout(
            config.rollout,
            config.algo.dynamic_sampling,
            self.data,
            self.gen_rollout,
            self.policy,
            [self.critic, self.ref],
            [self.actor_opt, self.critic_opt],
        )
        t_rollout = time.perf_counter()
        faults.point("rollout", step)
        if int(world.sum(len(batch.problems))) == 0:
            phases.push(self.policy)  # the engine slept after sampling
            self.step = step
            return {**m, "rollout/empty_batch": 1.0}
        phases.model_outputs(batch, self.policy, self.critic, self.ref)
        t_outputs = time.perf_counter()
        n = config.rollout.n_samples
        compute_advantages(config.algo, config.gae, config.kl, n, batch, world)
        t1 = time.perf_counter()
        if self.critic_update is not None:
            m.update(critic_metrics(batch, world))
            m.update(self.critic_update(batch, self.step))
            self.critic_sched.step()
            m["critic/lr"] = self.critic_sched.get_last_lr()[0]
        t2 = time.perf_counter()
        faults.point("update", step)
        m.update(self.actor_update(batch, self.step))
        self.actor_sched.step()
        t3 = time.perf_counter()
        phases.push(self.policy)
        times = StepTimes(t0, t_rollout, t_outputs, t1, t2, t3, time.perf_counter())
        lr = self.actor_sched.get_last_lr()[0]
        m.update(step_metrics(batch, world, lr, times, self.stage_rates))
        self._warn_about_lambda(m)
        self.step = step
        return m

    def evaluate(self) -> dict[str, float]:
        """Returns the held-out avg@k after ``step`` steps (its sampling seed:
        ``seeds.heldout_seed``); on many ranks each samples its share and all get the result."""
        c = self.config
        return evaluate(
            self.sampling.generate,
            self.tokenizer,
            self.task,
            self.parts.scorer,
            c.rollout,
            c.model.chat_template,
            heldout_seed(c.seed, self.step),
            self.world,
        )

    # -- Stateful --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The trainer's own state: step, best held-out score, data position, this rank's RNGs."""
        return {
            "step": self.step,
            "best_eval": self.best_eval,
            "data": self.data.state(),
            "rng": rng_state(self._generators()),
            "world_size": self.world.size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state_dict()``'s; one saved on another number of ranks keeps the step,
        score, data position and update stream, and derives each rank's rollout stream afresh."""
        self.step, self.best_eval = int(state["step"]), state["best_eval"]
        self.data.load(state["data"])
        set_rng_state(state["rng"], self._generators())
        saved = int(state["world_size"])
        if saved != self.world.size:
            reseed = rollout_reseed(self.config.seed, self.world.rank, self.step)
            self.gen_rollout.manual_seed(reseed)
            self.log(
                f"resuming a {saved}-rank checkpoint on {self.world.size} ranks: same weights and "
                "optimiser state, rollout RNG streams derived afresh (the history will not match "
                "an uninterrupted run)"
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
        """Continues from checkpoint ``path``; None: the run stopped before its first checkpoint,
        so it starts again from step 0."""
        if path is None:
            self.log(
                f"no checkpoint in {self.run_dir} yet (it stopped before its first): "
                "starting from step 0"
            )
            return
        # until this attempt saves, reading the checkpoint stands in for writing one (same bytes)
        with self.clock.timing("save"):
            self.checkpoints.load(path)
        self.phases.push(self.policy)
        ranks = f" on {self.world.size} rank(s)" if self.world.initialized else ""
        self.log(f"resumed {self.run_dir} at step {self.step}{ranks}")

    def _checkpoint_to_resume(self, run_dir: Path) -> Path | None:
        """Returns the checkpoint of ``run_dir`` to continue from, checked against the run's models
        before any is built further (a critic has its policy's architecture, whatever critic.init).

        Raises:
            CheckpointError: none is usable though the run wrote some, or it is another model's.
        """
        arch = architecture(self.policy)
        expected = {"policy": arch}
        if self.config.algo.advantage == "gae":
            expected["critic"] = arch
        return checkpoint_to_resume(
            run_dir / CHECKPOINTS,
            expected,
            self.log if self.world.main else None,
            shapes={"policy": tensor_shapes(self.policy)},
        )

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """Returns ``model`` sharded over the run's ranks with FSDP2, under its precision policy."""
        return shard(model, self.world, self.device, fsdp_policy(model))

    def _reference(self) -> torch.nn.Module:
        """Returns the frozen reference policy of a KL term: a copy of the policy, or where the
        policy was built sharded, another sharded build from its checkpoint."""
        if is_sharded(self.policy):
            from vapo_lab.models.sharded import load_sharded_causal_lm

            m = self.config.model
            path = self.parts.policy_path
            ref = load_sharded_causal_lm(
                path, self.world, self.device, m.dtype, m.trust_remote_code
            )
        else:
            ref = copy.deepcopy(self.policy)
        return ref.eval().requires_grad_(False)

    def _record(
        self,
        choices: dict[str, str] | None,
        resume_dir: Path | None,
        command: str,
        tags: dict[str, str] | None,
        parent_run_id: str | None,
    ) -> RunRecord | RankRecord:
        """Rank 0's RunRecord; on the other ranks a RankRecord of the same folder and tracking
        run."""
        if self.world.main:
            record = RunRecord(
                self.config, choices or {}, resume_dir, command, tags, parent_run_id, self.log
            )
        main = self.world.main
        shared = self.world.broadcast((str(record.run_dir), record.run_id) if main else None)
        return record if main else RankRecord(Path(shared[0]), shared[1])

    def _evaluates(self, step: int) -> bool:
        """Returns whether step ``step`` ends with a held-out evaluation."""
        t = self.config.trainer
        return step % t.eval_every == 0 or step == t.total_steps

    def _eval_key(self) -> str:
        return f"eval/avg_at_{self.config.rollout.eval_samples}"

    def _warn_about_lambda(self, m: dict[str, float]) -> None:
        """Warns once a run when most responses get λ_policy = 0 (length-adaptive GAE with too
        small an α)."""
        zero = m.get("gae/lam_policy_zero_frac", 0.0)
        if zero > 0.5 and not self.warned_lambda:
            self.warned_lambda = True
            alpha = self.config.gae.alpha
            self.log(
                f"warning: {100 * zero:.0f}% of responses get lambda_policy = 0 (one-step TD) at "
                f"gae.alpha={alpha}: responses shorter than 1/alpha = {1 / alpha:.0f} tokens. "
                "Raise gae.alpha to scale it to these lengths."
            )


@contextmanager
def running(
    cfg: DictConfig | VapoConfig, choices: dict[str, str] | None = None, **kw: Any
) -> Iterator[Trainer]:
    """Yields a started ``Trainer(cfg, choices, **kw)`` and closes it on the way out: how
    ``vapo-lab train``, grid cells and ranks run one."""
    trainer = Trainer(cfg, choices, **kw)
    try:
        trainer.start()
        yield trainer
    finally:
        trainer.close()


def train(
    cfg: DictConfig | VapoConfig,
    choices: dict[str, str] | None = None,
    progress: ProgressFactory | None = None,
    log: Callable[[str], None] = print,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    command: str = "",
) -> TrainResult:
    """Returns the result of training with ``cfg`` (a composed, validated config)."""
    with running(cfg, choices, progress=progress, log=log, command=command) as trainer:
        return trainer.train(on_step)
