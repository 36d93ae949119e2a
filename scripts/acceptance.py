"""The Python half of scripts/gpu-acceptance.sh: what is easier to read or build in Python.

Each subcommand prints what the script records; none trains or evaluates anything itself except
``peak``, which runs one ``vapo-lab`` command in this process to read its peak memory.

    python scripts/acceptance.py env                                  # the machine, as JSON
    python scripts/acceptance.py missing scripts/gpu-requirements.txt # pins not installed
    python scripts/acceptance.py make-model DIR --size full|small     # a random Qwen2 checkpoint
    python scripts/acceptance.py prompt-tokens MODEL_DIR DATA.jsonl   # the longest math prompt
    python scripts/acceptance.py peak OUT.json -- train ...           # vapo-lab ARGS + peak memory
    python scripts/acceptance.py logprob-peak --device cuda            # step e's result
    python scripts/acceptance.py pytest-summary LOG                   # step a's result
    python scripts/acceptance.py train-summary RUN_DIR                # step b's result
    python scripts/acceptance.py fsdp-summary RUN_DIR PEAK.json PLAN  # step c's result
    python scripts/acceptance.py eval-summary SUMMARY.json            # step d's result
    python scripts/acceptance.py generate-summary RESULTS.jsonl      # step f's result
    python scripts/acceptance.py record RESULTS.jsonl --id ... ...    # one step's row
    python scripts/acceptance.py report RESULTS.jsonl ...             # the Markdown

A summary prints the step's one-line result first, then Markdown detail lines.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

# The embedded default's held-out avg@4 before and after its 80 steps on 2-core CPUs (42.0 on the
# Xeon: docs/benchmarks.md), printed beside the GPU's for comparison, not as a threshold.
CPU_BASE, CPU_FINAL = 23.5, 44.8
TAIL_LINES = 15  # a failed step keeps this many of its last log lines


# ---------------------------------------------------------------------------------------- machine
def cmd_env(args: argparse.Namespace) -> None:
    """Prints the machine as JSON: CUDA or not, the device's name and memory, versions."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        props = torch.cuda.get_device_properties(0)
        name, memory_gb = props.name, props.total_memory / 1e9
    else:
        name, memory_gb = _cpu_name(), None
    print(
        json.dumps(
            {
                "cuda": cuda,
                "device": name,
                "slug": re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown",
                "gpu_memory_gb": memory_gb,
                "torch": torch.__version__,
                "cuda_version": torch.version.cuda,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
            }
        )
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"CPU: {platform.processor() or platform.machine()}"


def cmd_missing(args: argparse.Namespace) -> None:
    """Prints each pin whose distribution is not installed, one NAME==VERSION a line.

    A pin installed at another version is kept (stderr says so): this completes a bare environment,
    it never changes a working one.
    """
    from importlib.metadata import PackageNotFoundError, version

    for line in Path(args.requirements).read_text().splitlines():
        req = line.split("#", 1)[0].strip()
        if not req:
            continue
        name, want = req.split("==")
        try:
            have = version(name)
        except PackageNotFoundError:
            print(req)
            continue
        if have != want:
            print(f"note: {name} {have} is installed (pinned {want}); kept", file=sys.stderr)


# ------------------------------------------------------------------------------------------ model
# Qwen2.5-0.5B's shape (its config.json); the small one keeps the vocabulary, so the fp32 logits,
# the largest activation, stay the same size a token.
SHAPES = {
    "full": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "small": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    ),
}


