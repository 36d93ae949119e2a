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
from typing import Any

import torch
from torch import Tensor

from vapo_lab.algo import masked_sum
from vapo_lab.distributed.world import World
from vapo_lab.models.counts import actor_params, critic_params, trained_flops_per_token
from vapo_lab.models.peaks import peak_flops
from vapo_lab.models.shapes import Shape
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
    """``perf_counter`` readings of one step: its start, and after the rollout, the model-output
    passes, the critic's update (and before it), the actor's and the weight push."""

    start: float
    rollout: float
    outputs: float
    critic_start: float
    critic_end: float
    actor_end: float
    pushed: float


@dataclass(frozen=True)
class StageRates:
    """What a step's per-stage throughput and MFU are computed from: the models' shape and
    parameter counts (FLOPs as ``vapo-lab plan`` counts them), PPO epochs, and the device's peak
    FLOP/s in the compute dtype (None on CPU or an unknown device: no MFU)."""

    shape: Shape
    actor_params: int
    critic_params: int  # 0 without a critic
    ppo_epochs: int
    peak_flops: float | None

    def metrics(
        self, generated: float, prompts: float, n_rows: int, world: World, times: StepTimes
    ) -> dict[str, float]:
        """Returns tokens/s per device of generation (``generated`` response tokens over all
        ranks, the rollout phase: scoring included), the model-output passes and the updates
        (sequence tokens, response + ``prompts``, each once a pass or epoch), the weight push's
        seconds, and the updates' MFU where the peak is known."""
        sequences = generated + prompts
        devices = world.size
        gen_s = times.rollout - times.start
        pass_s = times.outputs - times.rollout
        train_s = (times.critic_end - times.critic_start) + (times.actor_end - times.critic_end)
        trained = 1 + (1 if self.critic_params else 0)
        m = {
            "time/outputs_s": pass_s,
            "time/push_s": times.pushed - times.actor_end,
            "perf/gen_tokens_per_s_per_device": generated / max(gen_s, 1e-9) / devices,
            "perf/pass_tokens_per_s_per_device": sequences / max(pass_s, 1e-9) / devices,
            "perf/train_tokens_per_s_per_device": trained
            * self.ppo_epochs
            * sequences
            / max(train_s, 1e-9)
            / devices,
        }
        if self.peak_flops and n_rows:
            mean_sequence = sequences / n_rows
            per_token = sum(
                trained_flops_per_token(self.shape, params, mean_sequence, recompute=False)
                for params in (self.actor_params, self.critic_params)
                if params
            )
            flops = self.ppo_epochs * per_token * sequences
            m["perf/mfu"] = flops / (max(train_s, 1e-9) * self.peak_flops * devices)
        return m


STAGES = (
    "perf/gen_tokens_per_s_per_device",
    "perf/pass_tokens_per_s_per_device",
    "perf/train_tokens_per_s_per_device",
    "perf/mfu",
    "time/push_s",
)


def stage_summary(history: list[dict[str, Any]]) -> dict[str, float]:
    """Returns the mean over a run's steps of each per-stage rate it logged (``STAGES``)."""
    out = {}
    for key in STAGES:
        values = [m[key] for m in history if key in m]
        if values:
            out[key] = sum(values) / len(values)
    return out


def read_model_shape(model: torch.nn.Module) -> Shape:
    """Returns the shape of an HF causal LM from its own config (a multimodal one's text part)."""
    hf = model.config
    return Shape.from_hf_config((getattr(hf, "text_config", None) or hf).to_dict())


def stage_rates(policy: torch.nn.Module, critic: bool, ppo_epochs: int, dtype: str) -> StageRates:
    """Returns the ``StageRates`` of a run of ``policy`` (an HF causal LM) on its device."""
    shape = read_model_shape(policy)
    device = next(policy.parameters()).device
    peak = peak_flops(torch.cuda.get_device_name(device), dtype) if device.type == "cuda" else None
    critic_n = critic_params(shape) if critic else 0
    return StageRates(shape, actor_params(shape), critic_n, ppo_epochs, peak)


def step_metrics(
    batch: Batch, world: World, actor_lr: float, times: StepTimes, rates: StageRates | None = None
) -> dict[str, float]:
    """Returns the step's rollout, advantage, timing, per-stage throughput (with ``rates``) and
    diagnostic metrics over all ranks' batches."""
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
        "time/step_s": times.pushed - times.start,
        "perf/tokens_per_s": n_tokens / max(rollout_s, 1e-9),
        "perf/peak_rss_mb": float(
            world.max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        ),  # KiB
    }
    if rates is not None:
        prompts = float(world.sum(float(batch.rows.prompt_mask.sum())))
        m.update(rates.metrics(n_tokens, prompts, len(scores), world, times))
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
    if batch.sampler_logprobs is not None:
        m.update(sampler_agreement(batch, world))
    if batch.lam_policy is not None:
        m["gae/lam_policy_mean"] = world.mean(batch.lam_policy)
        m["gae/lam_policy_zero_frac"] = world.mean((batch.lam_policy == 0).float())
    return m


def sampler_agreement(batch: Batch, world: World) -> dict[str, float]:
    """Returns how far the sampler's log-probs (vLLM's, or a bf16 sampler's) are from the policy's
    recomputed ones, PPO's old log-probs, over the valid tokens of all ranks: the mean and max
    |gap|, and the ratio pi_policy / pi_sampler's range and spread, the first update's ratio had
    the sampler's log-probs been PPO's old ones (verl logs the same as rollout_probs_diff)."""
    mask = batch.rows.response_mask
    diff = batch.old_logprobs.double() - batch.sampler_logprobs.to(batch.old_logprobs).double()
    valid = diff[mask.bool()]
    # a rank with no valid token takes each reduction's neutral element
    big = torch.tensor(float("inf"), dtype=torch.float64, device=diff.device)
    top, low = (valid.max(), valid.min()) if valid.numel() else (-big, big)
    return {
        "diag/sampler/logprob_gap_mean": _mean(world, diff.abs(), mask),
        "diag/sampler/logprob_gap_max": float(
            world.max(valid.abs().max() if valid.numel() else 0.0)
        ),
        "diag/sampler/ratio_max": float(world.max(top).exp()),
        "diag/sampler/ratio_min": float((-world.max(-low)).exp()),
        "diag/sampler/ratio_std": world.std(valid.exp()),
    }


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
