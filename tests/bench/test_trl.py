"""The vapo-lab vs TRL benchmark: everything that runs without the TRL envs, plus one slow end-to-end run."""

import json
import sys

import pytest
import torch
import typer
from typer.testing import CliRunner

from vapo_lab.bench.trl import (
    BenchSpec,
    SideResult,
    TrlBenchError,
    WorkerProcess,
    _verifier_reward_model,
    _worker_argv,
    _worker_env,
    bench_config,
    bench_task,
    build_bench_model,
    compare,
    default_python,
    format_trl_benchmark,
    our_overrides,
    run_trl_benchmark,
)
from vapo_lab.bench.trl_cli import bench_trl
from vapo_lab.cli import _cli_errors

# 8 completions of <= 4 tokens, 2-digit problems: a step takes well under a second
SMALL = BenchSpec(completions=8, max_new_tokens=4, group_size=4, mini_batch_size=4, threads=1, digits=2,
                  n_problems=32)


def _app() -> typer.Typer:
    """The command as cli.py registers it, in an app of its own."""
    app = typer.Typer()
    app.callback()(lambda: None)
    app.command("trl")(_cli_errors(bench_trl))
    return app


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench-model")
    build_bench_model(path, seed=0)
    return path


def test_missing_trl_env_fails_in_one_line_naming_the_setup_command(tmp_path):
    result = CliRunner().invoke(_app(), ["trl", "--part", "ppo", "--trl-python", str(tmp_path / "nope/bin/python")])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "vapo-lab bench trl --setup" in lines[0] and "trl==1.12.0" in lines[0]