def cmd_make_model(args: argparse.Namespace) -> None:
    """Saves a randomly initialised Qwen2 checkpoint of ``--size`` with the embedded tokenizer, so
    that model=hf runs on a Qwen2.5-0.5B-shaped model with nothing downloaded."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(_embedded_tokenizer(), local_files_only=True)
    config = Qwen2Config(
        **SHAPES[args.size],
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    # initialised on the GPU where there is one: 494M parameters take seconds there, not a minute
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(args.dir)
    tokenizer.save_pretrained(args.dir)
    print(
        f"{sum(p.numel() for p in model.parameters()):,} parameters "
        f"({args.size}, bfloat16) in {args.dir}"
    )


def _embedded_tokenizer() -> Path:
    """The embedded default's tokenizer: the shipped base model's folder (byte-level, any text)."""
    import vapo_lab

    shipped = Path(vapo_lab.__file__).parent / "shipped" / "base"
    folders = sorted(p.parent for p in shipped.glob("*/tokenizer.json"))
    if not folders:
        raise SystemExit(f"no shipped tokenizer under {shipped}")
    return folders[0]


def cmd_prompt_tokens(args: argparse.Namespace) -> None:
    """Prints the longest prompt of a math JSONL in tokens, built with task=math's template, so
    that `vapo-lab plan` is told the prompt length the run will see (its default is 512)."""
    import yaml
    from transformers import AutoTokenizer

    import vapo_lab.conf

    template = yaml.safe_load(
        (Path(vapo_lab.conf.__file__).parent / "task" / "math.yaml").read_text()
    )["prompt_template"]
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir, local_files_only=True)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    # + bos
    print(max(len(tokenizer(template.format(problem=r[args.key])).input_ids) for r in rows) + 1)


# ------------------------------------------------------------------------------------------- peak
def cmd_peak(args: argparse.Namespace) -> int:
    """Runs `vapo-lab ARGS` in this process and writes its peak memory to OUT.

    The peaks are the CUDA caching allocator's (max_memory_allocated / reserved) and the process's
    RSS; a one-rank run trains in this process, so this is its GPU peak (the trainer logs only RSS).
    """
    import resource

    import torch

    from vapo_lab.cli import main

    rc = 0
    sys.argv = ["vapo-lab", *args.argv]
    try:
        main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        peak = {"rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            peak.update(
                allocated_gb=torch.cuda.max_memory_allocated() / 1e9,
                reserved_gb=torch.cuda.max_memory_reserved() / 1e9,
            )
        Path(args.out).write_text(json.dumps(peak))
    return rc


# ---------------------------------------------------------------------------------------- logprob
def cpu_has_fast_bf16() -> bool:
    """Returns whether this CPU has AVX-512 or better, where oneDNN runs bf16 GEMMs at speed."""
    import torch

    return torch.backends.cpu.get_cpu_capability().startswith(("AVX512", "AMX"))


def cmd_logprob_peak(args: argparse.Namespace) -> None:
    """Step e: prints the chunked log-prob pass's peak memory beside `vapo-lab plan`'s figure.

    The pass is the LM head and log-softmax, forward under bf16 autocast + backward. On CUDA the
    peak is torch.cuda.max_memory_allocated less what was allocated before; on CPU,
    vapo_lab.bench.logits_memory's VmHWM method.
    """
    import torch

    from vapo_lab.algo.lm import default_chunk_tokens, head_logprobs_and_entropy
    from vapo_lab.models.activations import chunked_logprob_bytes

    t, vocab, hidden = args.tokens, args.vocab, args.hidden
    chunk = default_chunk_tokens(vocab)
    dtype = "bfloat16"
    if not args.device.startswith("cuda") and not cpu_has_fast_bf16():
        # a 2-core AVX2 EPYC: (32, 152,064) @ (152,064, 896) in bf16 18.9 s, float32 0.1 s
        dtype = "float32"
    plan = chunked_logprob_bytes(t, vocab, hidden, chunk, 2 if dtype == "bfloat16" else 4)
    if args.device.startswith("cuda"):
        device = torch.device(args.device)
        torch.manual_seed(0)
        head = torch.nn.Linear(hidden, vocab, bias=False, device=device)  # float32 masters
        h = torch.randn(t, hidden, dtype=torch.bfloat16, device=device).requires_grad_(True)
        y = torch.randint(0, vocab, (t,), device=device)

        def run(n: int) -> None:
            x = h[:n].detach().requires_grad_(True) if n < t else h
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logprobs, _ = head_logprobs_and_entropy(x, head.weight, y[:n], with_entropy=True)
            logprobs.sum().backward()

        run(min(t, chunk))  # kernels and cuBLAS's workspace, as a training loop holds them already
        head.weight.grad = None
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        run(t)
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) - before
        how = "torch.cuda.max_memory_allocated - memory_allocated before"
    else:
        from vapo_lab.bench.logits_memory import run_logits_memory

        [row] = run_logits_memory([t], vocab, hidden, chunk, cases=("chunked",), dtype=dtype)
        peak, seconds, how = (
            row["peak_bytes"],
            row["seconds"],
            f"VmHWM - VmRSS before, a fresh process, {dtype}"
            + ("" if dtype == "bfloat16" else " (this CPU has no AVX-512: bf16 GEMMs crawl)"),
        )
    print(
        f"peak {peak / 1e9:.2f} GB measured, plan {plan / 1e9:.2f} GB ({peak / plan:.3f} of it); "
        f"T = {t:,}, V = {vocab:,}, h = {hidden}, chunks of {chunk}; {seconds:.2f} s"
    )
    print(
        f"- measured: {how}; the fp32 logits it never holds would be {4 * t * vocab / 1e9:.2f} GB"
    )


# -------------------------------------------------------------------------------------- summaries
def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill
    return [
        r
        for r in rows
        if not all(k.startswith("pretrain/") for k in r if k not in ("step", "timestamp_ms"))
    ]


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def _steps(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "time/step_s" in r]


def _eval_key(rows: list[dict]) -> str | None:
    keys = sorted({k for r in rows for k in r if k.startswith("eval/avg_at_")})
    return keys[0] if keys else None


def cmd_train_summary(args: argparse.Namespace) -> None:
    """Step b: the held-out gain (final − base eval, x100) beside the CPU's, and s/step."""
    rows = _records(Path(args.run_dir))
    steps, key = _steps(rows), _eval_key(rows)
    evals = sorted((r["step"], 100 * r[key]) for r in rows if key and key in r)
    s_step, tok_s = _median(steps, "time/step_s"), _median(steps, "perf/tokens_per_s")
    parts = []
    if len(evals) >= 2 and evals[0][0] == 0:
        (_, base), (last, final) = evals[0], evals[-1]
        parts.append(
            f"{key.split('/')[1].replace('_at_', '@')} {base:.1f} → {final:.1f} at step {last}: "
            f"{final - base:+.1f} "
            f"(CPU {CPU_FINAL} − {CPU_BASE} = {CPU_FINAL - CPU_BASE:+.1f} at 80)"
        )
    elif evals:
        parts.append(f"only the eval at step {evals[0][0]}: {evals[0][1]:.1f}")
    else:
        parts.append("no held-out eval logged")
    parts.append(
        f"{len(steps)} steps, {s_step:.2f} s/step" if s_step is not None else "no step logged"
    )
    print("; ".join(parts))
    if evals:
        print(
            f"- held-out evals (step: {key} x100): " + ", ".join(f"{s}: {v:.1f}" for s, v in evals)
        )
    if tok_s is not None:
        print(
            f"- median rollout tokens/s: {tok_s:,.0f}; median s/step {s_step:.3f} "
            f"(first step {steps[0]['time/step_s']:.2f} s)"
        )


