"""`vapo-lab bench generate` (issue 48, item 3) on CPU at a tiny size: both engines generate exactly
the tokens asked, the report says how HF generate ran, a failed compile falls back to eager and
says so, and a missing GPU or an unknown shape is refused in one line."""

import pytest
import torch

from vapo_lab.bench.generate import format_generate_benchmark, run_generate_benchmark
from vapo_lab.errors import ConfigError

TINY = dict(prompts=2, samples=2, max_new_tokens=4, repeats=1, hidden_size=32, num_layers=1,
            intermediate_size=64)  # fmt: skip


def test_both_engines_generate_exactly_the_tokens_asked_and_the_report_says_how():
    r = run_generate_benchmark(**TINY)
    assert [e["engine"] for e in r["engines"]] == ["built-in sampler", "HF generate"]
    assert r["rows"] == 4 and r["device"] == "cpu" and r["dtype"] == "float32"
    assert r["hf_mode"] == "eager, dynamic cache"
    text = format_generate_benchmark(r)
    assert "tiny Qwen2" in text and "float32, cpu" in text and "HF generate: eager" in text


def test_a_failed_compile_is_measured_eagerly_and_said(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", refuse)
    r = run_generate_benchmark(**TINY, hf_compile=True)
    assert r["hf_mode"] == "eager, dynamic cache (static + compile failed: RuntimeError)"
    assert r["engines"][1]["tokens_per_s"] > 0


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)
def test_no_gpu_and_an_unknown_shape_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="--device cuda: no CUDA device here"):
        run_generate_benchmark(**TINY, device="cuda")
    with pytest.raises(ConfigError, match="--device tpu: choose cpu or cuda"):
        run_generate_benchmark(**TINY, device="tpu")
    with pytest.raises(ConfigError, match="Qwen2.5-0.5B"):
        run_generate_benchmark(**TINY, arch="Qwen9-1T")
