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


def test_hf_eager_is_timed_and_reported_before_a_compile_starts(monkeypatch):
    """A compile cut short (here: interrupted as a step's time limit would) still leaves the eager
    ratio, reported before the compile began."""
    reported = []

    def interrupted(*args, **kwargs):
        assert len(reported) == 1  # the eager result is out before the compile starts
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "compile", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_generate_benchmark(**TINY, hf_compile=True, partial=reported.append)
    [eager] = reported
    assert [e["engine"] for e in eager["engines"]] == ["built-in sampler", "HF generate"]
    assert eager["hf_mode"].startswith("eager, dynamic cache; static cache + torch.compile next")
    ours, hf = (e["tokens_per_s"] for e in eager["engines"])
    assert eager["ratio_tokens_per_s"] == pytest.approx(ours / hf)


def test_a_compiled_hf_generate_is_timed_after_the_eager_one_and_the_ratio_takes_the_faster(
    monkeypatch,
):
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # "compiled": the same forward
    r = run_generate_benchmark(**TINY, hf_compile=True)
    names = [e["engine"] for e in r["engines"]]
    assert names == ["built-in sampler", "HF generate", "HF generate, compiled"]
    fastest = max(r["engines"][1:], key=lambda e: e["tokens_per_s"])
    assert r["ratio_tokens_per_s"] == pytest.approx(
        r["engines"][0]["tokens_per_s"] / fastest["tokens_per_s"]
    )
    assert r["hf_mode"] == fastest["mode"]


def test_the_grid_builds_its_model_once_for_every_setting(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import vapo_lab.bench.generate as generate
    from vapo_lab.cli import app

    built, seen = [], []

    def build(*args, **kwargs):
        built.append(object())
        return built[-1]

    def run(**kwargs):
        seen.append((kwargs["prompts"], kwargs["max_new_tokens"], kwargs["built"]))
        result = {"rows": kwargs["prompts"] * kwargs["samples"], "max_new_tokens": 1}
        kwargs["partial"](result)  # the eager result, as a GPU run reports it
        return result

    monkeypatch.setattr(generate, "bench_model", build)
    monkeypatch.setattr(generate, "run_generate_benchmark", run)
    monkeypatch.setattr(generate, "format_generate_benchmark", lambda r: "a result")
    out = tmp_path / "f.jsonl"
    result = CliRunner().invoke(app, ["bench", "generate", "--grid", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert len(built) == 1
    assert seen == [(p, t, built[0]) for p in (4, 16) for t in (128, 512)]
    assert len(out.read_text().splitlines()) == 8  # each setting's eager and final results
