"""scripts/gpu-acceptance.sh: it refuses a machine without CUDA in one line, and its --cpu run (the
same steps, shortened) reports every step with a result, so the script cannot rot while no GPU runs
it."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-acceptance.sh"
# the order they run in: f (the generation benchmark, whose HF compile needs its whole limit)
# right after the GPU tests, where no earlier step can have eaten its time
STEPS = ("install", "a", "f", "b", "c", "d", "e")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OUT", "ACCEPTANCE_WORK", "VAPO_COMMIT")
    }
    return {**env, **extra}


def test_without_cuda_and_without_cpu_flag_it_exits_1_with_one_line(tmp_path):
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on a GPU machine too
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_env(CUDA_VISIBLE_DEVICES="", OUT=str(tmp_path / "out")),
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "--cpu" in lines[0], lines
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_bad_argument_is_refused_with_the_usage(tmp_path):
    done = subprocess.run(
        ["bash", str(SCRIPT), "--gpu"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=_env(),
    )
    assert done.returncode == 2 and done.stderr.startswith("usage: ") and not done.stdout


def test_the_steps_run_in_order_with_the_generation_benchmark_before_b():
    main = SCRIPT.read_text().split("\nmain() {", 1)[1]
    assert tuple(re.findall(r"^  run_step (\S+) ", main, re.M)) == STEPS


def test_the_generation_summary_keeps_each_setting_s_last_result(tmp_path):
    def result(rows, tokens, hf_mode, *rates):
        engines = [{"engine": f"engine {i}", "tokens_per_s": r} for i, r in enumerate(rates)]
        return {"rows": rows, "max_new_tokens": tokens, "engines": engines, "hf_mode": hf_mode,
                "ratio_tokens_per_s": rates[0] / max(rates[1:]), "arch": "Qwen2.5-0.5B",
                "dtype": "bfloat16", "device": "cuda"}  # fmt: skip

    lines = [
        result(32, 128, "eager, dynamic cache; static cache + torch.compile next", 3000.0, 1000.0),
        result(32, 128, "static cache + torch.compile", 3000.0, 1000.0, 1500.0),
        result(32, 512, "eager, dynamic cache; static cache + torch.compile next", 2000.0, 800.0),
    ]  # the run cut short in the second setting's compile
    path = tmp_path / "f.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "acceptance.py"), "generate-summary", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    first, *rest = done.stdout.splitlines()
    assert first == (
        "32 rows x 128 tokens: built-in 3,000 tokens/s, 2.00x HF; "
        "32 rows x 512 tokens: built-in 2,000 tokens/s, 2.50x HF"
    )
    assert any("against HF generate static cache + torch.compile" in line for line in rest)


def _rows(markdown: str) -> dict[str, tuple[str, str]]:
    """{step id: (status, result)} from the report's step table."""
    rows = {}
    for line in markdown.splitlines():
        m = re.match(r"\| (install|[a-f])\. .*? \| (.+?) \| [\d.]+ s \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


@pytest.mark.slow
@pytest.mark.timeout(720)
def test_cpu_run_reports_every_step_with_a_result(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(SCRIPT), "--cpu"],
        capture_output=True,
        text=True,
        timeout=700,
        cwd=tmp_path,
        env=_env(OUT=str(out), ACCEPTANCE_WORK=str(tmp_path / "work")),
    )
    md = (out / "gpu-acceptance.md").read_text()
    assert md in done.stdout  # the table is printed as written
    assert {p.name for p in out.iterdir()} == {
        "gpu-acceptance.md",
        "gpu-acceptance.log",
        "gpu-acceptance.jsonl",
    }
    for field in ("device", "software", "date", "commit", "total"):
        assert re.search(rf"^\| {field} \| \S", md, re.M), field
    rows = _rows(md)
    assert tuple(rows) == STEPS, md  # the report's table in the order the steps ran
    for step in STEPS:
        assert f"### {step}. " in md, step
        status, result = rows[step]
        assert status == "ok" and result and result != "no result", (
            f"step {step}: {status}: {result}\n\n{md}"
        )
    assert done.returncode == 0, md
    # each step's figures, as the GPU run will report them
    assert re.search(r"skipped|passed", rows["a"][1])
    assert re.search(
        r"→ .* at step 10: [+-]\d+\.\d .*CPU 44\.8 − 23\.5 = \+21\.3.*\d\.\d+ s/step", rows["b"][1]
    )
    assert re.search(r"peak .*GB.*plan \d+\.\d+ GB.*tokens/s", rows["c"][1])
    assert re.search(r"aime24 avg@2 \d+\.\d%", rows["d"][1])
    # the chunked log-prob pass's peak beside the plan's figure for it: within 15%
    peak = re.search(
        r"peak (\d+\.\d+) GB measured, plan (\d+\.\d+) GB \((\d\.\d+) of it\); T = 512",
        rows["e"][1],
    )
    assert peak and 0.85 <= float(peak.group(3)) <= 1.15, rows["e"][1]
    # the side-by-side generation benchmark, and step c's per-stage table
    assert re.search(r"^8 rows x 32 tokens: built-in [\d,]+ tokens/s, \d+\.\d\dx HF$", rows["f"][1])
    assert "| perf/gen_tokens_per_s_per_device | " in md and "| time/push_s | " in md
