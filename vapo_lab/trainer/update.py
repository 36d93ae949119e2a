"""Gradient steps: one descent skeleton (:meth:`Descent.step`) for the actor, the critic and the
reward model.

A mini-batch is one optimiser step, split into micro-batches of at most
``trainer.max_tokens_per_micro_batch`` tokens whose gradients add up to the mini-batch's: every
micro-batch's loss is divided by the mini-batch's denominator. On many ranks every rank runs as
many passes as the busiest one (zero-loss passes on a dummy row), because FSDP's collectives must
meet on every rank; docs/training.md#updates gives the whole argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
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

if TYPE_CHECKING:
    from vapo_lab.config.schema import CriticConfig, KlConfig, LossConfig, TrainerConfig

# a pass over one micro-batch's rows (None: a zero-loss padding pass): (loss, metric terms)
Pass = Callable[[Tensor | None], tuple[Tensor, dict[str, Any]]]


class TrainingDiverged(VapoLabError):
    """A loss became NaN/inf; the run stops and its last good checkpoint is kept."""


def adamw(params: Any, lr: float, trainer: TrainerConfig) -> torch.optim.AdamW:
    """Returns AdamW over ``params`` with the section's betas, eps, weight decay and kernel
    (``trainer.adam_impl``: fused, foreach or for-loop)."""
    impl = trainer.adam_impl
    kernel = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(
        params,
        lr=lr,
        betas=tuple(trainer.adam_betas),
        eps=trainer.adam_eps,
        weight_decay=trainer.weight_decay,
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


def _check_finite(name: str, value: float, step: int) -> None:
    if not torch.isfinite(torch.tensor(value)):
        raise TrainingDiverged(
            f"{name} is {value} at step {step}: the run stopped and its last good checkpoint is "
            "kept. Lower trainer.actor_lr/critic_lr or trainer.grad_clip and resume with "
            "resume=<run dir>"
        )


class Descent:
    """The mini-batches of a step and the optimiser step over one of them, on this rank.

    Args:
        trainer: mini_batch_size, ppo_epochs, max_tokens_per_micro_batch and grad_clip.
        generator: the update RNG, advanced alike on every rank.
    """

    def __init__(
        self, trainer: TrainerConfig, generator: torch.Generator, world: World | None = None
    ) -> None:
        self.trainer, self.generator, self.world = trainer, generator, world or single()

    def minibatches(self, n_rows: int) -> list[tuple[Tensor, int]]:
        """Returns (this rank's rows of each mini-batch, the mini-batch's size over all ranks): a
        random partition of the step's global batch, rank r's rows after those of ranks < r."""
        size, w = self.trainer.mini_batch_size, self.world
        if w.size == 1:
            return [(mb, len(mb)) for mb in minibatches(n_rows, size, self.generator)]
        counts = w.gather(n_rows)
        offset = sum(counts[: w.rank])
        return [
            (mb[(mb >= offset) & (mb < offset + n_rows)] - offset, len(mb))
            for mb in minibatches(sum(counts), size, self.generator)
        ]

    def micro(self, index: Tensor, rows: Rows) -> list[Tensor]:
        """Returns the micro-batches of mini-batch ``index`` (``token_micro_batches``)."""
        return token_micro_batches(index, rows, self.trainer.max_tokens_per_micro_batch)

    def padding(self, passes: int) -> int:
        """Returns how many zero-loss passes this rank adds to reach the busiest rank's."""
        return int(self.world.max(passes)) - passes if self.world.size > 1 else 0

    def step(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        micros: list[Tensor],
        run_pass: Pass,
        zero: dict[str, Any],
        check: str,
        step: int,
    ) -> tuple[dict[str, float], float]:
        """Runs one optimiser step of ``model`` over ``micros`` and returns (the metric terms of
        its passes summed over micro-batches and ranks, the gradient norm before clipping).

        ``zero`` holds each metric's starting value (its dtype is the reduction's);
        ``check`` names the metric that must be finite.

        Raises:
            TrainingDiverged: metric ``check`` is NaN or infinite.
        """
        optimizer.zero_grad(set_to_none=True)
        acc = dict(zero)
        extra = self.padding(len(micros))  # agreed before any pass: it is a collective too
        for idx in [*micros, *[None] * extra]:
            loss, terms = run_pass(idx)
            loss.backward()
            for k, v in terms.items():
                acc[k] += v
        summed = {k: float(self.world.sum(v)) for k, v in acc.items()}
        _check_finite(check, summed[check], step)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.trainer.grad_clip)
        optimizer.step()
        return summed, float(full(norm))


