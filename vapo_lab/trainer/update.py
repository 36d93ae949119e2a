"""The updates of a step: mini-batch / micro-batch gradient steps of the critic and the actor.

Each mini-batch is one optimiser step; it is split into micro-batches of at most
``trainer.max_tokens_per_micro_batch`` tokens (``forward.token_micro_batches``) whose gradients add
up to the mini-batch's, because every micro-batch's loss is divided by the *mini-batch's*
denominator (``algo.policy.loss_denominator``), whatever the split.

On many ranks the mini-batches are drawn from the step's global batch, one permutation shared by
every rank, and each rank computes the gradient of its rows of each mini-batch; denominators (tokens,
responses, correct tokens) are counted over all ranks, so the ranks' gradients sum (FSDP's
reduce-scatter, :mod:`vapo_lab.distributed.fsdp`) to the one-rank gradient of the same mini-batch. Every
rank runs as many forward/backward passes as the rank with most micro-batches (zero-loss passes on
a one-token row make up the difference): FSDP's collectives must meet on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from vapo_lab.algo import (
    aggregate_loss,
    kl_estimate,
    masked_mean,
    positive_nll_loss,
    ppo_policy_loss,
    value_loss,
)
from vapo_lab.algo.policy import loss_denominator
from vapo_lab.distributed.fsdp import full
from vapo_lab.distributed.world import World, single
from vapo_lab.errors import VapoLabError
from vapo_lab.trainer.collect import Batch
from vapo_lab.trainer.forward import (
    Rows,
    model_device,
    policy_forward,
    token_micro_batches,
    value_forward,
)


class TrainingDiverged(VapoLabError):
    """A loss became NaN/inf; the run stops and its last good checkpoint is kept."""


def adamw(params: Any, lr: float, t: DictConfig) -> torch.optim.AdamW:
    """Returns AdamW over ``params`` with the trainer config's betas, eps, weight decay and kernel
    (``trainer.adam_impl``: fused, foreach or for-loop)."""
    impl = t.get("adam_impl", "fused")
    kernel = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=tuple(t.adam_betas),
        eps=float(t.adam_eps),
        weight_decay=float(t.weight_decay),
        **kernel,
    )


def warmup_constant(
    optimizer: torch.optim.Optimizer, warmup: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Returns the schedule of ``optimizer``: linear warmup over ``warmup`` steps, then constant."""

    def factor(step: int) -> float:
        return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def minibatches(n_rows: int, size: int, generator: torch.Generator) -> list[Tensor]:
    """Returns a random partition of range(n_rows) into chunks of ``size`` (last may be smaller)."""
    order = torch.randperm(n_rows, generator=generator)
    return [order[i : i + size] for i in range(0, n_rows, size)]


def _check_finite(name: str, value: Tensor, step: int) -> None:
    if not torch.isfinite(value).all():
        raise TrainingDiverged(
            f"{name} is {value.item() if value.numel() == 1 else 'non-finite'} at step {step}: the run "
            "stopped and its last good checkpoint is kept. Lower trainer.actor_lr/critic_lr or "
            "trainer.grad_clip and resume with resume=<run dir>"
        )


