"""The trainer builds its models already sharded (no rank holds a whole copy) where vLLM samples,
and the run is the one it makes from whole models sharded afterwards, to the bit: GRPO's policy and
reference; VAPO's policy and critic (the reward model built from the policy's checkpoint, saved
from its shards, read back sharded, then value-pretrained and cached the same way)."""

import json
import sys
from pathlib import Path

import pytest

from tests.distributed.conftest import torchrun

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "rollout"))


@pytest.mark.parametrize("algo", ["grpo", "vapo"])
def test_a_vllm_run_over_two_ranks_builds_sharded_and_trains_as_the_whole_build(tmp_path, algo):
    from tests.rollout.conftest import save_tiny_model, vllm_config

    model = tmp_path / "model"
    save_tiny_model(vllm_config(), model)
    runs = {}
    for name, extra in (("sharded", ()), ("whole", ("--whole",))):
        torchrun(
            2,
            HERE / "rank_vllm_train.py",
            algo,
            str(model),
            str(tmp_path / name),
            *extra,
            timeout=600,
        )
        runs[name] = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in runs["sharded"]:
        assert rank["asked_sharded"] == [True] and rank["policy_sharded"]
        assert rank["ref_sharded"] == (algo == "grpo") and rank["critic_sharded"] == (
            algo == "vapo"
        )
    assert [m["step"] for m in runs["sharded"][0]["metrics"]] == [1, 2]
    # the engine slept through every pass and update: the RL steps', the reward model's and value
    # pretraining's alike
    assert all(rank["engine_awake_in"] == [] for run in runs.values() for rank in run)
    # the fake engine's ledger (weights + KV cache held on its pretend 80 GB GPU), phase by phase,
    # against the plan's figure for vLLM in that phase: its share where it samples, 0 elsewhere
    share = 0.5 * 80e9  # conf/rollout/vllm.yaml's gpu_memory_utilization
    for rank in runs["sharded"]:
        ledger, plan = rank["ledger"], rank["plan"]
        assert plan["rollout"] == plan["evaluation"] == share
        parts = {"step": "update", "reward-model build": "reward-model build"}
        parts["value pretraining"] = "value pretraining"
        for key, held in ledger.items():
            phase, part = key.split(": ")
            if part == "sampling":  # awake: the weights and the KV cache its share leaves
                bound = plan["evaluation" if phase == "evaluation" else "rollout"]
                assert 0 < held <= bound, key
            else:  # asleep through every pass and update
                bound = plan["model outputs" if part == "model outputs" else parts[phase]]
                assert held == bound == 0.0, key
        expected = {"step: sampling", "step: model outputs", "step: update", "evaluation: sampling"}
        if algo == "vapo":
            expected |= {
                "reward-model build: sampling",
                "reward-model build: update",
                "value pretraining: sampling",
                "value pretraining: model outputs",
                "value pretraining: update",
            }
        assert set(ledger) == expected
    if algo == "vapo":
        assert "critic/value_loss" in runs["sharded"][0]["metrics"][-1]
        for name in ("sharded", "whole"):  # the ranks built and cached both entries
            cache = tmp_path / name / ".vapo_cache"
            assert (
                len(list((cache / "reward_model").iterdir()))
                == len(list((cache / "pretrained_critic").iterdir()))
                == 1
            )
    # the same shards, so the same samples, updates and metrics, to the last bit
    assert runs["sharded"][0]["metrics"] == runs["whole"][0]["metrics"]