def cmd_fsdp_summary(args: argparse.Namespace) -> None:
    """Step c: the peak memory beside `vapo-lab plan`'s figure for the same config, and tokens/s."""
    steps = _steps(_records(Path(args.run_dir)))
    peak = json.loads(Path(args.peak).read_text()) if Path(args.peak).is_file() else {}
    plan = _plan_rows(Path(args.plan))
    need = plan.get("need a GPU")
    tok_s, s_step = _median(steps, "perf/tokens_per_s"), _median(steps, "time/step_s")
    parts = []
    if "allocated_gb" in peak:
        parts.append(
            f"peak {peak['allocated_gb']:.2f} GB allocated ({peak['reserved_gb']:.2f} reserved)"
        )
    elif "rss_gb" in peak:
        parts.append(f"peak RSS {peak['rss_gb']:.2f} GB (CPU)")
    else:
        parts.append("peak not measured")
    parts.append(f"plan {need:.2f} GB" if need is not None else "plan: no figure")
    parts.append(f"{tok_s:,.0f} tokens/s" if tok_s is not None else "no step logged")
    parts.append(f"{len(steps)} steps, {s_step:.2f} s/step" if s_step is not None else "")
    print("; ".join(p for p in parts if p))
    # every phase, torch's tensors x the allocator's headroom (+ vLLM's share where it is awake)
    for name in [n for n in plan if n.startswith("phase: ")] + ["need a GPU"]:
        if name in plan:
            print(f"- plan, {name}: {plan[name]:.2f} GB")
    if peak:
        print(
            "- measured: "
            + ", ".join(f"{k} {v:.2f}" for k, v in peak.items())
            + " (GB = 10^9 bytes, as the plan; RSS is the whole process's host memory)"
        )
    for line in stage_table(steps):
        print(line)


def stage_table(steps: list[dict]) -> list[str]:
    """Returns the run's per-stage table (the mean over its steps of each rate the trainer logs:
    ``vapo_lab.trainer.metrics.STAGES``), as Markdown lines; none where no step logged them."""
    from vapo_lab.trainer.metrics import stage_summary

    stages = stage_summary(steps)
    if not stages:
        return []
    rows = ["", "| stage (mean over the steps) | value |", "| --- | --- |"]
    for key, value in stages.items():
        shown = f"{100 * value:.1f}%" if key == "perf/mfu" else f"{value:,.3g}"
        rows.append(f"| {key} | {shown} |")
    return rows


