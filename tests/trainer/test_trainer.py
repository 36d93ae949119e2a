"""The trainer end to end on a small embedded default: determinism, presets, faults."""

import json

import pytest

from tests.trainer.conftest import SMALL, last_metrics
from vapo_lab.config.compose import compose_config
from vapo_lab.errors import ConfigError
from vapo_lab.trainer import update
from vapo_lab.trainer.trainer import train
from vapo_lab.trainer.update import TrainingDiverged


def _train(workdir, name, algo=None, extra=(), **kw):
    composed = compose_config(algo=algo, overrides=[*SMALL, f"run_name={name}", *extra])
    return train(composed.cfg, composed.choices, log=lambda m: None, **kw)


def test_same_seed_gives_identical_metrics(workdir):
    a = _train(workdir, "det-a")
    b = _train(workdir, "det-b")
    ma, mb = last_metrics(a.run_dir), last_metrics(b.run_dir)
    assert sorted(ma) == [0, 1, 2, 3, 4]
    assert json.dumps(ma, sort_keys=True) == json.dumps(mb, sort_keys=True)
    # the run logged what the issue asks for
    step = ma[1]
    for key in (
        "rollout/reward",
        "rollout/accuracy",
        "rollout/response_length",
        "rollout/response_length_max",
        "rollout/truncated_frac",
        "actor/entropy",
        "critic/value_loss",
        "critic/explained_variance",
        "actor/clipfrac_low",
        "actor/clipfrac_high",
        "actor/approx_kl",
        "actor/grad_norm",
        "critic/grad_norm",
        "gae/lam_policy_mean",
        "adv/mean",
        "adv/std",
        "actor/lr",
        "critic/lr",
        "diag/value_bias/all",
        "diag/value_bias/000_007",
        "diag/length/count_000_007",
    ):
        assert key in step, key
    # the length profile counts every response of the step once
    counts = sum(v for k, v in step.items() if k.startswith("diag/length/count_"))
    assert counts == step["rollout/responses"]
    assert "eval/avg_at_2" in ma[2] and "eval/avg_at_2" in ma[0]
    assert a.checkpoint is not None and a.checkpoint.name == "step_000004"
    c = _train(workdir, "det-c", extra=["seed=1"])
    assert json.dumps(last_metrics(c.run_dir), sort_keys=True) != json.dumps(ma, sort_keys=True)


def test_deterministic_kernels_follow_the_config(workdir):
    # measured on the embedded default: without deterministic kernels two runs with identical
    # weights and inputs got different actor gradients at step 2 (CPU accumulation order)
    import torch

    _train(workdir, "kernels-off", extra=["trainer.total_steps=1", "trainer.deterministic=false"])
    assert not torch.are_deterministic_algorithms_enabled()
    _train(workdir, "kernels-on", extra=["trainer.total_steps=1"])
    assert torch.are_deterministic_algorithms_enabled()
    import torch.utils.deterministic

    assert torch.utils.deterministic.fill_uninitialized_memory is False


@pytest.mark.parametrize("algo", ["ppo", "dapo", "grpo"])
def test_presets_run_to_the_end(workdir, algo):
    result = _train(workdir, f"preset-{algo}", algo=algo, extra=["trainer.total_steps=2"])
    m = last_metrics(result.run_dir)
    assert sorted(m) == [0, 1, 2]
    assert ("critic/value_loss" in m[1]) == (algo == "ppo")
    if algo == "grpo":
        assert "actor/kl_loss" in m[1]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(workdir, monkeypatch):
    real = update.ppo_policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        # 16 responses / mini-batch 8 = 2 optimiser steps per training step: poison step 3
        return (loss * float("nan") if calls["n"] > 4 else loss), metrics

    monkeypatch.setattr(update, "ppo_policy_loss", poisoned)
    with pytest.raises(TrainingDiverged, match="at step 2.*last good checkpoint"):
        _train(workdir, "nan")
    ckpts = sorted(p.name for p in (workdir / "runs" / "nan" / "checkpoints").glob("step_*"))
    assert ckpts[-1] == "step_000002"


def test_bad_model_path_fails_before_compute(workdir):
    with pytest.raises(ConfigError, match="not a model directory"):
        _train(
            workdir,
            "bad",
            extra=["model=hf", "model.path=/nonexistent/model", "model.dtype=float32"],
        )


def test_group_size_must_divide_batch():
    with pytest.raises(ConfigError, match="not divisible by rollout.n_samples=3"):
        compose_config(overrides=[*SMALL, "rollout.group_size=3"])


def test_malformed_data_line_is_reported_with_its_number(workdir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": \n')
    composed = compose_config(
        overrides=[
            "task=math",
            f"task.train_path={data}",
            "task.n_eval=1",
            "model=hf",
            "model.path=/nonexistent",
            "tracking=none",
        ]
    )
    with pytest.raises(ConfigError, match=r"d.jsonl:2: not valid JSON"):
        train(composed.cfg, composed.choices, log=lambda m: None)


def test_vllm_backend_without_vllm_or_gpu_fails_in_one_line(workdir):
    from vapo_lab.rollout.vllm_backend import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="rollout.backend=builtin"):
        _train(workdir, "vllm", extra=["rollout=vllm"])