class Updater:
    """Mini-batch / micro-batch gradient steps of the actor and the critic.

    ``actor_opt`` may be None where only the critic is trained (value pretraining), ``critic`` and
    ``critic_opt`` where there is no critic (group advantages); ``ref`` is the reference policy of
    a KL term in the loss.
    """

    def __init__(
        self,
        cfg: DictConfig,
        policy: nn.Module,
        critic: nn.Module | None,
        ref: nn.Module | None,
        actor_opt: torch.optim.Optimizer | None,
        critic_opt: torch.optim.Optimizer | None,
        generator: torch.Generator,
        world: World | None = None,
    ) -> None:
        self.cfg, self.policy, self.critic, self.ref = cfg, policy, critic, ref
        self.actor_opt, self.critic_opt, self.generator = actor_opt, critic_opt, generator
        self.world = world or single()

    def minibatches(self, n_rows: int) -> list[tuple[Tensor, int]]:
        """Returns (this rank's rows of each mini-batch, the mini-batch's size over all ranks): a
        random partition of the step's global batch (rank r holds its rows after those of ranks
        < r), drawn from the update RNG that every rank advances alike."""
        size, w = int(self.cfg.trainer.mini_batch_size), self.world
        if w.size == 1:
            return [(mb, len(mb)) for mb in minibatches(n_rows, size, self.generator)]
        counts = w.gather(n_rows)
        offset = sum(counts[: w.rank])
        return [
            (mb[(mb >= offset) & (mb < offset + n_rows)] - offset, len(mb))
            for mb in minibatches(sum(counts), size, self.generator)
        ]

    def padding(self, passes: int) -> int:
        """Returns how many zero-loss passes this rank adds to its ``passes`` so that every rank
        runs the same number."""
        return int(self.world.max(passes)) - passes if self.world.size > 1 else 0

    def micro(self, index: Tensor, rows: Rows) -> list[Tensor]:
        """Returns the micro-batches of mini-batch ``index``: at most ``trainer.max_tokens_per_micro_batch``
        tokens each (``token_micro_batches``). The gradient is the mini-batch's whatever the split:
        every loss uses the mini-batch's normaliser."""
        return token_micro_batches(index, rows, int(self.cfg.trainer.max_tokens_per_micro_batch))

    def critic_update(self, batch: Batch, step: int) -> dict[str, float]:
        """Returns critic metrics after ppo_epochs passes of clipped value-loss descent."""
        cfg, critic = self.cfg, self.critic
        assert critic is not None and self.critic_opt is not None
        critic.train()
        dev = model_device(
            critic
        )  # the batch stays where it was made; each micro-batch crosses here
        totals: dict[str, list[float]] = {
            "critic/value_loss": [],
            "critic/clipfrac": [],
            "critic/grad_norm": [],
        }
        w = self.world
        for _ in range(int(cfg.trainer.ppo_epochs)):
            for mb, _ in self.minibatches(len(batch.problems)):
                norm = float(
                    w.sum(loss_denominator(cfg.critic.loss_agg, batch.rows.response_mask[mb]))
                )
                # the clip fraction is over the mini-batch's tokens (as the actor's), whatever the split
                n_tok = float(w.sum(batch.rows.response_mask[mb].sum()))
                self.critic_opt.zero_grad(set_to_none=True)
                loss_sum, clip_sum = 0.0, 0.0
                micros = self.micro(mb, batch.rows)
                extra = self.padding(len(micros))  # agreed before any pass: it is a collective too
                for idx in micros:
                    rows = batch.rows.take(idx).to(dev)
                    t = rows.response_ids.shape[1]
                    values = value_forward(critic, rows)
                    loss, m = value_loss(
                        values,
                        batch.values[idx, :t].to(dev),
                        batch.returns[idx, :t].to(dev),
                        rows.response_mask,
                        clip_range=cfg.critic.value_clip,
                        loss_agg=cfg.critic.loss_agg,
                        normalizer=norm,
                    )
                    loss.backward()
                    loss_sum += float(loss.detach())
                    clip_sum += (
                        float(m["clipfrac"]) * float(rows.response_mask.sum()) / max(n_tok, 1.0)
                    )
                for _ in range(extra):
                    (value_forward(critic, Rows.dummy(dev)).sum() * 0.0).backward()
                loss_sum, clip_sum = float(w.sum(loss_sum)), float(w.sum(clip_sum))
                _check_finite("critic/value_loss", torch.tensor(loss_sum), step)
                gn = torch.nn.utils.clip_grad_norm_(
                    critic.parameters(), float(cfg.trainer.grad_clip)
                )
                self.critic_opt.step()
                totals["critic/value_loss"].append(loss_sum)
                totals["critic/clipfrac"].append(clip_sum)
                totals["critic/grad_norm"].append(float(full(gn)))
        critic.eval()
        return {k: sum(v) / len(v) for k, v in totals.items() if v}

    def actor_update(self, batch: Batch, step: int) -> dict[str, float]:
        """Returns actor metrics after ppo_epochs passes of PPO-clip descent (+ μ·NLL, + β·KL)."""
        cfg, policy = self.cfg, self.policy
        assert self.actor_opt is not None
        policy.train()
        dev = model_device(
            policy
        )  # the batch stays where it was made; each micro-batch crosses here
        temperature = float(cfg.rollout.temperature)
        keys = [
            "actor/pg_loss",
            "actor/nll_loss",
            "actor/kl_loss",
            "actor/entropy",
            "actor/clipfrac_low",
            "actor/clipfrac_high",
            "actor/clipfrac_dual",
            "actor/approx_kl",
            "actor/grad_norm",
        ]
        totals: dict[str, list[float]] = {k: [] for k in keys}
        w = self.world
        for _ in range(int(cfg.trainer.ppo_epochs)):
            for mb, _ in self.minibatches(len(batch.problems)):
                mask_mb = batch.rows.response_mask[mb]
                norm = float(w.sum(loss_denominator(cfg.loss.agg, mask_mb)))
                # the NLL is normalised by the correct tokens of the whole mini-batch (VAPO §4.3)
                nll_norm = float(w.sum((mask_mb.sum(-1) * batch.correct[mb]).sum()))
                self.actor_opt.zero_grad(set_to_none=True)
                acc = {k: 0.0 for k in keys}
                n_tok = float(w.sum(mask_mb.sum()))
                micros = self.micro(mb, batch.rows)
                extra = self.padding(len(micros))
                for idx in micros:
                    rows = batch.rows.take(idx).to(dev)
                    t = rows.response_ids.shape[1]
                    mask = rows.response_mask
                    logprobs, entropy = policy_forward(
                        policy,
                        rows,
                        temperature,
                        with_entropy=True,
                        entropy_grad=cfg.loss.entropy_coef > 0,
                    )
                    old, adv = (
                        batch.old_logprobs[idx, :t].to(dev),
                        batch.advantages[idx, :t].to(dev),
                    )
                    pg, m = ppo_policy_loss(
                        logprobs,
                        old,
                        adv,
                        mask,
                        eps_low=float(cfg.loss.eps_low),
                        eps_high=float(cfg.loss.eps_high),
                        dual_clip=cfg.loss.dual_clip,
                        loss_agg=cfg.loss.agg,
                        normalizer=norm,
                    )
                    loss = pg
                    if cfg.loss.mu > 0 and nll_norm > 0:
                        nll = positive_nll_loss(
                            logprobs, mask, batch.correct[idx].to(dev), normalizer=nll_norm
                        )
                        loss = loss + float(cfg.loss.mu) * nll
                        acc["actor/nll_loss"] += float(nll.detach())
                    if self.ref is not None and cfg.kl.coef > 0 and cfg.kl.target == "loss":
                        ref = batch.ref_logprobs[idx, :t].to(dev)
                        kl = aggregate_loss(
                            kl_estimate(logprobs, ref, cfg.kl.estimator),
                            mask,
                            cfg.loss.agg,
                            normalizer=norm,
                        )
                        loss = loss + float(cfg.kl.coef) * kl
                        acc["actor/kl_loss"] += float(kl.detach())
                    if cfg.loss.entropy_coef > 0:
                        loss = loss - float(cfg.loss.entropy_coef) * aggregate_loss(
                            entropy, mask, "token-mean", normalizer=n_tok
                        )
                    loss.backward()
                    share = float(mask.sum()) / max(n_tok, 1.0)  # token-weighted metric averages
                    acc["actor/pg_loss"] += float(pg.detach())
                    acc["actor/entropy"] += float(masked_mean(entropy.detach(), mask)) * share
                    for k in ("clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl"):
                        acc[f"actor/{k}"] += float(m[k]) * share
                for _ in range(extra):
                    dummy = policy_forward(policy, Rows.dummy(dev), temperature)[0]
                    (dummy.sum() * 0.0).backward()
                if w.size > 1:
                    acc = {k: float(w.sum(v)) for k, v in acc.items()}
                _check_finite("actor/pg_loss", torch.tensor(acc["actor/pg_loss"]), step)
                gn = torch.nn.utils.clip_grad_norm_(
                    policy.parameters(), float(cfg.trainer.grad_clip)
                )
                self.actor_opt.step()
                acc["actor/grad_norm"] = float(full(gn))
                for k in keys:
                    totals[k].append(acc[k])
        policy.eval()
        return {k: sum(v) / len(v) for k, v in totals.items() if v}
