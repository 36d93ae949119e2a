"""The time budget of one attempt of a Slurm job: what a run's plan says its start-up, the critic's
start, a step and a save take, the least time limit in which an attempt still makes progress, and
Slurm's warning sized for the longest unit of work plus its save.

Every attempt makes progress when its time limit holds the start-up, the longest unit (a
reward-model round, a value-pretraining step or an RL step with its evaluation) and that unit's
save: the critic's start saves its rounds and the run its steps (``vapo_lab.trainer.building``,
``vapo_lab.stop``), so a start of many hours spans attempts instead of being lost with each. The
times are the plan's roofline estimates on ``Hardware`` (an H100), GPU ranks only; inside a job the
run measures its own (``stop.AttemptClock``) and stops before the time limit by those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vapo_lab.models.counts import forward_flops_per_token, trained_flops_per_token
from vapo_lab.stop import STOP_MARGIN_S

if TYPE_CHECKING:
    from vapo_lab.config.plan import RunPlan

# what a job does before its first unit of work beyond reading the weights: start Python, join
# the ranks, build and compile vLLM's engine and capture its graphs (an assumption, as the rates)
ENGINE_START_S = 180.0
# Slurm's --signal takes up to 65,535 s (sbatch(1), --signal=[{R|B}:]<sig_num>[@sig_time])
MAX_SIGNAL_S = 65535
# the warning may come up to a minute early: Slurm checks time limits on a timer
SLURM_TIMER_S = 60.0


@dataclass(frozen=True)
class AttemptTimes:
    """A run's units of work, in seconds, as its plan estimates them (0: the run has none)."""

    startup: float  # read the weights and build the engine
    rm_round: float
    rm_rounds: int
    pretrain_step: float
    pretrain_steps: int
    critic_save: float  # the critic-start's save: the critic and its optimiser
    step: float  # an RL step: rollout + update
    evaluation: float  # a held-out evaluation (before the first step, every eval_every)
    save: float  # a training checkpoint
    total_steps: int
    eval_every: int

    @property
    def critic_start(self) -> float:
        return self.rm_round * self.rm_rounds + self.pretrain_step * self.pretrain_steps

    @property
    def least_limit(self) -> float:
        """Returns the least time limit in which an attempt makes progress: the start-up, then the
        longest unit of work (a step counted with an evaluation) and its save, then the stop's
        margin."""
        units = [(self.step + self.evaluation, self.save)]
        units += [(u, self.critic_save) for u in (self.rm_round, self.pretrain_step) if u]
        return self.startup + max(u + s for u, s in units) + STOP_MARGIN_S

    @property
    def warning(self) -> int:
        """Returns the seconds before the time limit Slurm's warning should come: the longest unit
        in flight and its save still fit, whatever the timer's minute."""
        units = [self.step + self.evaluation + self.save, self.rm_round + self.critic_save]
        units.append(self.pretrain_step + self.critic_save)
        need = max(units) + STOP_MARGIN_S + SLURM_TIMER_S
        return MAX_SIGNAL_S if not need < MAX_SIGNAL_S else math.ceil(need)  # inf: no rollout

    def attempts(self, limit_s: float) -> int | None:
        """Returns how many attempts of ``limit_s`` the whole run takes (None: it makes none)."""
        usable = limit_s - self.startup - STOP_MARGIN_S
        evaluations = 1 + self.total_steps // max(1, self.eval_every)
        work = self.critic_start + self.total_steps * self.step + evaluations * self.evaluation
        if not limit_s >= self.least_limit or usable <= 0 or not math.isfinite(work):
            return None
        # each attempt ends with a save: a training checkpoint's or the critic start's
        return max(1, math.ceil(work / max(usable - max(self.save, self.critic_save), 1.0)))


def write_seconds(p: RunPlan) -> float:
    """Returns a save's seconds: its bytes over the nodes' write bandwidth (ranks write at once)."""
    return p.footprint.checkpoint_bytes / (_nodes(p) * p.hardware.write_bandwidth)


