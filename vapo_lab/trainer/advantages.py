"""Advantages and critic targets of a step's batch: GAE over the critic's values (λ_policy and
λ_critic, whitened over all ranks' valid tokens), or group-relative advantages without a critic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from vapo_lab.algo import decoupled_gae, gae, group_advantages, kl_estimate, length_adaptive_lambda
from vapo_lab.distributed.world import World, single
from vapo_lab.trainer.collect import Batch

if TYPE_CHECKING:
    from vapo_lab.config.schema import AlgoConfig, GaeConfig, KlConfig


def token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Returns (B, T) rewards: each response's score at its last valid token, 0 elsewhere."""
    lengths = response_mask.sum(-1)
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    rows = (lengths > 0).nonzero().squeeze(-1)
    rewards[rows, lengths[rows] - 1] = scores[rows].float()
    return rewards


def policy_lambda(gae: GaeConfig, lengths: Tensor) -> Tensor:
    """Returns λ_policy per response: length-adaptive 1 − 1/(α·l) or the fixed gae.lam_policy."""
    if gae.lam_policy_mode == "length_adaptive":
        return length_adaptive_lambda(lengths, gae.alpha)
    return torch.full((len(lengths),), gae.lam_policy)


def whiten(adv: Tensor, mask: Tensor, world: World | None = None) -> Tensor:
    """Returns (A − mean)/(σ + 1e-8) over the valid tokens of all ranks (σ: population std), 0 at
    padding; one process: the batch's own valid tokens."""
    valid = mask.bool()
    world = world or single()
    if world.size == 1:
        mean = adv[valid].mean()
        std = adv[valid].std(unbiased=False) if valid.sum() > 1 else torch.tensor(1.0)
    else:
        x = adv[valid].double()
        count = world.sum(float(x.numel()))
        mean = world.sum(x.sum()) / count.clamp(min=1)
        var = world.sum(((x - mean) ** 2).sum()) / count.clamp(min=1)
        std = var.sqrt() if count > 1 else torch.tensor(1.0, dtype=torch.float64)
        mean, std = mean.to(adv.dtype), std.to(adv.dtype)
    return torch.where(valid, (adv - mean) / (std + 1e-8), torch.zeros_like(adv))


def compute_advantages(
    algo: AlgoConfig,
    gae_cfg: GaeConfig,
    kl: KlConfig,
    n_samples: int,
    batch: Batch,
    world: World | None = None,
) -> None:
    """Fills batch.advantages / returns / mc_returns / lam_policy by ``algo.advantage``: group
    advantages over groups of ``n_samples``, or GAE (whitened over the valid tokens of all
    ranks)."""
    mask = batch.rows.response_mask
    if algo.advantage == "group":
        adv = group_advantages(batch.scores.float(), n_samples, norm_std=algo.group_norm_std)
        batch.advantages = adv[:, None] * mask
        return
    rewards = token_rewards(batch.scores, mask)
    if batch.ref_logprobs is not None and kl.target == "reward" and kl.coef > 0:
        penalty = kl_estimate(batch.old_logprobs, batch.ref_logprobs, kl.estimator)
        rewards = rewards - kl.coef * penalty * mask
    lam_p = policy_lambda(gae_cfg, batch.lengths)
    # decoupled: the critic's own λ (1.0: Monte-Carlo targets); shared: the policy's λ per response
    lam_c = gae_cfg.lam_critic if gae_cfg.lam_critic_mode == "decoupled" else lam_p
    gamma = gae_cfg.gamma
    adv, ret = decoupled_gae(rewards, batch.values, mask, lam_p, lam_c, gamma=gamma)
    monte_carlo = isinstance(lam_c, float) and lam_c == 1.0
    batch.mc_returns = ret if monte_carlo else gae(rewards, batch.values, mask, 1.0, gamma)[1]
    if gae_cfg.whiten:
        # population std (unbiased=False), not verl's Bessel-corrected one: see the module docstring
        adv = whiten(adv, mask, world)
    batch.advantages, batch.returns, batch.lam_policy = adv, ret, lam_p
