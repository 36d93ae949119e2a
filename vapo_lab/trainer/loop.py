"""The built-in PPO trainer: VAPO, vanilla PPO, DAPO and GRPO from one loop.

Each step: sample prompts -> roll out n responses each -> grade -> (critic) values -> advantages
-> critic update -> actor update -> log; every ``eval_every`` steps held-out avg@k, every
``save_every`` steps an atomic checkpoint. Every VAPO component is a config key read here
through the maths in ``vapo_lab.algo``; no component logic is written in this file.

Departures from textbook PPO (Schulman et al. 2017), each a config key:
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
     whitened over the batch's valid tokens (``gae.whiten``): (A − mean)/(σ + 1e-8) with σ the
     population std (÷N). verl's ``masked_whiten`` divides by sqrt(Bessel-corrected variance
     (÷(N−1)) + 1e-8), so verl's advantages are ours × sqrt((N−1)/N): a difference of
     sqrt(N/(N−1)) in scale, under 0.1% for N over 500 valid tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from vapo_lab.algo import (
    aggregate_loss,
    decoupled_gae,
    gae,
    group_advantages,
    kl_estimate,
    length_adaptive_lambda,
    masked_mean,
    overlong_penalty,
    positive_nll_loss,
    ppo_policy_loss,
    value_loss,
)
from vapo_lab.errors import VapoLabError
from vapo_lab.rollout.sampler import Samples
from vapo_lab.trainer.forward import Rows, policy_forward, value_forward


class TrainingDiverged(VapoLabError):
    """A loss became NaN/inf; the run stops and its last good checkpoint is kept."""


@dataclass
class Batch:
    """One step's experience. B responses, T response tokens."""

    rows: Rows
    problems: list[Any]  # per row
    scores: Tensor  # (B,) verifier reward (plus overlong shaping)
    correct: Tensor  # (B,) bool
    lengths: Tensor  # (B,)
    truncated: Tensor  # (B,) bool
    old_logprobs: Tensor  # (B, T)
    values: Tensor | None = None  # (B, T)
    ref_logprobs: Tensor | None = None  # (B, T)
    advantages: Tensor | None = None  # (B, T)
    returns: Tensor | None = None  # (B, T) the critic's targets
    mc_returns: Tensor | None = None  # (B, T) realised Monte-Carlo returns G_t (diagnostics)
    lam_policy: Tensor | None = None  # (B,)
    extra: dict[str, float] = field(default_factory=dict)


def token_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Returns (B, T) rewards: each response's score at its last valid token, 0 elsewhere."""
    lengths = response_mask.sum(-1)
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    rows = (lengths > 0).nonzero().squeeze(-1)
    rewards[rows, lengths[rows] - 1] = scores[rows].float()
    return rewards


def policy_lambda(cfg: DictConfig, lengths: Tensor) -> Tensor:
    """Returns λ_policy per response: length-adaptive 1 − 1/(α·l) or the fixed gae.lam_policy."""
    if cfg.gae.lam_policy_mode == "length_adaptive":
        return length_adaptive_lambda(lengths, cfg.gae.alpha)
    return torch.full((len(lengths),), float(cfg.gae.lam_policy))


def compute_advantages(cfg: DictConfig, batch: Batch) -> None:
    """Fills batch.advantages / returns / lam_policy from the config's advantage estimator."""
    mask = batch.rows.response_mask
    if cfg.algo.advantage == "group":
        adv = group_advantages(batch.scores.float(), int(cfg.rollout.n_samples), norm_std=cfg.algo.group_norm_std)
        batch.advantages = adv[:, None] * mask
        return
    rewards = token_rewards(batch.scores, mask)
    if batch.ref_logprobs is not None and cfg.kl.target == "reward" and cfg.kl.coef > 0:
        rewards = rewards - cfg.kl.coef * kl_estimate(batch.old_logprobs, batch.ref_logprobs, cfg.kl.estimator) * mask
    lam_p = policy_lambda(cfg, batch.lengths)
    # decoupled: the critic's own λ (1.0: Monte-Carlo targets); shared: the policy's λ per response
    lam_c = float(cfg.gae.lam_critic) if cfg.gae.lam_critic_mode == "decoupled" else lam_p
    adv, ret = decoupled_gae(rewards, batch.values, mask, lam_p, lam_c, gamma=float(cfg.gae.gamma))
    batch.mc_returns = ret if isinstance(lam_c, float) and lam_c == 1.0 else gae(rewards, batch.values, mask, 1.0, float(cfg.gae.gamma))[1]
    if cfg.gae.whiten:
        # population std (unbiased=False), not verl's Bessel-corrected one: see departure 8 above
        valid = mask.bool()
        mean = adv[valid].mean()
        std = adv[valid].std(unbiased=False) if valid.sum() > 1 else torch.tensor(1.0)
        adv = torch.where(valid, (adv - mean) / (std + 1e-8), torch.zeros_like(adv))
    batch.advantages, batch.returns, batch.lam_policy = adv, ret, lam_p


