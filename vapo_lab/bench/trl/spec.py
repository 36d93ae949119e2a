"""The work of one benchmark step, the same on every side: its settings and its task.

The TRL workers import this module in envs without vapo-lab's dependencies: it imports only the
standard library, vapo-lab's errors and the arith task (standard library only).
"""

from __future__ import annotations

from dataclasses import dataclass

from vapo_lab.errors import VapoLabError
from vapo_lab.tasks.arith import ArithTask


class TrlBenchError(VapoLabError):
    """A TRL env is missing or a benchmark worker failed; the message is one line with the fix."""


@dataclass(frozen=True)
class BenchSpec:
    """The work of one step, the same on every side.

    Attributes:
        completions: responses per step (B).
        max_new_tokens: response length cap; generation also stops at end-of-sequence.
        group_size: samples per prompt for VAPO and GRPO (G); PPO samples each prompt once.
        mini_batch_size: responses per optimiser step (4 optimiser steps per epoch at B = 64).
        epochs: PPO epochs over each step's responses.
        threads: torch intra-op threads of every worker.
        digits: digits of each number in the arith prompts (a prompt is 2·digits + 2 tokens).
        n_problems: size of the training split the prompts are drawn from.
        seed: model init, task split, sampling and shuffling seed.
        kl_coef: TRL PPOTrainer's default KL penalty in the reward (k1), also given to our PPO.
        grpo_beta: GRPO's KL coefficient in the loss (k3), vapo-lab's preset value, given to TRL.
        lr: actor learning rate (1e-4, the CPU preset's); the value model uses 2e-4 on our side.
    """

    completions: int = 64
    max_new_tokens: int = 32
    group_size: int = 8
    mini_batch_size: int = 16
    epochs: int = 1
    threads: int = 2
    digits: int = 10
    n_problems: int = 1024
    seed: int = 0
    kl_coef: float = 0.05
    grpo_beta: float = 0.04
    lr: float = 1e-4


def bench_task(spec: BenchSpec) -> ArithTask:
    """Returns the arith task whose train split every side draws its prompts from."""
    return ArithTask(
        seed=spec.seed,
        n_train=spec.n_problems,
        n_eval=8,
        min_digits=spec.digits,
        max_digits=spec.digits,
        length_exponent=0.0,
    )
