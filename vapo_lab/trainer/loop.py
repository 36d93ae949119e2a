"""The training loop: VAPO, vanilla PPO, DAPO and GRPO from one loop.

``train_loop`` runs steps until ``trainer.total_steps``: held-out avg@k before the first step and
every ``eval_every`` steps, an atomic checkpoint every ``save_every`` steps. ``train_step`` is one
step's phases in order: rollout collection and scoring (:mod:`~vapo_lab.trainer.collect`,
:mod:`~vapo_lab.trainer.scoring`) -> critic values and reference log-probs -> advantages
(:mod:`~vapo_lab.trainer.advantages`) -> critic update -> actor update
(:mod:`~vapo_lab.trainer.update`) -> metrics. Every VAPO component is a config key read through
the maths in ``vapo_lab.algo``; no component logic is written here.

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
     whitened over the batch's valid tokens with the population std (``gae.whiten``; how that
     differs from verl: :mod:`vapo_lab.trainer.advantages`).

On many ranks (``trainer.strategy=fsdp``) every rank runs this loop on its share of the step's
prompts; metrics are reduced over ranks so that rank 0, which alone logs and tracks, records the
step's; the held-out evaluation runs on rank 0 with the sampler's full copy of the policy and is
sent to the others.
"""

from __future__ import annotations

import resource
import time

import torch
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vapo_lab import faults
from vapo_lab.algo import explained_variance, masked_mean
from vapo_lab.runs.checkpoint import latest_checkpoint
from vapo_lab.runs.folder import CHECKPOINTS
from vapo_lab.trainer.advantages import compute_advantages
from vapo_lab.trainer.checkpoints import save_run
from vapo_lab.trainer.collect import Batch, collect
from vapo_lab.trainer.diagnostics import (
    advantage_gap_from_sums,
    advantage_gap_sums,
    length_profile,
    value_bias_by_position,
    value_bias_from_sums,
    value_bias_sums,
)
from vapo_lab.trainer.evaluation import evaluate
from vapo_lab.trainer.forward import batched_logprobs, batched_values, passes

if TYPE_CHECKING:
    from vapo_lab.trainer.run import Run