def test_missing_default_env_is_named(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .bench-venv/ here
    result = CliRunner().invoke(_app(), ["trl", "--part", "grpo"])
    assert result.exit_code == 1
    assert str(default_python("grpo")) in result.output and "--setup" in result.output


def test_bench_model_has_the_default_size(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["vocab_size"] == 2827
    assert (model_dir / "tokenizer.json").is_file()


@pytest.mark.parametrize("algo, n_samples, kl", [("ppo", 1, 0.05), ("vapo", 8, 0.0), ("grpo", 8, 0.04)])
def test_our_config_does_the_benchmark_work(tmp_path, algo, n_samples, kl):
    cfg = bench_config(algo, tmp_path, BenchSpec(), tmp_path).cfg
    assert cfg.algo.name == algo
    assert (cfg.rollout.responses_per_step, cfg.rollout.max_new_tokens, cfg.rollout.n_samples) == (64, 32, n_samples)
    assert (cfg.trainer.ppo_epochs, cfg.trainer.mini_batch_size, cfg.trainer.threads) == (1, 16, 2)
    assert cfg.model.dtype == "float32" and cfg.kl.coef == kl and cfg.tracking.backend == "none"
    assert not cfg.critic.pretrain.enabled


def test_bench_prompts_have_one_length():
    task = bench_task(BenchSpec())
    assert {len(p.prompt.split()) for p in task.train} == {22}  # 10 x-words, +, 10 y-words, =


def test_verifier_reward_model_grades_and_counts_like_ppo_trainer_reads_it(model_dir):
    from transformers import AutoTokenizer

    # PPOTrainer: score(getattr(m, m.base_model_prefix)(input_ids, attention_mask, ...).hidden_states[-1])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    task = bench_task(SMALL)
    right, wrong = task.train[0], task.train[1]
    counter = [0]
    model = _verifier_reward_model(tokenizer, task, counter)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [tokenizer(p.prompt)["input_ids"] + tokenizer(task.trace(p))["input_ids"] + [eos]
            for p in (right, wrong)]
    rows[1][-3] = tokenizer.convert_tokens_to_ids("0" if rows[1][-3] != tokenizer.convert_tokens_to_ids("0") else "1")
    width = max(map(len, rows)) + 2
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = ids != pad
    hidden = getattr(model, model.base_model_prefix)(input_ids=ids.masked_fill(~mask, 0), attention_mask=mask,
                                                     position_ids=None, return_dict=True,
                                                     output_hidden_states=True, use_cache=False).hidden_states[-1]
    last = mask.sum(-1) - 1
    assert model.score(hidden)[torch.arange(2), last].squeeze(-1).tolist() == [1.0, 0.0]
    prompt_len = [len(tokenizer(p.prompt)["input_ids"]) for p in (right, wrong)]
    assert counter[0] == sum(len(r) - n for r, n in zip(rows, prompt_len))  # response tokens, eos included


def test_our_worker_runs_steps_over_the_pipe(model_dir, tmp_path):
    argv = _worker_argv(sys.executable, "ours-ppo", model_dir, SMALL, tmp_path)
    worker = WorkerProcess("ours-ppo", argv, tmp_path / "worker.log", _worker_env(SMALL))
    try:
        ready = worker.recv(timeout=300)
        assert ready["event"] == "ready" and ready["side"] == "vapo-lab" and ready["reference_model"]
        assert ready["threads"] == 1 and 1.0e6 < ready["policy_params"] < 1.2e6
        worker.send(cmd="run", steps=2)
        done = worker.recv(timeout=300)
    finally:
        worker.close()
    assert done["event"] == "done" and len(done["seconds"]) == len(done["tokens"]) == 2
    assert all(s > 0 for s in done["seconds"]) and done["rss_mib"] > 50
    # every completion has 1..4 tokens (eos counted)
    assert all(SMALL.completions <= t <= SMALL.completions * SMALL.max_new_tokens for t in done["tokens"])


def test_dead_worker_is_one_line_error_with_its_last_words(tmp_path):
    worker = WorkerProcess("broken", [sys.executable, "-c", "import sys; sys.exit('boom: no model')"],
                           tmp_path / "w.log", _worker_env(SMALL))
    with pytest.raises(TrlBenchError, match=r"worker broken exited with code 1: boom: no model") as info:
        worker.recv(timeout=60)
    worker.close()
    assert "\n" not in str(info.value)


def test_report_gives_ratios_and_the_differences():
    def side(name, seconds, tokens, **info):
        return SideResult(name, info={"torch": "2.13.0", **info}, seconds=seconds, tokens=tokens, rss_mib=600.0)

    sides = {s.name: s for s in [
        side("vapo-lab PPO", [1.0, 1.0], [2048, 2048]),
        side("vapo-lab VAPO", [2.0, 2.0], [2048, 2048]),
        side("TRL PPOTrainer", [3.0, 3.0], [2048, 2048], trl="1.12.0"),
    ]}
    text = format_trl_benchmark({"spec": BenchSpec(), "model_params": 1_101_312, "steps": 2, "warmup": 1,
                                 "sides": sides})
    assert "1.10M parameters" in text and "trl 1.12.0" in text
    # TRL 3 s/step vs ours 1 s: 3x (met); vs VAPO 2 s: 1.5x (not met); tokens/s ratios the same
    rows = compare(sides)
    assert [r["label"] for r in rows] == ["PPO", "VAPO"]
    assert [r["speedup"] for r in rows] == pytest.approx([3.0, 1.5], abs=1e-9)
    assert [r["tokens_ratio"] for r in rows] == pytest.approx([3.0, 1.5], abs=1e-9)
    assert text.count("NOT met") == 1 and "3.00x" in text and "1.50x" in text
    assert "reference model" in text and "GRPO" not in text.split("What differs:")[1]


def _trl_envs_present() -> bool:
    return default_python("ppo").is_file() and default_python("grpo").is_file()


@pytest.mark.slow
@pytest.mark.skipif(not _trl_envs_present(), reason="TRL envs absent: create them with `vapo-lab bench trl --setup`")
def test_end_to_end_against_trl_one_step():
    result = run_trl_benchmark(steps=1, warmup=0, spec=SMALL)
    sides = result["sides"]
    assert set(sides) == {"vapo-lab PPO", "vapo-lab VAPO", "TRL PPOTrainer", "vapo-lab GRPO", "TRL GRPOTrainer"}
    assert sides["TRL PPOTrainer"].info["trl"] == "1.12.0"
    for s in sides.values():
        assert len(s.seconds) == 1 and SMALL.completions <= s.tokens[0] <= SMALL.completions * SMALL.max_new_tokens
    assert "ratio" in format_trl_benchmark(result)
