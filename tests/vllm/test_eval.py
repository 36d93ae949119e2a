"""`vapo-lab eval --backend vllm` on the real engine (its CPU build): a benchmark sampled and graded
through vLLM, and a context vLLM would refuse said in one line before any engine is built."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from vapo_lab.cli import app

pytestmark = pytest.mark.vllm


def _eval(*args):
    return CliRunner().invoke(
        app, ["eval", *args, "--no-track", "--quiet", "--threads", "1"], env={"COLUMNS": "400"}
    )


def test_a_benchmark_sampled_and_graded_through_vllm(base, tmp_path):
    data = tmp_path / "sums.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{a}+{a}", "answer": str(2 * a)}) + "\n" for a in (3, 12))
    )
    out = tmp_path / "out"
    args = ["--data", str(data), "--model", str(base[0]), "--samples", "4", "--max-tokens", "24"]
    result = _eval(*args, "--backend", "vllm", "--out", str(out))
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generation"]["engine"] == "vllm" and summary["generation"]["device"] == "cpu"
    assert summary["metrics"]["samples_graded"] == 2 * 4
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 and all(0 < r["length"] <= 24 for r in rows)


def test_a_context_vllm_refuses_is_one_line_before_any_engine(base, tmp_path):
    # the longest AIME 2024 prompt is 1002 tokens of this tokenizer; the model's context is 512
    result = _eval("aime24", "--model", str(base[0]), "--backend", "vllm", "--out", str(tmp_path))
    assert result.exit_code == 1
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: --backend vllm: the longest prompt (")
    assert "exceeds the model's context of 512 tokens, which vLLM refuses: " in line
    assert line.endswith("or use --backend builtin")