def _nodes(p: RunPlan) -> int:
    s = p.setup
    return max(1, (s.world if s.strategy == "fsdp" else 1) // max(1, s.ranks_per_node))


def attempt_times(p: RunPlan, cfg: Any) -> AttemptTimes:
    """Returns the units of work of the run ``cfg`` as its plan ``p`` estimates them."""
    fp, s, hw, shape = p.footprint, p.setup, p.hardware, p.shape
    world = s.world if s.strategy == "fsdp" else 1
    rate = hw.flops * hw.flops_share
    critic = fp.critic_params
    seq = fp.sequence
    trained = trained_flops_per_token(shape, critic, seq, s.gradient_checkpointing) if critic else 0
    forward = forward_flops_per_token(shape, critic, seq) if critic else 0
    c = cfg.critic
    rm_round = pretrain = 0.0
    if s.reward_model:
        # a round samples rm_batch responses (in the waves an engine decodes) and fits them once
        rows = math.ceil(int(c.rm_batch) / world)
        tp = fp.requests_per_engine // max(1, fp.responses_per_rank)
        at_once = max(1, fp.sequences_at_once)
        waves = math.ceil(rows * tp / at_once)
        rollout = fp.rollout_seconds * waves / math.ceil(fp.requests_per_engine / at_once)
        rm_round = rollout + rows * seq * trained / rate
    if s.value_pretraining:
        # a step samples the run's batch, values it and takes the critic's updates
        pretrain = (
            fp.rollout_seconds
            + fp.responses_per_rank * seq * (forward + s.ppo_epochs * trained) / rate
        )
    weights = (fp.actor_params + critic + fp.reference_params) * 4  # float32, or less
    startup = weights / (_nodes(p) * hw.write_bandwidth) + ENGINE_START_S
    critic_bytes = 12 * critic  # float32 weights and AdamW's m, v
    return AttemptTimes(
        startup=startup,
        rm_round=rm_round,
        rm_rounds=int(c.rm_steps) if s.reward_model else 0,
        pretrain_step=pretrain,
        pretrain_steps=int(c.pretrain.steps) if s.value_pretraining else 0,
        critic_save=critic_bytes / (_nodes(p) * hw.write_bandwidth),
        step=fp.step_seconds,
        evaluation=fp.eval_seconds,
        save=write_seconds(p),
        total_steps=s.total_steps,
        eval_every=int(cfg.trainer.eval_every),
    )


def budget_rows(t: AttemptTimes, limit_s: float, duration: Any) -> list[tuple[str, str, str]]:
    """Returns the plan's rows of an attempt's time budget at a ``limit_s`` time limit
    (``duration`` formats seconds)."""
    rows = [
        (
            "time: start-up an attempt",
            duration(t.startup),
            f"weights read at the write rate + {ENGINE_START_S:.0f} s to start the ranks and "
            "the engine (an assumption)",
        )
    ]
    if t.rm_rounds or t.pretrain_steps:
        rows.append(
            (
                "time: the critic's start",
                duration(t.critic_start),
                f"{t.rm_rounds} reward-model rounds x {duration(t.rm_round)} + {t.pretrain_steps} "
                f"value-pretraining steps x {duration(t.pretrain_step)}; saved every "
                f"critic.save_every rounds and at a stop ({duration(t.critic_save)} a save)",
            )
        )
    n = t.attempts(limit_s)
    verdict = (
        f"{n} attempt(s) for the whole run"
        if n is not None
        else f"too short: an attempt needs at least {duration(t.least_limit)}"
    )
    rows.append(
        (
            "time: an attempt",
            f"{duration(limit_s)} limit: {verdict}",
            f"launcher.slurm.time_min; at least start-up + the longest unit + its save + "
            f"{STOP_MARGIN_S:.0f} s = {duration(t.least_limit)}; Slurm's warning "
            f"{t.warning} s before the limit (the longest unit + its save + the margin + "
            f"{SLURM_TIMER_S:.0f} s of Slurm's timer)",
        )
    )
    return rows
