"""One training run: its models, optimisers, data and record, set up from the pieces of
:mod:`vapo_lab.trainer.setup`; ``Run.run`` runs :func:`vapo_lab.trainer.loop.train_loop`.

``train(cfg)`` is what ``vapo-lab train`` and every launcher call. A run lives in
``<output_dir>/<run name>/`` (:mod:`vapo_lab.trainer.record`) with its ``checkpoints/``
(:mod:`vapo_lab.trainer.checkpoints`). ``resume=<run dir>`` continues from its latest checkpoint
with the same RNG states and data position, so it logs the same metrics an uninterrupted run would.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from omegaconf import DictConfig

from vapo_lab.basemodel.build import ProgressFactory
from vapo_lab.trainer.checkpoints import resume_run
from vapo_lab.trainer.collect import DataStream
from vapo_lab.trainer.loop import TrainResult, train_loop, train_step
from vapo_lab.trainer.record import RunRecord, folder_to_resume
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
        resume_dir = folder_to_resume(cfg)
        seed_everything(cfg)
        self.task = task_for(cfg)
        self.policy, self.tokenizer, policy_key, policy_path = checked_policy(cfg, self.task, self.device, log,
                                                                              progress)
        self.sampling = make_sampling(cfg, self.policy, self.tokenizer, policy_path)
        self.scorer = RewardScorer(self.task, self.tokenizer, float(cfg.reward.correct), float(cfg.reward.wrong),
                                   cfg.reward.overlong)
        self.data = DataStream(self.task.train, int(cfg.seed))
        self.ref = copy.deepcopy(self.policy).eval().requires_grad_(False) if cfg.kl.coef > 0 else None
        self.gen_rollout = torch.Generator().manual_seed(int(cfg.seed))
        self.gen_update = torch.Generator().manual_seed(int(cfg.seed) + 7)
        t = cfg.trainer
        self.actor_opt = adamw(self.policy.parameters(), float(t.actor_lr), t)
        self.actor_sched = warmup_constant(self.actor_opt, int(t.warmup_steps))
        self.critic = self.critic_opt = self.critic_sched = None
        self.step, self.best_eval, self.warned_lambda = 0, None, False

        self.record = RunRecord(cfg, choices or {}, resume_dir, command, tags, parent_run_id, log)
        self.run_dir, self.run_id, self.tracker = self.record.run_dir, self.record.run_id, self.record.tracker
        try:  # inside the tracking run: a failure is recorded there and in failure.txt
            self.record.open()
            if cfg.algo.advantage == "gae":
                self.critic = init_critic(cfg, self.policy, policy_key, self.task, self.sampling, self.scorer,
                                          self.device, self.record.log_metrics, log)
                self.critic_opt = adamw(self.critic.parameters(), float(t.critic_lr), t)
                self.critic_sched = warmup_constant(self.critic_opt, int(t.warmup_steps))
            self.updater = Updater(cfg, self.policy, self.critic, self.ref, self.actor_opt, self.critic_opt,
                                   self.gen_update)
            if resume_dir:
                resume_run(self)
        except BaseException as e:
            self.record.close_on_error(e, self.step)
            raise

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