@dataclass
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    run_id: str
    steps: int
    final_eval: float | None
    best_eval: float | None
    base_eval: float | None
    checkpoint: Path | None
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Returns the closing figures as JSON-able values (what ``vapo-lab train`` prints)."""
        return {"run_id": self.run_id, "run_dir": str(self.run_dir), "steps": self.steps,
                "base_eval": self.base_eval, "final_eval": self.final_eval, "best_eval": self.best_eval,
                "checkpoint": str(self.checkpoint) if self.checkpoint else None}


def train_loop(run: Run, on_step: Callable[[int, dict[str, float]], None] | None = None) -> TrainResult:
    """Returns the result of training ``run`` from its current step to ``trainer.total_steps``,
    calling ``on_step(step, metrics)`` after each step; the tracking run ends FINISHED, or FAILED /
    KILLED (with failure.txt) when a step raises."""
    cfg = run.cfg
    total = int(cfg.trainer.total_steps)
    key = f"eval/avg_at_{int(cfg.rollout.eval_samples)}"
    history: list[dict[str, Any]] = []
    base_eval = None
    checkpoint = None  # the one this call wrote last (no need to re-verify it at the end)
    try:
        if run.step == 0:
            e = _evaluate(run)
            base_eval = e[key]
            run.record.log_metrics(e, 0)
        while run.step < total:
            metrics = run.train_step()
            run.step += 1
            if run.step % int(cfg.trainer.eval_every) == 0 or run.step == total:
                e = _evaluate(run)
                metrics.update(e)
                run.best_eval = e[key] if run.best_eval is None else max(run.best_eval, e[key])
            run.record.log_metrics(metrics, run.step)
            history.append({"step": run.step, **metrics})
            if run.step % int(cfg.trainer.save_every) == 0 or run.step == total:
                checkpoint = save_run(run)
            if on_step and run.world.main:
                on_step(run.step, metrics)
    except BaseException as e:
        run.record.close_on_error(e, run.step)
        raise
    run.record.close("FINISHED", run.step)
    final = history[-1].get(key) if history else None
    return TrainResult(run.run_dir, run.run_id, run.step, final, run.best_eval, base_eval,
                       checkpoint or latest_checkpoint(run.run_dir / CHECKPOINTS), history)


def train_step(run: Run) -> dict[str, float]:
    """Returns the metrics of one step of ``run``: collect and score rollouts, value them, compute
    advantages, update the critic, then the actor (``run.step`` is the number of steps done)."""
    cfg, upcoming = run.cfg, run.step + 1
    t0 = time.perf_counter()
    world = run.world
    batch, m = collect(cfg, run.sampling, run.data, run.scorer, run.gen_rollout, world)
    t_rollout = time.perf_counter() - t0
    faults.point("rollout", upcoming)
    if int(world.sum(len(batch.problems))) == 0:
        return {**m, "rollout/empty_batch": 1.0}
    _model_outputs(run, batch)
    engine = run.sampling.engine
    if hasattr(engine, "sleep"):  # vLLM: free its KV cache (and weights) for the update
        engine.sleep()
    compute_advantages(cfg, batch, world)
    t1 = time.perf_counter()
    if run.critic is not None:
        m.update(_critic_metrics(run, batch))
        m.update(run.updater.critic_update(batch, run.step))
        run.critic_sched.step()
        m["critic/lr"] = run.critic_sched.get_last_lr()[0]
    t2 = time.perf_counter()
    faults.point("update", upcoming)
    m.update(run.updater.actor_update(batch, run.step))
    run.actor_sched.step()
    if run.sampling.engine is not None:
        run.sampling.engine.push_weights(run.policy)
    t3 = time.perf_counter()
    m.update(_batch_metrics(batch, run.actor_sched.get_last_lr()[0], t0, t_rollout, t1, t2, t3)
             if world.size == 1 else _global_batch_metrics(run, batch, t0, t_rollout, t1, t2, t3))
    _warn_about_lambda(run, m)
    return m


def _evaluate(run: Run) -> dict[str, float]:
    """The held-out evaluation after ``run.step`` steps (its sampling seed: seed·7919 + step); on
    many ranks rank 0 evaluates and sends the result to the others."""
    world = run.world
    result = None
    if world.main:
        result = evaluate(run.sampling.generate, run.tokenizer, run.task, run.scorer, run.cfg,
                          int(run.cfg.seed) * 7919 + run.step)
    return world.broadcast(result) if world.size > 1 else result


def _model_outputs(run: Run, batch: Batch) -> None:
    """Fills in the batch what the models say of its rows before any update: the policy's
    log-probs (recomputed where the sampler's engine computes them differently: vLLM), the
    critic's values, the reference policy's log-probs."""
    micro, temperature = int(run.cfg.trainer.micro_batch_size), float(run.cfg.rollout.temperature)
    n = passes(len(batch.problems), micro)
    extra = int(run.world.max(n)) - n if run.world.size > 1 else 0
    engine = run.sampling.engine
    if engine is not None and getattr(engine, "recompute_logprobs", True):
        batch.old_logprobs = batched_logprobs(run.policy, batch.rows, micro, temperature, extra)
    if run.critic is not None:
        batch.values = batched_values(run.critic, batch.rows, micro, extra)
    if run.ref is not None:
        batch.ref_logprobs = batched_logprobs(run.ref, batch.rows, micro, temperature, extra)


def _critic_metrics(run: Run, batch: Batch) -> dict[str, float]:
    """Returns the critic's explained variance of the returns and its mean value, over the valid
    tokens of all ranks."""
    mask, world = batch.rows.response_mask, run.world
    if world.size == 1:
        return {"critic/explained_variance": float(explained_variance(batch.values, batch.returns, mask)),
                "critic/value_mean": float(masked_mean(batch.values, mask))}
    valid = mask.bool()
    v, r = batch.values[valid].double(), batch.returns[valid].double()
    n = world.sum(float(v.numel())).clamp(min=1)
    sums = world.sum(torch.stack([v.sum(), r.sum(), (r * r).sum(), (r - v).sum(), ((r - v) ** 2).sum()]))
    var_r = sums[2] / n - (sums[1] / n) ** 2
    var_res = sums[4] / n - (sums[3] / n) ** 2
    ev = float(1 - var_res / var_r) if var_r > 0 else float("nan")
    return {"critic/explained_variance": ev, "critic/value_mean": float(sums[0] / n)}


def _global_batch_metrics(run: Run, batch: Batch, t0: float, t_rollout: float, t1: float, t2: float,
                          t3: float) -> dict[str, float]:
    """``_batch_metrics`` over the batches of all ranks: the per-response tensors (lengths, scores,
    correctness) gathered, token-level ones reduced as sums."""
    world = run.world
    mask = batch.rows.response_mask
    valid = mask.bool()
    gathered = world.gather((batch.scores.float(), batch.correct, batch.lengths, batch.truncated))
    scores, correct, lengths, truncated = (torch.cat([g[i] for g in gathered]) for i in range(4))
    adv = batch.advantages[valid].double()
    n_tok, a1, a2 = world.sum(torch.stack([torch.tensor(float(adv.numel()), dtype=torch.float64),
                                           adv.sum(), (adv * adv).sum()]))
    adv_std = float(((a2 - a1 * a1 / n_tok) / (n_tok - 1)).clamp(min=0).sqrt()) if n_tok > 1 else 0.0
    m = {
        "rollout/reward": float(scores.mean()), "rollout/accuracy": float(correct.float().mean()),
        "rollout/response_length": float(lengths.float().mean()),
        "rollout/response_length_max": float(lengths.float().max()),
        "rollout/truncated_frac": float(truncated.float().mean()), "rollout/responses": float(len(scores)),
        "adv/mean": float(a1 / n_tok.clamp(min=1)), "adv/std": adv_std,
        "actor/lr": run.actor_sched.get_last_lr()[0],
        "time/rollout_s": t_rollout, "time/critic_s": t2 - t1, "time/actor_s": t3 - t2,
        "time/step_s": t3 - t0, "perf/tokens_per_s": float(n_tok) / max(t_rollout, 1e-9),
        "perf/peak_rss_mb": float(world.max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)),
    }
    m.update({f"diag/length/{k}": v for k, v in length_profile(lengths, correct).items()})
    gap = advantage_gap_sums(batch.advantages, mask, batch.correct, batch.lengths)
    m.update({f"diag/adv_gap/{k}": v for k, v in advantage_gap_from_sums(world.sum(gap)).items()})
    if batch.mc_returns is not None:
        sums, counts = value_bias_sums(batch.values, batch.mc_returns, mask)
        m.update({f"diag/value_bias/{k}": v
                  for k, v in value_bias_from_sums(world.sum(sums), world.sum(counts)).items()})
    if batch.lam_policy is not None:
        m["gae/lam_policy_mean"] = world.mean(batch.lam_policy.double())
        m["gae/lam_policy_zero_frac"] = world.mean((batch.lam_policy == 0).double())
    return m


def _batch_metrics(batch: Batch, actor_lr: float, t0: float, t_rollout: float, t1: float, t2: float,
                   t3: float) -> dict[str, float]:
    """Returns the step's rollout, advantage, timing and diagnostic metrics (times: perf_counter
    at the step's start, after the critic's update and after the actor's; rollout seconds)."""
    mask = batch.rows.response_mask
    lengths = batch.lengths.float()
    n_tokens = float(mask.sum())
    m = {
        "rollout/reward": float(batch.scores.mean()), "rollout/accuracy": float(batch.correct.float().mean()),
        "rollout/response_length": float(lengths.mean()), "rollout/response_length_max": float(lengths.max()),
        "rollout/truncated_frac": float(batch.truncated.float().mean()),
        "rollout/responses": float(len(batch.problems)),
        "adv/mean": float(masked_mean(batch.advantages, mask)),
        "adv/std": float(batch.advantages[mask.bool()].std()) if n_tokens > 1 else 0.0,
        "actor/lr": actor_lr,
        "time/rollout_s": t_rollout, "time/critic_s": t2 - t1, "time/actor_s": t3 - t2,
        "time/step_s": t3 - t0, "perf/tokens_per_s": n_tokens / max(t_rollout, 1e-9),
        "perf/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
    }
    m.update({f"diag/length/{k}": v for k, v in length_profile(batch.lengths, batch.correct).items()})
    gap = advantage_gap_sums(batch.advantages, mask, batch.correct, batch.lengths)
    m.update({f"diag/adv_gap/{k}": v for k, v in advantage_gap_from_sums(gap).items()})
    if batch.mc_returns is not None:
        bias = value_bias_by_position(batch.values, batch.mc_returns, mask)
        m.update({f"diag/value_bias/{k}": v for k, v in bias.items()})
    if batch.lam_policy is not None:
        m["gae/lam_policy_mean"] = float(batch.lam_policy.mean())
        m["gae/lam_policy_zero_frac"] = float((batch.lam_policy == 0).float().mean())
    return m


def _warn_about_lambda(run: Run, m: dict[str, float]) -> None:
    """Warns once a run when most responses get λ_policy = 0 (length-adaptive GAE with too small an α)."""
    zero = m.get("gae/lam_policy_zero_frac", 0.0)
    if zero > 0.5 and not run.warned_lambda:
        run.warned_lambda = True
        alpha = run.cfg.gae.alpha
        run.log(f"warning: {100 * zero:.0f}% of responses get lambda_policy = 0 (one-step TD) at gae.alpha={alpha}: "
                f"responses shorter than 1/alpha = {1 / alpha:.0f} tokens. Raise gae.alpha to scale it to these lengths.")