def cmd_generate_summary(args: argparse.Namespace) -> None:
    """Step f: the built-in sampler's tokens/s against HF generate's, a line per setting (its last
    result: the eager one comes first, the compiled one after it where it finished)."""
    path = Path(args.results)
    lines = path.read_text().splitlines() if path.is_file() else []
    last = {}
    for r in (json.loads(x) for x in lines if x.strip()):
        last[r["rows"], r["max_new_tokens"]] = r
    results = list(last.values())
    if not results:
        print("no setting finished")
        return
    first = results[0]
    print(
        "; ".join(
            f"{r['rows']} rows x {r['max_new_tokens']} tokens: built-in "
            f"{r['engines'][0]['tokens_per_s']:,.0f} tokens/s, {r['ratio_tokens_per_s']:.2f}x HF"
            for r in results
        )
    )
    print(
        f"- {first.get('arch', 'tiny')} at random init, {first.get('dtype')}, {first.get('device')}"
    )
    for r in results:
        engines = ", ".join(f"{e['engine']} {e['tokens_per_s']:,.0f}" for e in r["engines"])
        print(
            f"- {r['rows']} rows x {r['max_new_tokens']} new tokens (tokens/s): {engines}; the "
            f"ratio against HF generate {r.get('hf_mode')}"
        )


def _plan_rows(path: Path) -> dict[str, float]:
    """`vapo-lab plan`'s rows (tab-separated: quantity, value, how) whose value is a size, in GB."""
    rows = {}
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        cells = line.split("\t")
        m = re.fullmatch(r"([\d.,]+) (KB|MB|GB|TB)", cells[1].strip()) if len(cells) >= 2 else None
        if m:
            scale = {"KB": 1e-6, "MB": 1e-3, "GB": 1.0, "TB": 1e3}[m.group(2)]
            rows[cells[0].strip()] = float(m.group(1).replace(",", "")) * scale
    return rows


def cmd_eval_summary(args: argparse.Namespace) -> None:
    """Step d: avg@N of the benchmark and the sampler's speed."""
    s = json.loads(Path(args.summary).read_text())
    m, t = s["metrics"], s.get("timing", {})
    n = m["samples_per_problem"]
    gen_s, tokens = t.get("generate_s"), t.get("generated_tokens")
    speed = f", {tokens / gen_s:,.0f} tokens/s" if gen_s and tokens else ""
    print(
        f"{s['benchmark']['name']} avg@{n} {100 * m[f'avg_at_{n}']:.1f}% "
        f"over {m['samples_graded']} samples"
        f"{speed} (the tiny arith model: near zero expected)"
    )
    print(
        f"- model: {s['model'].get('checkpoint') or s['model'].get('path')}; "
        f"generation {s['generation']['device']} {s['generation']['dtype']}, "
        f"max {s['generation']['max_tokens']} tokens; "
        f"mean length {m['response_length']:.0f}, truncated {100 * m['truncated_frac']:.1f}%"
    )
    if t:
        print(
            f"- time: generate {gen_s:.1f} s, grade {t.get('grade_s', 0):.1f} s; "
            f"grade status {m.get('grade_status')}"
        )


def cmd_pytest_summary(args: argparse.Namespace) -> None:
    """Step a: pytest's closing line, and each skip's reason (-rs)."""
    lines = Path(args.log).read_text(errors="replace").splitlines()
    final = [
        ln
        for ln in lines
        if re.search(r"\b(passed|failed|skipped|error|errors|deselected|no tests ran)\b", ln)
        and " in " in ln
    ]
    print(final[-1].strip("= ") if final else "no pytest summary line")
    for ln in lines:
        if ln.startswith(("SKIPPED", "FAILED", "ERROR")):
            print(f"- {ln}")


# ---------------------------------------------------------------------------------------- records
def cmd_record(args: argparse.Namespace) -> None:
    """Appends one step's row to RESULTS (JSON lines); a step that failed keeps its log's tail."""
    summary = (
        Path(args.summary).read_text().splitlines()
        if args.summary and Path(args.summary).is_file()
        else []
    )
    row = {
        "id": args.id,
        "title": args.title,
        "status": args.status,
        "seconds": args.seconds,
        "command": args.command,
        "result": args.result or (summary[0] if summary else ""),
        "details": summary[1:],
        "tail": [],
    }
    if args.status != "ok" and args.log and Path(args.log).is_file():
        lines = [ln for ln in Path(args.log).read_text(errors="replace").splitlines() if ln.strip()]
        row["tail"] = lines[-TAIL_LINES:]
    with open(args.results, "a") as f:
        f.write(json.dumps(row) + "\n")


