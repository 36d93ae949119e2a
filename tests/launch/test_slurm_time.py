"""A Slurm cell's time planned from its plan: a time limit in which an attempt cannot make progress
refused before submitting, Slurm's warning sized for the longest unit of work and its save, and the
CPUs of a vLLM rank."""

import math

import pytest
from omegaconf import OmegaConf

from vapo_lab.config.attempt import ENGINE_START_S, SLURM_TIMER_S, attempt_times, write_seconds
from vapo_lab.config.compose import compose_config
from vapo_lab.config.plan import plan_run
from vapo_lab.launch.base import LaunchError
from vapo_lab.launch.cell import slurm_seconds
from vapo_lab.launch.slurm import check_time, group_cpus, group_signal_delay
from vapo_lab.stop import STOP_MARGIN_S

GPU = {"gpus_per_task": 1}


def _config(*overrides: str) -> dict:
    cfg = compose_config(overrides=list(overrides), check=False).cfg
    return OmegaConf.to_container(cfg, resolve=True)


def _times(config):
    cfg = OmegaConf.create(config)
    plan = plan_run(cfg, 80e9, device="cuda")
    return plan, attempt_times(plan, cfg)


def test_an_attempt_needs_start_up_its_longest_unit_and_that_units_save():
    plan, t = _times(_config("scale=small-gpu"))
    fp = plan.footprint
    # start-up: float32 actor + critic (no reference at kl.coef 0) read at 1 GB/s, + the engine
    weights = 4 * (fp.actor_params + fp.critic_params)
    assert fp.reference_params == 0 and t.startup == weights / 1e9 + ENGINE_START_S
    assert t.step == fp.rollout_seconds + fp.update_seconds and t.save == write_seconds(plan)
    # value pretraining: a step's rollout, then more than a critic-only update
    assert fp.rollout_seconds < t.pretrain_step < t.step
    assert t.critic_save == 12 * fp.critic_params / 1e9
    assert t.evaluation == fp.eval_seconds > 0
    longest = max(
        t.step + t.evaluation + t.save, t.rm_round + t.critic_save, t.pretrain_step + t.critic_save
    )
    assert t.least_limit == t.startup + longest + STOP_MARGIN_S
    assert t.warning == math.ceil(longest + STOP_MARGIN_S + SLURM_TIMER_S)
    assert t.critic_start == 20 * t.rm_round + 50 * t.pretrain_step


def test_a_time_limit_an_attempt_cannot_progress_in_is_refused_before_submitting():
    paper = _config("scale=paper")
    _, t = _times(paper)
    least = math.ceil(t.least_limit / 60)  # a paper-scale step is ~1.65 h
    with pytest.raises(LaunchError) as e:
        check_time(paper, {**GPU, "time_min": least - 1}, "vapo")
    text = str(e.value)
    assert "\n" not in text and f"launcher.slurm.time_min={least}" in text
    assert "nothing was submitted" in text
    check_time(paper, {**GPU, "time_min": 24 * 60, "max_requeues": 1000}, "vapo")
    # a CPU cell has no GPU plan of its times: nothing refused, the in-job clock decides
    check_time(_config(), {"time_min": 1}, "vapo")


def test_a_run_needing_more_attempts_than_the_requeues_allow_is_refused():
    small = _config("scale=small-gpu")
    _, t = _times(small)
    n = t.attempts(3600)
    assert n is not None and n > 101  # 1,000 steps of ~6.7 min in 1-hour attempts
    with pytest.raises(LaunchError, match=rf"set launcher.slurm.max_requeues={n}"):
        check_time(small, {**GPU, "time_min": 60, "max_requeues": 100}, "vapo")
    check_time(small, {**GPU, "time_min": 60, "max_requeues": n}, "vapo")


def test_the_warning_comes_from_the_plan_unless_set_and_vllm_ranks_get_eight_cpus():
    small = _config("scale=small-gpu")
    _, t = _times(small)
    assert group_signal_delay([small, _config()], GPU) == t.warning
    assert group_signal_delay([small], {**GPU, "signal_delay_s": 300}) == 300
    assert group_signal_delay([_config()], {}) == 120  # CPU cells: no plan of their times
    vllm = _config("rollout=vllm")
    assert group_cpus([vllm, _config()], {}) == 8 and group_cpus([_config()], {}) == 2
    assert group_cpus([vllm], {"cpus_per_task": 4}) == 4


def test_slurms_time_left_reads_in_seconds():
    assert slurm_seconds("3:00") == 180 and slurm_seconds("1:02:03") == 3723
    assert slurm_seconds("2-01:00:00") == 2 * 86400 + 3600
    assert slurm_seconds("UNLIMITED") is None and slurm_seconds("NOT_SET") is None