def test_prompt_plus_max_new_tokens_beyond_the_context_fails_before_compute(workdir, monkeypatch):
    import vapo_lab.trainer.setup as setup_module

    def no_build(*a, **k):
        raise AssertionError("the base model was built before the length check")

    monkeypatch.setattr(setup_module, "load_policy", no_build)
    # 3-digit problems: prompts of 9 tokens ("123+456=" and bos); 16 + 9 > 20
    with pytest.raises(
        ConfigError,
        match=r"longest prompt \(\d+ tokens, problem .*max_new_tokens=16 exceeds "
        r"the model's context of 20 tokens.*max_position_embeddings",
    ):
        _train(workdir, "ctx", extra=["model.arch.max_position_embeddings=20"])
    with pytest.raises(
        ConfigError, match="rollout.max_new_tokens=0 is out of range: it must be >= 1"
    ):
        _train(workdir, "ctx0", extra=["rollout.max_new_tokens=0"])


@pytest.mark.parametrize(
    "error, status, word",
    [(RuntimeError("boom"), "FAILED", "failed"), (KeyboardInterrupt(), "KILLED", "interrupted")],
)
def test_a_run_that_fails_or_is_interrupted_says_so(workdir, monkeypatch, error, status, word):
    from mlflow.tracking import MlflowClient

    from vapo_lab.trainer.trainer import Trainer

    real = Trainer.train_step

    def step(self):
        if self.step == 1:
            raise error
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", step)
    store = f"sqlite:///{workdir / 'status.db'}"
    name = f"fails-{status}"
    with pytest.raises(type(error)):
        _train(workdir, name, extra=["tracking=mlflow", f"tracking.uri={store}"])
    run_dir = workdir / "runs" / name
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert MlflowClient(store).get_run(run_id).info.status == status
    failure = (run_dir / "failure.txt").read_text()
    assert failure.startswith(f"{word} at step 1") and f"resume=runs/{name}" in failure
    monkeypatch.setattr(Trainer, "train_step", real)  # resumed, it finishes and the note goes
    from vapo_lab.runs.folder import resume_config

    train(*resume_config(run_dir), log=lambda m: None)
    assert MlflowClient(store).get_run(run_id).info.status == "FINISHED"
    assert not (run_dir / "failure.txt").exists()


def test_gradient_checkpointing_reaches_policy_and_critic_and_changes_no_metric(
    workdir, monkeypatch
):
    import vapo_lab.trainer.setup as setup_module

    real, enabled = setup_module.enable_checkpointing, []

    def spy(model):
        enabled.append(type(model).__name__)
        real(model)

    monkeypatch.setattr(setup_module, "enable_checkpointing", spy)
    plain = _train(workdir, "ckpt-off", extra=["trainer.total_steps=1"])
    assert enabled == []  # off by default
    checkpointed = _train(
        workdir, "ckpt-on", extra=["trainer.total_steps=1", "model.gradient_checkpointing=true"]
    )
    # the policy and the critic's backbone
    assert {"Qwen2ForCausalLM", "Qwen2Model"} <= set(enabled)
    a, b = last_metrics(plain.run_dir), last_metrics(checkpointed.run_dir)
    assert sorted(a) == sorted(b) == [0, 1]
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-6, abs=1e-9), step


def test_prompt_pool_draws_every_prompt_from_the_first_problems(workdir, monkeypatch):
    from vapo_lab.config.schema import typed
    from vapo_lab.trainer import collect
    from vapo_lab.trainer.setup import task_for

    seen = []
    take = collect.DataStream.take

    def record(self, n):  # the RL stream's draws (the reward model and critic draw from their own)
        out = take(self, n)
        seen.extend(out if len(self.problems) < 128 else [])
        return out

    monkeypatch.setattr(collect.DataStream, "take", record)
    composed = compose_config(overrides=[*SMALL, "trainer.prompt_pool=4", "trainer.total_steps=3"])
    _train(workdir, "pool", extra=["trainer.prompt_pool=4", "trainer.total_steps=3"])
    first = list(task_for(typed(composed.cfg).task).train)[:4]
    # 4 prompts a step (16 responses, 4 samples each) from a pool of 4: each of them once a step
    assert len(seen) == 12 and sorted(map(str, seen)) == sorted(map(str, first * 3))


@pytest.mark.parametrize(
    "pool, expect", [(3, "must hold one step's 4 prompts"), (129, "at most task.n_train=128")]
)
def test_prompt_pool_outside_its_range_is_refused_in_one_line(pool, expect):
    with pytest.raises(ConfigError, match=expect) as e:
        compose_config(overrides=[*SMALL, f"trainer.prompt_pool={pool}"])
    assert "\n" not in str(e.value)


def test_a_stop_before_a_steps_metrics_are_logged_reports_the_step_before(workdir, monkeypatch):
    # stopped at the evaluation's safe point after step 1 trained: its metrics were never logged
    # (a resume redoes it), so the run stopped after step 0, not 1
    from vapo_lab.trainer import trainer as trainer_module

    calls = []

    def stop_point(world, can_save, need_s=0.0):
        calls.append(can_save)
        if len(calls) == 3:  # base evaluation, before step 1, step 1's evaluation
            raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(trainer_module, "stop_point", stop_point)
    lines = []
    composed = compose_config(
        overrides=[*SMALL, "run_name=stop-early", "trainer.eval_every=1", "trainer.total_steps=2"]
    )
    with pytest.raises(KeyboardInterrupt):
        train(composed.cfg, composed.choices, log=lines.append)
    (line,) = [ln for ln in lines if ln.startswith("stopped after")]
    assert line.startswith("stopped after step 0 of 2 (SIGTERM): continue it with:")
    # only step 0's evaluation was logged
    assert set(last_metrics(workdir / "runs" / "stop-early")) == {0}
