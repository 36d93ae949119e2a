"""One training run: its models, optimisers, data and record, set up from the pieces of
:mod:`vapo_lab.trainer.setup`; ``Run.run`` runs :func:`vapo_lab.trainer.loop.train_loop`.

``train(cfg)`` is what ``vapo-lab train`` and every launcher call. A run lives in
``<output_dir>/<run name>/`` (:mod:`vapo_lab.trainer.record`) with its ``checkpoints/``
(:mod:`vapo_lab.trainer.checkpoints`). ``resume=<run dir>`` continues from its latest checkpoint
with the same RNG states and data position, so it logs the same metrics an uninterrupted run would.

``trainer.strategy=fsdp``: this process is one rank of the run (:mod:`vapo_lab.distributed`). Rank 0 builds
the shared caches (base model, reward model, pretrained critic) first, the others then load them;
the actor, critic and reference are sharded with FSDP2; rank 0 alone opens the run's folder and
tracking run, the others learn both from it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from vapo_lab.basemodel.build import ProgressFactory
from vapo_lab.distributed.fsdp import shard
from vapo_lab.distributed.world import init_world
from vapo_lab.models.dtypes import DTYPES
from vapo_lab.rollout.replica import Replica
from vapo_lab.trainer.checkpoints import resume_run
from vapo_lab.trainer.collect import DataStream
from vapo_lab.trainer.loop import TrainResult, train_loop, train_step
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


class Run:
    """Everything one training run holds.

    Args:
        cfg: the composed, validated config (``resume=<run dir>`` continues that run).
        choices: the component choices (recorded as tags and in run.json).
        progress: the progress bar of a base-model build (see ``basemodel.build.build_base``); None: none.
        log: where one-line notices go.
        command: the command line recorded with the run (default: this process's).
        tags, parent_run_id: extra tracking tags; the tracking run to nest this one under.
    """

    def __init__(self, cfg: DictConfig, choices: dict[str, str] | None = None,
                 progress: ProgressFactory | None = None, log: Callable[[str], None] = print, command: str = "",
                 tags: dict[str, str] | None = None, parent_run_id: str | None = None) -> None:
        self.cfg, self.log = cfg, log
        self.device = prepare_process(cfg)
        self.world = world = init_world(cfg, self.device)
        resume_dir = folder_to_resume(cfg)
        seed_everything(cfg)
        self.task = task_for(cfg)
        with world.main_first():  # rank 0 builds the base model on first use, the others load it
            policy, self.tokenizer, policy_key, policy_path = checked_policy(cfg, self.task, self.device, log,
                                                                             progress)
        self.sampling = make_sampling(cfg, policy, self.tokenizer, policy_path)
        self.scorer = RewardScorer(self.task, self.tokenizer, float(cfg.reward.correct), float(cfg.reward.wrong),
                                   cfg.reward.overlong)
        self.data = DataStream(self.task.train, int(cfg.seed))
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if cfg.kl.coef > 0 else None
        self.policy = policy
        if world.initialized:
            if self.sampling.engine is None:  # the built-in sampler keeps a full copy (rollout.replica)
                self.sampling.engine = Replica(policy)
                self.policy = copy.deepcopy(policy)
            self.policy = self._shard(self.policy)
            self.ref = self._shard(self.ref) if self.ref is not None else None
        # rank 0 samples as a one-process run does; each other rank from its own stream
        self.gen_rollout = torch.Generator().manual_seed(int(cfg.seed) + 1_000_003 * world.rank)
        self.gen_update = torch.Generator().manual_seed(int(cfg.seed) + 7)
        t = cfg.trainer
        self.actor_opt = adamw(self.policy.parameters(), float(t.actor_lr), t)
        self.actor_sched = warmup_constant(self.actor_opt, int(t.warmup_steps))
        self.critic = self.critic_opt = self.critic_sched = None
        self.step, self.best_eval, self.warned_lambda = 0, None, False

        self.record = self._record(choices, resume_dir, command, tags, parent_run_id)
        self.run_dir, self.run_id, self.tracker = self.record.run_dir, self.record.run_id, self.record.tracker
        try:  # inside the tracking run: a failure is recorded there and in failure.txt
            self.record.open()
            if cfg.algo.advantage == "gae":
                with world.main_first():  # the reward model and value pretraining: cached by rank 0
                    critic = init_critic(cfg, policy, policy_key, self.task, self.sampling, self.scorer,
                                         self.device, self.record.log_metrics, log)
                self.critic = self._shard(critic) if world.initialized else critic
                self.critic_opt = adamw(self.critic.parameters(), float(t.critic_lr), t)
                self.critic_sched = warmup_constant(self.critic_opt, int(t.warmup_steps))
            self.updater = Updater(cfg, self.policy, self.critic, self.ref, self.actor_opt, self.critic_opt,
                                   self.gen_update, world)
            if resume_dir:
                resume_run(self)
        except BaseException as e:
            self.record.close_on_error(e, self.step)
            raise

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """Returns ``model`` sharded over the run's ranks with FSDP2: fp32 shards (master weights), and
        on CUDA a bf16/fp16 ``model.dtype`` as the compute dtype."""
        compute = DTYPES[self.cfg.model.dtype] if self.device.type == "cuda" else None
        if compute == torch.float32:
            compute = None
        return shard(model.float() if compute is not None else model, self.world, self.device, compute)

    def _record(self, choices: dict[str, str] | None, resume_dir: Any, command: str, tags: dict[str, str] | None,
                parent_run_id: str | None) -> RunRecord | RankRecord:
        """Rank 0's RunRecord; on the other ranks a RankRecord of the same folder and tracking run."""
        if self.world.main:
            record = RunRecord(self.cfg, choices or {}, resume_dir, command, tags, parent_run_id, self.log)
        shared = self.world.broadcast((str(record.run_dir), record.run_id) if self.world.main else None)
        return record if self.world.main else RankRecord(Path(shared[0]), shared[1])

    def run(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
        """Trains to ``trainer.total_steps``; see :func:`vapo_lab.trainer.loop.train_loop`."""
        return train_loop(self, on_step)

    def train_step(self) -> dict[str, float]:
        """Returns the metrics of one step (``step`` is not advanced); see :func:`vapo_lab.trainer.loop.train_step`."""
        return train_step(self)


def train(cfg: DictConfig, choices: dict[str, str] | None = None, progress: ProgressFactory | None = None,
          log: Callable[[str], None] = print, on_step: Callable[[int, dict[str, float]], None] | None = None,
          command: str = "") -> TrainResult:
    """Returns the result of training with ``cfg`` (a composed, validated config)."""
    return Run(cfg, choices, progress=progress, log=log, command=command).run(on_step)