class CriticUpdate:
    """Clipped value-loss descent of the critic over a step's batch, ``ppo_epochs`` times."""

    def __init__(
        self,
        descent: Descent,
        critic: CriticConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        self.descent, self.cfg, self.model, self.optimizer = descent, critic, model, optimizer

    def __call__(self, batch: Batch, step: int) -> dict[str, float]:
        """Returns the critic's metrics, each the mean over its optimiser steps."""
        d, w, model = self.descent, self.descent.world, self.model
        model.train()
        dev = model_device(model)  # the batch stays where it was made; each micro-batch crosses
        totals: dict[str, list[float]] = {"critic/value_loss": [], "critic/clipfrac": []}
        norms: list[float] = []
        for _ in range(d.trainer.ppo_epochs):
            for mb, _ in d.minibatches(len(batch.problems)):
                mask = batch.rows.response_mask[mb]
                norm = float(w.sum(loss_denominator(self.cfg.loss_agg, mask)))
                # the clip fraction is over the mini-batch's tokens, whatever the split
                n_tok = float(w.sum(mask.sum()))

                def run_pass(idx: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
                    if idx is None:
                        return value_forward(model, Rows.dummy(dev)).sum() * 0.0, {}
                    rows = batch.rows.take(idx).to(dev)
                    t = rows.response_ids.shape[1]
                    old, returns = batch.values[idx, :t].to(dev), batch.returns[idx, :t].to(dev)
                    loss, m = value_loss(
                        value_forward(model, rows),
                        old,
                        returns,
                        rows.response_mask,
                        clip_range=self.cfg.value_clip,
                        loss_agg=self.cfg.loss_agg,
                        normalizer=norm,
                    )
                    tokens = float(rows.response_mask.sum())
                    terms = {
                        "critic/value_loss": float(loss.detach()),
                        "critic/clipfrac": float(m["clipfrac"]) * tokens / max(n_tok, 1.0),
                    }
                    return loss, terms

                zero = dict.fromkeys(totals, 0.0)
                micros = d.micro(mb, batch.rows)
                summed, grad_norm = d.step(
                    model, self.optimizer, micros, run_pass, zero, "critic/value_loss", step
                )
                for k in totals:
                    totals[k].append(summed[k])
                norms.append(grad_norm)
        model.eval()
        out = {k: sum(v) / len(v) for k, v in totals.items() if v}
        if norms:
            out["critic/grad_norm"] = sum(norms) / len(norms)
        return out


ACTOR_KEYS = (
    "actor/pg_loss",
    "actor/nll_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/clipfrac_low",
    "actor/clipfrac_high",
    "actor/clipfrac_dual",
    "actor/approx_kl",
)


class ActorUpdate:
    """PPO-clip descent of the policy (+ μ·NLL on correct responses, + β·KL to ``ref`` in the
    loss) over a step's batch, ``ppo_epochs`` times."""

    def __init__(
        self,
        descent: Descent,
        loss: LossConfig,
        kl: KlConfig,
        temperature: float,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        ref: nn.Module | None = None,
    ) -> None:
        self.descent, self.loss, self.kl, self.temperature = descent, loss, kl, temperature
        self.model, self.optimizer, self.ref = model, optimizer, ref

    def __call__(self, batch: Batch, step: int) -> dict[str, float]:
        """Returns the actor's metrics, each the mean over its optimiser steps."""
        d, w, model, lc = self.descent, self.descent.world, self.model, self.loss
        kl_in_loss = self.ref is not None and self.kl.coef > 0 and self.kl.target == "loss"
        model.train()
        dev = model_device(model)
        totals: dict[str, list[float]] = {k: [] for k in (*ACTOR_KEYS, "actor/grad_norm")}
        for _ in range(d.trainer.ppo_epochs):
            for mb, _ in d.minibatches(len(batch.problems)):
                mask_mb = batch.rows.response_mask[mb]
                norm = float(w.sum(loss_denominator(lc.agg, mask_mb)))
                # the NLL is normalised by the correct tokens of the whole mini-batch (VAPO §4.3)
                nll_norm = float(w.sum((mask_mb.sum(-1) * batch.correct[mb]).sum()))
                n_tok = float(w.sum(mask_mb.sum()))

                def run_pass(idx: Tensor | None) -> tuple[Tensor, dict[str, Any]]:
                    if idx is None:
                        dummy = policy_forward(model, Rows.dummy(dev), self.temperature)[0]
                        return dummy.sum() * 0.0, {}
                    rows = batch.rows.take(idx).to(dev)
                    t, mask = rows.response_ids.shape[1], rows.response_mask
                    grad = lc.entropy_coef > 0
                    logprobs, entropy = policy_forward(
                        model, rows, self.temperature, with_entropy=True, entropy_grad=grad
                    )
                    old = batch.old_logprobs[idx, :t].to(dev)
                    adv = batch.advantages[idx, :t].to(dev)
                    pg, m = ppo_policy_loss(
                        logprobs,
                        old,
                        adv,
                        mask,
                        eps_low=lc.eps_low,
                        eps_high=lc.eps_high,
                        dual_clip=lc.dual_clip,
                        loss_agg=lc.agg,
                        normalizer=norm,
                    )
                    loss, terms = pg, {}
                    if lc.mu > 0 and nll_norm > 0:
                        correct = batch.correct[idx].to(dev)
                        nll = positive_nll_loss(logprobs, mask, correct, normalizer=nll_norm)
                        loss = loss + lc.mu * nll
                        terms["actor/nll_loss"] = float(nll.detach())
                    if kl_in_loss:
                        ref = batch.ref_logprobs[idx, :t].to(dev)
                        est = kl_estimate(logprobs, ref, self.kl.estimator)
                        kl = aggregate_loss(est, mask, lc.agg, normalizer=norm)
                        loss = loss + self.kl.coef * kl
                        terms["actor/kl_loss"] = float(kl.detach())
                    if lc.entropy_coef > 0:
                        bonus = aggregate_loss(entropy, mask, "token-mean", normalizer=n_tok)
                        loss = loss - lc.entropy_coef * bonus
                    share = float(mask.sum()) / max(n_tok, 1.0)  # token-weighted averages
                    terms["actor/pg_loss"] = float(pg.detach())
                    terms["actor/entropy"] = float(masked_mean(entropy.detach(), mask)) * share
                    for k in ("clipfrac_low", "clipfrac_high", "clipfrac_dual", "approx_kl"):
                        terms[f"actor/{k}"] = float(m[k]) * share
                    return loss, terms

                zero = dict.fromkeys(ACTOR_KEYS, 0.0)
                micros = d.micro(mb, batch.rows)
                summed, grad_norm = d.step(
                    model, self.optimizer, micros, run_pass, zero, "actor/pg_loss", step
                )
                for k in ACTOR_KEYS:
                    totals[k].append(summed[k])
                totals["actor/grad_norm"].append(grad_norm)
        model.eval()
        return {k: sum(v) / len(v) for k, v in totals.items() if v}
