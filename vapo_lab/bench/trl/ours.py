"""Our side of the benchmark: vapo-lab's trainer on the benchmark's work, as a worker process.

Runs in the main env only (the TRL envs have no Hydra, no vapo-lab trainer). The worker entry
point opens the :class:`~vapo_lab.bench.trl.protocol.Channel` before importing this module, so
that nothing printed while torch and the trainer load can reach the pipe.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vapo_lab.bench.trl.protocol import Channel, Gate
from vapo_lab.bench.trl.spec import BenchSpec
from vapo_lab.config.compose import Composed, compose_config
from vapo_lab.trainer.trainer import Trainer


def our_overrides(
    algo: str, model_dir: str | Path, spec: BenchSpec, output_dir: str | Path
) -> list[str]:
    """Returns the Hydra overrides that give the trainer the benchmark's work for ``algo``.

    The algorithm's own preset is kept (``--algo ppo|vapo|grpo``) with these changes: the model is
    the benchmark's checkpoint, the critic starts from the policy (TRL's value model does too) with
    no value pretraining (a one-off phase before step 1, not part of a step), no tracking, and
    PPO gets TRL PPOTrainer's default KL penalty in the reward (k1, 0.05), so that both run a
    reference model.
    """
    out = [
        "model=hf",
        f"model.path={model_dir}",
        "model.dtype=float32",
        "model.chat_template=none",
        "trainer.device=cpu",
        f"trainer.threads={spec.threads}",
        f"seed={spec.seed}",
        f"task.seed={spec.seed}",
        f"task.n_train={spec.n_problems}",
        "task.n_eval=8",
        f"task.options.min_digits={spec.digits}",
        f"task.options.max_digits={spec.digits}",
        "task.options.length_exponent=0.0",
        f"rollout.responses_per_step={spec.completions}",
        f"rollout.max_new_tokens={spec.max_new_tokens}",
        f"rollout.group_size={spec.group_size}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        f"trainer.ppo_epochs={spec.epochs}",
        f"trainer.mini_batch_size={spec.mini_batch_size}",
        "trainer.max_tokens_per_micro_batch=1000000000",
        f"trainer.actor_lr={spec.lr}",
        f"trainer.critic_lr={2 * spec.lr}",
        "trainer.warmup_steps=0",
        "tracking=none",
        f"output_dir={output_dir}",
        "critic.init=policy",
        "reward.overlong.l_cache=8",
    ]
    if algo == "vapo":
        out.append("value_pretraining=off")
    if algo == "ppo":
        out += [f"kl.coef={spec.kl_coef}", "kl.estimator=k1", "kl.target=reward"]
    if algo == "grpo":
        out += [f"kl.coef={spec.grpo_beta}", "kl.estimator=k3", "kl.target=loss"]
    return out


def bench_config(
    algo: str, model_dir: str | Path, spec: BenchSpec, output_dir: str | Path
) -> Composed:
    """Returns the composed config (``Composed``) of our side of the benchmark.

    Composed without the whole-config check: the benchmark's untrained policy writes at most
    ``spec.max_new_tokens`` (32) tokens while a correct 10-digit arith response needs 33, which that
    check refuses for training. The benchmark times a step's work, not learning, and TRL gets the
    very same cap.
    """
    return compose_config(
        algo=algo, overrides=our_overrides(algo, model_dir, spec, output_dir), check=False
    )


class OurWorker:
    """vapo-lab's trainer on the benchmark's work: ``step()`` is one ``Trainer.train_step``."""

    def __init__(
        self, algo: str, model_dir: str | Path, spec: BenchSpec, output_dir: str | Path
    ) -> None:
        composed = bench_config(algo, model_dir, spec, output_dir)
        self.trainer = Trainer(
            composed.cfg,
            composed.choices,
            progress=None,
            log=lambda text: print(text, file=sys.stderr),
            command="vapo-lab bench trl",
        )
        self.info = {
            "side": "vapo-lab",
            "algo": algo,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "policy_params": sum(p.numel() for p in self.trainer.policy.parameters()),
            "n_samples": int(composed.cfg.rollout.n_samples),
            "reference_model": self.trainer.ref is not None,
        }

    def step(self) -> int:
        """Runs one trainer step; returns the tokens it generated (eos included)."""
        metrics = self.trainer.train_step()
        return round(metrics["rollout/response_length"] * metrics["rollout/responses"])


def serve_ours(channel: Channel, algo: str, model_dir: str, spec: BenchSpec, workdir: str) -> None:
    """Worker loop of our side: trainer steps, timed by the gate, for as long as the driver asks."""
    worker = OurWorker(algo, model_dir, spec, workdir)
    gate = Gate(channel, worker.info)
    gate.begin()
    while True:
        gate.end(worker.step())