def cmd_report(args: argparse.Namespace) -> None:
    """Writes the Markdown report to OUT and prints it."""
    env = json.loads(Path(args.env).read_text())
    rows = [
        json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()
    ]
    gpu = args.mode == "gpu"
    device = env["device"] + (
        f", {env['gpu_memory_gb']:.1f} GB" if env.get("gpu_memory_gb") else ""
    )
    cuda = f", CUDA {env['cuda_version']}" if env.get("cuda_version") else ""
    title = "GPU acceptance" if gpu else "CPU acceptance (--cpu: shortened, no GPU)"
    out = [
        f"# {title}: {env['device']}",
        "",
        "| | |",
        "| --- | --- |",
        f"| device | {device} |",
        f"| software | Python {env['python']}, torch {env['torch']}{cuda}, {env['cpus']} CPUs |",
        f"| date | {args.date} |",
        f"| commit | {args.commit} |",
        f"| command | `{args.invocation}` |",
        f"| total | {args.total:.0f} s |",
        "",
        "| step | status | time | result |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r['id']}. {r['title']} | {r['status']} | {r['seconds']:.0f} s | "
            f"{_cell(r['result'])} |"
        )
    out += ["", "## Steps", ""]
    for r in rows:
        out += [
            f"### {r['id']}. {r['title']}",
            "",
            f"{r['status']}, {r['seconds']:.1f} s: {r['result']}",
            "",
        ]
        if r["command"]:
            out += ["```bash", r["command"], "```", ""]
        if r["details"]:
            out += [*r["details"], ""]
        if r["tail"]:
            out += ["Last lines of its log:", "", "```text", *r["tail"], "```", ""]
    text = "\n".join(out).rstrip() + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text, end="")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env").set_defaults(fn=cmd_env)
    s = sub.add_parser("missing")
    s.add_argument("requirements")
    s.set_defaults(fn=cmd_missing)
    s = sub.add_parser("make-model")
    s.add_argument("dir")
    s.add_argument("--size", choices=sorted(SHAPES), default="full")
    s.set_defaults(fn=cmd_make_model)
    s = sub.add_parser("prompt-tokens")
    s.add_argument("model_dir")
    s.add_argument("data")
    s.add_argument("--key", default="problem")
    s.set_defaults(fn=cmd_prompt_tokens)
    s = sub.add_parser("peak")
    s.add_argument("out")
    s.add_argument("argv", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_peak)
    s = sub.add_parser("logprob-peak")
    s.add_argument("--tokens", type=int, default=20_480)
    s.add_argument("--vocab", type=int, default=152_064)
    s.add_argument("--hidden", type=int, default=896)
    s.add_argument("--device", default="cuda")
    s.set_defaults(fn=cmd_logprob_peak)
    s = sub.add_parser("pytest-summary")
    s.add_argument("log")
    s.set_defaults(fn=cmd_pytest_summary)
    s = sub.add_parser("train-summary")
    s.add_argument("run_dir")
    s.set_defaults(fn=cmd_train_summary)
    s = sub.add_parser("fsdp-summary")
    s.add_argument("run_dir")
    s.add_argument("peak")
    s.add_argument("plan")
    s.set_defaults(fn=cmd_fsdp_summary)
    s = sub.add_parser("generate-summary")
    s.add_argument("results")
    s.set_defaults(fn=cmd_generate_summary)
    s = sub.add_parser("eval-summary")
    s.add_argument("summary")
    s.set_defaults(fn=cmd_eval_summary)
    s = sub.add_parser("record")
    s.add_argument("results")
    for name in ("id", "title", "status", "command", "result", "summary", "log"):
        s.add_argument(f"--{name}", default="")
    s.add_argument("--seconds", type=float, default=0.0)
    s.set_defaults(fn=cmd_record)
    s = sub.add_parser("report")
    s.add_argument("results")
    for name in ("env", "mode", "date", "commit", "invocation", "out"):
        s.add_argument(f"--{name}", required=True)
    s.add_argument("--total", type=float, required=True)
    s.set_defaults(fn=cmd_report)
    args = p.parse_args(argv)
    if args.cmd == "peak" and args.argv[:1] == ["--"]:
        args.argv = args.argv[1:]
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
