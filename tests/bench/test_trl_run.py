"""The benchmark's driver: the shared model, the report, and one slow end-to-end run against TRL."""

import json

import pytest

from vapo_lab.bench.trl.envs import default_python
from vapo_lab.bench.trl.run import SideResult, compare, format_trl_benchmark, run_trl_benchmark
from vapo_lab.bench.trl.spec import BenchSpec


def test_bench_model_has_the_default_size(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["vocab_size"] == 2827
    assert (model_dir / "tokenizer.json").is_file()


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
def test_end_to_end_against_trl_one_step(small_spec):
    result = run_trl_benchmark(steps=1, warmup=0, spec=small_spec)
    sides = result["sides"]
    assert set(sides) == {"vapo-lab PPO", "vapo-lab VAPO", "TRL PPOTrainer", "vapo-lab GRPO", "TRL GRPOTrainer"}
    assert sides["TRL PPOTrainer"].info["trl"] == "1.12.0"
    for s in sides.values():
        assert len(s.seconds) == 1
        assert small_spec.completions <= s.tokens[0] <= small_spec.completions * small_spec.max_new_tokens
    assert "ratio" in format_trl_benchmark(result)
