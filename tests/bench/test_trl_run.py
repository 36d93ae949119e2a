"""The benchmark's driver: the shared model, the report, and one slow end-to-end run against TRL."""

import json

import pytest

from vapo_lab.bench.trl.envs import default_python
from vapo_lab.bench.trl.run import (
    AS_SHIPPED,
    DIFFERENT_WORK,
    SAME_WORK,
    SideResult,
    compare,
    format_trl_benchmark,
    run_trl_benchmark,
)
from vapo_lab.bench.trl.spec import BenchSpec


def test_bench_model_has_the_default_size(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["vocab_size"] == 2827
    assert (model_dir / "tokenizer.json").is_file()


def test_report_puts_same_work_first_and_labels_the_rest():
    def side(name, seconds, tokens, **info):
        return SideResult(
            name, info={"torch": "2.13.0", **info}, seconds=seconds, tokens=tokens, rss_mib=600.0
        )

    trl = {"trl": "1.12.0", "trainer_module": "trl.experimental.ppo.ppo_trainer"}
    sides = {
        s.name: s
        for s in [
            side("vapo-lab PPO", [1.0, 1.0], [2048, 2048]),
            side("vapo-lab VAPO", [0.5, 0.5], [2048, 2048]),
            side("TRL PPOTrainer", [3.0, 3.0], [2048, 2048], gc_calls=2, gc_off=False, **trl),
            side("TRL PPOTrainer no-gc", [1.5, 2.5], [2048, 2048], gc_calls=2, gc_off=True, **trl),
        ]
    }
    text = format_trl_benchmark(
        {"spec": BenchSpec(), "model_params": 1_101_312, "steps": 2, "warmup": 1, "sides": sides}
    )
    assert "1.10M parameters" in text and "trl 1.12.0" in text
    rows = compare(sides)
    # the headline group first: PPO vs TRL without gc, 2 s / 1 s = 2x (met); then as shipped, 3x;
    # then VAPO, labelled different work and judged on no target
    assert [(r["group"], r["label"], r["theirs"]) for r in rows] == [
        (SAME_WORK, "PPO", "TRL PPOTrainer no-gc"),
        (AS_SHIPPED, "PPO", "TRL PPOTrainer"),
        (DIFFERENT_WORK, "VAPO", "TRL PPOTrainer no-gc"),
        (DIFFERENT_WORK, "VAPO", "TRL PPOTrainer"),
    ]
    assert [r["speedup"] for r in rows] == pytest.approx([2.0, 3.0, 4.0, 6.0], abs=1e-9)
    assert [r["tokens_ratio"] for r in rows] == pytest.approx([2.0, 3.0, 4.0, 6.0], abs=1e-9)
    assert text.index(SAME_WORK) < text.index(AS_SHIPPED) < text.index(DIFFERENT_WORK)
    headline = text.split(SAME_WORK)[1].split(AS_SHIPPED)[0]
    assert "target >= 2x" in headline and "2.00x" in headline and headline.count(" met") == 1
    # no verdict outside the headline
    assert "met" not in text.split(AS_SHIPPED)[1].split("s/step: mean")[0]
    assert (
        "2 gc.collect() call(s), replaced by no-ops" in text
        and "2 gc.collect() call(s), run as shipped" in text
    )
    assert "reference model" in text and "GRPO" not in text.split("What differs:")[1]


def _trl_envs_present() -> bool:
    return default_python("ppo").is_file() and default_python("grpo").is_file()


@pytest.mark.slow
@pytest.mark.skipif(
    not _trl_envs_present(), reason="TRL envs absent: create them with `vapo-lab bench trl --setup`"
)
def test_end_to_end_against_trl_one_step(small_spec):
    result = run_trl_benchmark(steps=1, warmup=0, spec=small_spec)
    sides = result["sides"]
    assert set(sides) == {
        "vapo-lab PPO",
        "vapo-lab VAPO",
        "TRL PPOTrainer",
        "TRL PPOTrainer no-gc",
        "vapo-lab GRPO",
        "TRL GRPOTrainer",
    }
    assert sides["TRL PPOTrainer"].info["trl"] == "1.12.0"
    # PPOTrainer's two per-step collections, disabled only in the no-gc side; GRPOTrainer has none
    assert (
        sides["TRL PPOTrainer"].info["gc_calls"]
        == sides["TRL PPOTrainer no-gc"].info["gc_calls"]
        == 2
    )
    assert (
        sides["TRL PPOTrainer no-gc"].info["gc_off"] and not sides["TRL PPOTrainer"].info["gc_off"]
    )
    assert sides["TRL GRPOTrainer"].info["gc_calls"] == 0
    for s in sides.values():
        assert len(s.seconds) == 1
        assert (
            small_spec.completions
            <= s.tokens[0]
            <= small_spec.completions * small_spec.max_new_tokens
        )
    assert "ratio" in format_trl_benchmark(result)