def minibatches(n_rows: int, size: int, generator: torch.Generator) -> list[Tensor]:
    """Returns a random partition of range(n_rows) into chunks of ``size`` (last may be smaller)."""
    order = torch.randperm(n_rows, generator=generator)
    return [order[i:i + size] for i in range(0, n_rows, size)]


def _check_finite(name: str, value: Tensor, step: int) -> None:
    if not torch.isfinite(value).all():
        raise TrainingDiverged(
            f"{name} is {value.item() if value.numel() == 1 else 'non-finite'} at step {step}: the run "
            "stopped and its last good checkpoint is kept. Lower trainer.actor_lr/critic_lr or "
            "trainer.grad_clip and resume with resume=<run dir>")


class Updater:
    """Mini-batch / micro-batch gradient steps of the actor and the critic."""

    def __init__(self, cfg: DictConfig, policy: nn.Module, critic: nn.Module | None,
                 ref: nn.Module | None, actor_opt: torch.optim.Optimizer,
                 critic_opt: torch.optim.Optimizer | None, generator: torch.Generator) -> None:
        self.cfg, self.policy, self.critic, self.ref = cfg, policy, critic, ref
        self.actor_opt, self.critic_opt, self.generator = actor_opt, critic_opt, generator

    def micro(self, index: Tensor, lengths: Tensor) -> list[Tensor]:
        """Returns the micro-batches of mini-batch ``index``: its rows sorted by response length,
        in chunks of ``trainer.micro_batch_size``, so that short responses are not padded to the
        longest of the mini-batch (each micro-batch is trimmed to its own longest row). The
        gradient is the mini-batch's whatever the split: every loss uses the mini-batch's normaliser."""
        size = int(self.cfg.trainer.micro_batch_size)
        if size < len(index):
            index = index[torch.sort(lengths[index], stable=True).indices]
        return [index[i:i + size] for i in range(0, len(index), size)]

    def critic_update(self, batch: Batch, step: int) -> dict[str, float]:
        """Returns critic metrics after ppo_epochs passes of clipped value-loss descent."""
        cfg, critic = self.cfg, self.critic
        assert critic is not None and self.critic_opt is not None
        critic.train()
        totals: dict[str, list[float]] = {"critic/value_loss": [], "critic/clipfrac": [], "critic/grad_norm": []}
        for _ in range(int(cfg.trainer.ppo_epochs)):
            for mb in minibatches(len(batch.problems), int(cfg.trainer.mini_batch_size), self.generator):
                norm = _normalizer(cfg.critic.loss_agg, batch.rows.response_mask[mb])
                self.critic_opt.zero_grad(set_to_none=True)
                loss_sum, clip_sum = 0.0, 0.0
                for idx in self.micro(mb, batch.lengths):
                    rows = batch.rows.take(idx)
                    t = rows.response_ids.shape[1]
                    values = value_forward(critic, rows)
                    loss, m = value_loss(values, batch.values[idx, :t], batch.returns[idx, :t],
                                         rows.response_mask, clip_range=cfg.critic.value_clip,
                                         loss_agg=cfg.critic.loss_agg, normalizer=norm)
                    loss.backward()
                    loss_sum += float(loss.detach())
                    clip_sum += float(m["clipfrac"]) * len(idx) / len(mb)
                _check_finite("critic/value_loss", torch.tensor(loss_sum), step)
                gn = torch.nn.utils.clip_grad_norm_(critic.parameters(), float(cfg.trainer.grad_clip))
                self.critic_opt.step()
                totals["critic/value_loss"].append(loss_sum)
                totals["critic/clipfrac"].append(clip_sum)
                totals["critic/grad_norm"].append(float(gn))
        critic.eval()
        return {k: sum(v) / len(v) for k, v in totals.items() if v}

    def actor_update(self, batch: Batch, step: int) -> dict[str, float]:
        """Returns actor metrics after ppo_epochs passes of PPO-clip descent (+ μ·NLL, + β·KL)."""
        cfg, policy = self.cfg, self.policy
        policy.train()
        temperature = float(cfg.rollout.temperature)
        keys = ["actor/pg_loss", "actor/nll_loss", "actor/kl_loss", "actor/entropy", "actor/clipfrac_low",
                "actor/clipfrac_high", "actor/clipfrac_dual", "actor/approx_kl", "actor/grad_norm"]
        totals: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(int(cfg.trainer.ppo_epochs)):
            for mb in minibatches(len(batch.problems), int(cfg.trainer.mini_batch_size), self.generator):
                mask_mb = batch.rows.response_mask[mb]
                norm = _normalizer(cfg.loss.agg, mask_mb)
                # the NLL is normalised by the correct tokens of the whole mini-batch (VAPO §4.3)
                nll_norm = float((mask_mb.sum(-1) * batch.correct[mb]).sum())
                self.actor_opt.zero_grad(set_to_none=True)
                acc = {k: 0.0 for k in keys}
                n_tok = float(mask_mb.sum())
                for idx in self.micro(mb, batch.lengths):
                    rows = batch.rows.take(idx)
                    t = rows.response_ids.shape[1]
                    mask = rows.response_mask
                    logprobs, entropy = policy_forward(policy, rows, temperature, with_entropy=True,
                                                       entropy_grad=cfg.loss.entropy_coef > 0)
                    pg, m = ppo_policy_loss(logprobs, batch.old_logprobs[idx, :t], batch.advantages[idx, :t], mask,
                                            eps_low=float(cfg.loss.eps_low), eps_high=float(cfg.loss.eps_high),
                                            dual_clip=cfg.loss.dual_clip, loss_agg=cfg.loss.agg, normalizer=norm)
                    loss = pg
                    if cfg.loss.mu > 0 and nll_norm > 0:
                        nll = positive_nll_loss(logprobs, mask, batch.correct[idx], normalizer=nll_norm)
                        loss = loss + float(cfg.loss.mu) * nll
                        acc["actor/nll_loss"] += float(nll.detach())
                    if self.ref is not None and cfg.kl.coef > 0 and cfg.kl.target == "loss":
                        kl = aggregate_loss(kl_estimate(logprobs, batch.ref_logprobs[idx, :t], cfg.kl.estimator),
                                            mask, cfg.loss.agg, normalizer=norm)
                        loss = loss + float(cfg.kl.coef) * kl
                        acc["actor/kl_loss"] += float(kl.detach())
                    if cfg.loss.entropy_coef > 0:
                        loss = loss - float(cfg.loss.entropy_coef) * aggregate_loss(entropy, mask, "token-mean",
                                                                                     normalizer=n_tok)
                    loss.backward()
                    w = float(mask.sum()) / max(n_tok, 1.0)  # token-weighted metric averages
                    acc["actor/pg_loss"] += float(pg.detach())
                    acc["actor/entropy"] += float(masked_mean(entropy.detach(), mask)) * w
                    for k in ("clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl"):
                        acc[f"actor/{k}"] += float(m[k]) * w
                _check_finite("actor/pg_loss", torch.tensor(acc["actor/pg_loss"]), step)
                gn = torch.nn.utils.clip_grad_norm_(policy.parameters(), float(cfg.trainer.grad_clip))
                self.actor_opt.step()
                acc["actor/grad_norm"] = float(gn)
                for k in keys:
                    totals[k].append(acc[k])
        policy.eval()
        return {k: sum(v) / len(v) for k, v in totals.items() if v}


