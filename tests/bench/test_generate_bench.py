"""`vapo-lab bench generate` (issue 48, item 3) on CPU at a tiny size: both engines generate exactly
the tokens asked, the report says how HF generate ran, a failed compile falls back to eager and
says so, and a missing GPU or an unknown shape is refused in one line. Issue 61, item 6: vLLM
beside them (a stand-in here; the real engine in tests/vllm/test_bench_generate.py), the timed
runs interleaved round by round, the medians and spreads, vLLM missing refused in one line."""

import sys
import types

import pytest
import torch

import vapo_lab.bench.generate as generate
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


# Issue 61, item 6: vLLM beside them, the runs interleaved round by round, medians and spreads.


def test_the_timed_runs_interleave_round_by_round_after_an_untimed_warm_up_each():
    calls = []

    def run(name):
        return lambda: calls.append(name) or 7

    timed = generate.time_engines({e: run(e) for e in ("builtin", "vllm", "hf")}, repeats=3)
    assert calls == ["builtin", "vllm", "hf"] * 4  # the warm-ups, then 3 rounds
    assert generate.interleaved(["a", "b"], 2) == ["a", "b", "a", "b"]
    assert {e: (len(t[1]), t[2]) for e, t in timed.items()} == {
        e: (3, [7, 7, 7]) for e in ("builtin", "vllm", "hf")
    }


def test_the_summary_is_the_median_and_the_spread_of_the_runs_rates():
    odd = generate.summarize([2.0, 1.0, 4.0], tokens=100, rows=10)  # rates 50, 100, 25
    assert odd == {
        "seconds": 2.0,
        "samples_per_s": 5.0,
        "tokens_per_s": 50.0,
        "tokens_per_s_min": 25.0,
        "tokens_per_s_max": 100.0,
    }
    even = generate.summarize([1.0, 2.0], tokens=100, rows=10)  # the middle two rates' mean
    assert (even["seconds"], even["tokens_per_s"], even["samples_per_s"]) == (1.5, 75.0, 7.5)
    assert (even["tokens_per_s_min"], even["tokens_per_s_max"]) == (50.0, 100.0)


def test_unknown_repeated_or_no_engines_are_refused_in_one_line():
    assert generate.parse_engines(" vllm, builtin ") == ("vllm", "builtin")
    for bad in ("builtin,trl", "hf,hf", ""):
        with pytest.raises(ConfigError, match="--engines .*: give each of builtin, vllm, hf"):
            generate.parse_engines(bad)


def test_vllm_asked_for_where_it_is_missing_is_one_line_before_any_model_is_built(monkeypatch):
    from typer.testing import CliRunner

    from vapo_lab.cli import app

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails, installed or not

    def build(*args, **kwargs):
        raise AssertionError("the model was built before vLLM was checked")

    monkeypatch.setattr(generate, "bench_model", build)
    result = CliRunner().invoke(
        app, ["bench", "generate", "--engines", "builtin,vllm,hf"], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: --engines vllm needs vLLM, which is not installed here: make its environment "
        "with `bash scripts/vllm-env.sh` (vLLM's CPU build) and run its vapo-lab, or drop vllm "
        "from --engines"
    ]
    with pytest.raises(ConfigError, match="--engines vllm needs vLLM"):
        run_generate_benchmark(**TINY, engines=("vllm",))


class _Engine:
    """A stand-in for a built VllmEngine: its ``llm.generate`` records the parameters and returns
    ``tokens`` tokens per row (the asked number by default)."""

    version = "0.32.0"

    def __init__(self, tokens=None):
        self.tokens, self.calls = tokens, []
        config = types.SimpleNamespace(model_config=types.SimpleNamespace(enforce_eager=True))
        self.llm = types.SimpleNamespace(
            generate=self.generate, llm_engine=types.SimpleNamespace(vllm_config=config)
        )

    def generate(self, requests, params, use_tqdm=True):
        self.calls.append((requests, params))
        k = params.max_tokens if self.tokens is None else self.tokens
        row = types.SimpleNamespace(token_ids=[5] * k)
        return [types.SimpleNamespace(outputs=[row] * params.n) for _ in requests]


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)


def test_vllm_runs_in_the_rounds_with_eos_ignored_and_its_build_apart(fake_vllm):
    engine = _Engine()
    r = run_generate_benchmark(
        **{**TINY, "repeats": 2}, engines="builtin,vllm,hf", vllm=(engine, 12.5)
    )
    assert [e["engine"] for e in r["engines"]] == ["built-in sampler", "vLLM", "HF generate"]
    assert r["vllm_build_s"] == 12.5 and r["engines"][1]["mode"] == "vLLM 0.32.0, in-process, eager"
    assert len(engine.calls) == 3  # the warm-up and 2 rounds
    requests, params = engine.calls[0]
    assert len(requests) == 2 and params.n == 2 and params.max_tokens == 4
    assert params.ignore_eos and params.logprobs == 0 and not params.detokenize
    assert (params.temperature, params.top_p) == (generate.TEMPERATURE, generate.TOP_P)
    ours, vllm, hf = (e["tokens_per_s"] for e in r["engines"])
    assert r["ratios"] == {
        "vLLM": pytest.approx(ours / vllm),
        "HF generate": pytest.approx(ours / hf),
    }
    assert r["ratio_tokens_per_s"] == pytest.approx(ours / hf)
    text = format_generate_benchmark(r)
    assert "eos disabled in all 3" in text and "engine built in 12.5 s (not timed)" in text
    assert "ratio built-in / vLLM:" in text


def test_a_vllm_run_short_of_the_tokens_asked_is_refused(fake_vllm):
    with pytest.raises(RuntimeError, match="vLLM generated 12 tokens, not 4 rows x 4"):
        run_generate_benchmark(**TINY, engines="builtin,vllm", vllm=(_Engine(tokens=3), 1.0))


def test_the_kv_cache_holds_every_row_in_whole_blocks():
    from vapo_lab.models.shapes import known_arch

    shape = known_arch("Qwen2.5-0.5B")  # 24 layers, 2 KV heads of 64
    # 128 rows x (600 / 128 -> 5 blocks, + 1) x 128 tokens x 24,576 bytes a token in float32
    assert generate.kv_cache_gb(shape, 128, 600, torch.float32) == 128 * 6 * 128 * 24576 / 2**30
    assert generate.kv_cache_gb(shape, 16, 100, torch.bfloat16) == 1.0  # the wrapper's floor


def test_the_grid_builds_one_vllm_engine_for_its_largest_setting(monkeypatch):
    from typer.testing import CliRunner

    from vapo_lab.cli import app

    built, engines, seen = object(), [], []
    monkeypatch.setattr(generate, "require_vllm_engine", lambda: None)
    monkeypatch.setattr(generate, "bench_model", lambda *a, **k: built)

    def build_engine(model, folder, settings, samples, threads, seed, eager):
        engines.append((model, settings, samples, eager))
        return ("engine", 1.0)

    def run(**kwargs):
        seen.append((kwargs["engines"], kwargs["vllm"]))
        return {}

    monkeypatch.setattr(generate, "build_vllm_engine", build_engine)
    monkeypatch.setattr(generate, "run_generate_benchmark", run)
    monkeypatch.setattr(generate, "format_generate_benchmark", lambda r: "a result")
    args = ["bench", "generate", "--grid", "--engines", "vllm,builtin", "--vllm-eager"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert engines == [(built, [(p, t) for p in (4, 16) for t in (128, 512)], 8, True)]
    assert seen == [(("vllm", "builtin"), ("engine", 1.0))] * 4
