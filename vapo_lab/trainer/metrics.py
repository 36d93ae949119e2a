"""A training step's metrics: one function for one rank and many.

Every statistic is taken over the step's whole batch, all ranks together, through the reductions
of :class:`~vapo_lab.distributed.world.World` (identities on one process, so a one-process run
computes exactly the statistic of its own batch). Per-response tensors are small and gathered;
token-level statistics are reduced as sums (means and variances in two passes, so one process
computes them as ``algo.masked_mean`` / ``algo.masked_var`` do).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import torch
from torch import Tensor

from vapo_lab.algo import masked_sum
from vapo_lab.distributed.world import World
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.diagnostics import (
    advantage_gap_from_sums,
    advantage_gap_sums,
    length_profile,
    value_bias_from_sums,
    value_bias_sums,
)


@dataclass(frozen=True)
class StepTimes:
    """``perf_counter`` readings of one step: its start, and after the rollout, the critic's update
    (and before it) and the actor's."""

    start: float
    rollout: float
    critic_start: float
    critic_end: float
    actor_end: float


def step_metrics(batch: Batch, world: World, actor_lr: float, times: StepTimes) -> dict[str, float]:
    """Returns the step's rollout, advantage, timing and diagnostic metrics over all ranks'
    batches."""
    mask = batch.rows.response_mask
    gathered = world.gather((batch.scores, batch.correct, batch.lengths, batch.truncated))
    scores, correct, lengths, truncated = (torch.cat([g[i] for g in gathered]) for i in range(4))
    n_tokens = float(world.sum(float(mask.sum())))
    rollout_s = times.rollout - times.start
    m = {
        "rollout/reward": float(scores.mean()),
        "rollout/accuracy": float(correct.float().mean()),
        "rollout/response_length": float(lengths.float().mean()),
        "rollout/response_length_max": float(lengths.float().max()),
        "rollout/truncated_frac": float(truncated.float().mean()),
        "rollout/responses": float(len(scores)),
        "adv/mean": _mean(world, batch.advantages, mask),
        "adv/std": world.std(batch.advantages[mask.bool()]),
        "actor/lr": actor_lr,
        "time/rollout_s": rollout_s,
        "time/critic_s": times.critic_end - times.critic_start,
        "time/actor_s": times.actor_end - times.critic_end,
        "time/step_s": times.actor_end - times.start,
        "perf/tokens_per_s": n_tokens / max(rollout_s, 1e-9),
        "perf/peak_rss_mb": float(
            world.max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        ),  # KiB
    }
    m.update({f"diag/length/{k}": v for k, v in length_profile(lengths, correct).items()})
    gap = advantage_gap_sums(batch.advantages, mask, batch.correct, batch.lengths)
    m.update({f"diag/adv_gap/{k}": v for k, v in advantage_gap_from_sums(world.sum(gap)).items()})
    if batch.mc_returns is not None:
        sums, counts = value_bias_sums(batch.values, batch.mc_returns, mask)
        m.update(
            {
                f"diag/value_bias/{k}": v
                for k, v in value_bias_from_sums(world.sum(sums), world.sum(counts)).items()
            }
        )
    if batch.lam_policy is not None:
        m["gae/lam_policy_mean"] = world.mean(batch.lam_policy)
        m["gae/lam_policy_zero_frac"] = world.mean((batch.lam_policy == 0).float())
    return m


def critic_metrics(batch: Batch, world: World) -> dict[str, float]:
    """Returns the critic's explained variance of the returns, 1 − Var(R − V)/Var(R), and its mean
    value, over the valid tokens of all ranks (population variances; NaN where Var(R) = 0)."""
    mask = batch.rows.response_mask
    returns, residual = batch.returns, batch.returns - batch.values
    var_returns, var_residual = _var(world, torch.stack([returns, residual]), mask)
    ev = 1.0 - var_residual / var_returns if var_returns > 0 else torch.tensor(float("nan"))
    return {
        "critic/explained_variance": float(ev),
        "critic/value_mean": _mean(world, batch.values, mask),
    }


def _count(world: World, x: Tensor, mask: Tensor) -> Tensor:
    """The number of valid entries over all ranks, in ``x``'s dtype (at least 1)."""
    count = world.sum(masked_sum(torch.ones_like(x), mask))
    return torch.where(count > 0, count, torch.ones_like(count))


def _mean(world: World, x: Tensor, mask: Tensor) -> float:
    """The mean of ``x`` over the valid entries of all ranks (0 where there are none)."""
    return float(world.sum(masked_sum(x, mask)) / _count(world, x, mask))


def _var(world: World, xs: Tensor, mask: Tensor) -> Tensor:
    """The population variances of each ``xs[i]`` over the valid entries of all ranks, in two
    passes."""
    count = _count(world, xs[0], mask)
    means = world.sum(torch.stack([masked_sum(x, mask) for x in xs])) / count
    return (
        world.sum(torch.stack([masked_sum((x - mu) ** 2, mask) for x, mu in zip(xs, means)]))
        / count
    )
