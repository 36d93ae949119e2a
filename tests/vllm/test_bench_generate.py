"""`vapo-lab bench generate --engines builtin,vllm,hf` on the real vLLM engine (its CPU build, the
environment of scripts/vllm-env.sh), at the embedded default's shape and a few rows: every engine
generates exactly the tokens asked, and torch's thread setting still works after vLLM's build."""

import pytest
import torch

from vapo_lab.bench.generate import format_generate_benchmark, run_generate_benchmark

pytestmark = pytest.mark.vllm


def test_vllm_beside_the_built_in_sampler_and_hf_generate_on_the_tiny_model():
    threads = torch.get_num_threads()
    r = run_generate_benchmark(
        prompts=2,
        samples=2,
        max_new_tokens=8,
        repeats=1,
        engines="builtin,vllm,hf",
        vllm_eager=True,
    )
    assert [e["engine"] for e in r["engines"]] == ["built-in sampler", "vLLM", "HF generate"]
    assert r["rows"] == 4 and r["threads"] == 1 and r["vllm_build_s"] > 0
    assert r["engines"][1]["mode"].endswith("in-process, eager")
    assert all(e["tokens_per_s"] > 0 for e in r["engines"])
    assert "ratio built-in / vLLM:" in format_generate_benchmark(r)
    # vLLM's CPU worker makes torch.set_num_threads a no-op; the engine's build puts it back
    assert torch.get_num_threads() == threads
    torch.set_num_threads(threads + 1)
    assert torch.get_num_threads() == threads + 1
    torch.set_num_threads(threads)
