"""`vapo-lab eval` on the tiny model (arith and aime24), its one-line errors, and
`vapo-lab bench generate`."""

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from vapo_lab.bench.generate import run_generate_benchmark
from vapo_lab.cli import app

runner = CliRunner()


def _eval(*args):
    return runner.invoke(
        app, ["eval", *args, "--no-track", "--quiet", "--threads", "1"], env={"COLUMNS": "200"}
    )


def test_eval_arith_on_the_latest_run(tiny, tmp_path):
    out = tmp_path / "arith"
    result = _eval(
        "arith", "--samples", "2", "--runs-dir", str(tiny.runs), "--out", str(out), "--per-problem"
    )
    assert result.exit_code == 0, result.output
    assert (
        "arith: 8 problems x 2 samples" in result.output and "step_000004 (step 4)" in result.output
    )
    for figure in (
        "avg@2",
        "SE over problems",
        "95% bootstrap CI",
        "pass@k      k=1",
        "maj@2",
        "truncated",
    ):
        assert figure in result.output
    assert "arith-0-eval-000007" in result.output  # the per-problem table
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["generation"]["engine"] == "builtin"
        and "torch" in summary["generation"]["engine_version"]
    )
    assert len((out / "samples.jsonl").read_text().splitlines()) == 16


def test_eval_aime24_two_samples(tiny, tmp_path):
    out = tmp_path / "aime"
    result = _eval(
        "aime24",
        "--samples",
        "2",
        "--max-tokens",
        "4",
        "--model",
        str(tiny.run),
        "--step",
        "2",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert (
        "aime24: 30 problems x 2 samples" in result.output and "avg@2       0.0%" in result.output
    )
    assert (
        "cannot do aime24 problems: a score near zero is the expected, honest result"
        in result.output
    )
    records = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 60 and records[0]["problem_id"] == "2024-I-1"
    assert records[0]["prompt"].endswith(
        "Please reason step by step, and put your final answer within \\boxed{}."
    )
    assert all(r["length"] <= 4 for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["generation"]["template"].startswith("{problem}") and summary["model"]["step"] == 2
    )
    assert summary["generation"]["chat_template_applied"] is False  # the tiny tokenizer has none


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["arith", "--model", "/no/such/run"], "--model /no/such/run does not exist"),
        (["arith", "--step", "3"], "no checkpoint at step 3 (it has: 2, 4"),
        (["aime2024"], "did you mean aime24?"),
        (["aime24", "--top-p", "0", "--samples", "0"], "--samples 0: need at least 1"),
    ],
)
def test_errors_are_one_line(tiny, tmp_path, args, expected):
    result = _eval(*args, "--runs-dir", str(tiny.runs), "--out", str(tmp_path / "o"))
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert expected in result.output and lines[0].startswith("error:")
    assert len(lines) == (2 if "--top-p" in args else 1)  # every bad setting at once, one line each


def test_vllm_backend_without_vllm_is_one_clear_line(tiny, tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    result = _eval(
        "arith", "--backend", "vllm", "--model", str(tiny.run), "--out", str(tmp_path / "o")
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        (
            "error: --backend vllm needs vLLM, which is not installed: install vapo-lab with its "
            "gpu extra in a GPU environment of its own (vLLM pins its own torch; "
            "docs/distributed.md, GPU / vLLM), on a CPU run bash scripts/vllm-env.sh "
            "(docs/vllm.md), or use --backend builtin"
        )
    ]


def test_generate_benchmark_at_tiny_sizes():
    r = run_generate_benchmark(
        prompts=2,
        samples=2,
        max_new_tokens=4,
        repeats=1,
        hidden_size=32,
        num_layers=1,
        intermediate_size=64,
    )
    assert r["rows"] == 4 and [e["engine"] for e in r["engines"]] == [
        "built-in sampler",
        "HF generate",
    ]
    assert r["ratio_tokens_per_s"] == pytest.approx(
        r["engines"][0]["tokens_per_s"] / r["engines"][1]["tokens_per_s"]
    )


def test_bench_generate_prints_the_ratio():
    result = runner.invoke(
        app,
        [
            "bench",
            "generate",
            "--prompts",
            "2",
            "--samples",
            "2",
            "--max-new-tokens",
            "4",
            "--repeats",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "exactly 4 new tokens per row (eos disabled in both)" in result.output
    assert "ratio built-in / HF generate:" in result.output and "x tokens/s" in result.output


@pytest.mark.parametrize("how, code, why", [("sigterm", 143, "SIGTERM"), ("ctrl-c", 130, "Ctrl-C")])
def test_an_evaluation_stopped_by_a_signal_says_so_and_how_to_resume(monkeypatch, how, code, why):
    import os
    import signal

    from typer.testing import CliRunner

    from vapo_lab.cli import app

    def stopped(*args, on_progress=None, **kwargs):
        on_progress(4, 10)  # a chunk finished and on disk
        if how == "sigterm":  # a real signal to this process, as `kill` or Slurm sends it
            os.kill(os.getpid(), signal.SIGTERM)
        raise KeyboardInterrupt()

    monkeypatch.setattr("vapo_lab.eval.harness.evaluate_model", stopped)
    before = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(app, ["eval", "arith", "--samples", "2", "--quiet"])
    assert result.exit_code == code
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        f"evaluation stopped ({why}) after 4 of 10 samples; the finished chunks are kept: run the "
        "same command to resume from them"
    ]
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