def _normalizer(mode: str, mask: Tensor) -> float:
    """Returns the mini-batch denominator of ``aggregate_loss`` for ``mode`` (see algo.policy)."""
    if mode == "token-mean":
        return float(mask.sum())
    return float((mask.sum(-1) > 0).sum())


@dataclass
class Grader:
    """Turns samples into scores with the task's verifier and the reward config."""

    task: Any
    tokenizer: Any
    correct_reward: float
    wrong_reward: float
    overlong: DictConfig | None = None

    def __call__(self, samples: Samples, problems: list[Any]) -> tuple[Tensor, Tensor, list[str]]:
        texts = [self.tokenizer.decode(ids[:n].tolist(), skip_special_tokens=True)
                 for ids, n in zip(samples.response_ids, samples.lengths.tolist())]
        correct = torch.tensor([bool(self.task.verify(t, p)) and not trunc
                                for t, p, trunc in zip(texts, problems, samples.truncated.tolist())])
        scores = torch.where(correct, torch.tensor(self.correct_reward), torch.tensor(self.wrong_reward))
        if self.overlong is not None and self.overlong.enabled:
            scores = scores + overlong_penalty(samples.lengths, int(self.overlong.l_max),
                                               int(self.overlong.l_cache), float(self.overlong.penalty))
        return scores.float(), correct, texts
