"""Measures the peak memory of the actor's log-prob pass, the LM head unchunked against chunked.

``python -m vapo_lab.bench.logits_memory`` (defaults: T = 2048 and 4096 response tokens,
Qwen2.5-0.5B's V = 152,064 and h = 896) runs two cases, forward under bf16 autocast + backward
outside it, float32 master weights, loss Σ log π over a bf16 (T, h) leaf of hidden states
(``--dtype float32``: no autocast, a float32 leaf, for CPUs without AVX-512, where a bf16 GEMM
with K = V runs about 100x slower than a float32 one):

* ``unchunked``: ``vapo_lab.trainer.forward._policy_forward``'s packed path: ``lm_head`` over
  every token, widened to float32, divided by τ, then ``token_logprobs_and_entropy``;
* ``chunked``: ``vapo_lab.algo.lm.head_logprobs_and_entropy`` on the same head and tokens.

Each case runs in a fresh subprocess after a warm-up pass; peak = VmHWM after the pass − VmRSS
before it, W's new float32 gradient included (method: docs/benchmarks.md#log-prob-pass-memory).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time

import torch

from vapo_lab.algo.lm import (
    default_chunk_tokens,
    head_logprobs_and_entropy,
    token_logprobs_and_entropy,
)
from vapo_lab.models.activations import chunked_logprob_bytes

CASES = ("unchunked", "chunked")
# The unchunked pass holds about 4 float32 (T, V) tensors at its peak; refuse one predicted to need
# more than this share of the machine's available memory (other jobs share it).
SAFE_SHARE = 0.8
# glibc's mmap threshold in the measuring subprocess: blocks of 64 KiB or more are unmapped when
# freed, so the RSS follows the live tensors
MMAP_THRESHOLD = 65536
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _status_bytes(field: str) -> int:
    """Returns a field of /proc/self/status given in kB (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_high_water_mark() -> None:
    """Sets this process's VmHWM to its current VmRSS (Linux 4.0 and later)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def available_bytes() -> int:
    """Returns MemAvailable from /proc/meminfo in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def unchunked_need(tokens: int, vocab: int, hidden: int) -> float:
    """Returns a generous estimate of the unchunked peak in bytes: 4.5 float32 (T, V) + 8·V·h."""
    return 4.5 * 4 * tokens * vocab + 8 * vocab * hidden


def _unchunked_forward(
    head: torch.nn.Linear, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs ``_policy_forward``'s packed path from the hidden states on: head, /τ, log-softmax."""
    logits = head(hidden)
    logits = logits.float() if logits.element_size() < 4 else logits  # vapo_lab.models.value.wide
    if temperature != 1.0:
        logits = logits / temperature
    return token_logprobs_and_entropy(logits, tokens, False)


def _pass(
    case: str,
    head: torch.nn.Linear,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    chunk: int,
    temperature: float,
    dtype: str,
) -> None:
    """One forward (under bf16 autocast unless ``dtype`` is float32) + backward (outside it) of
    ``case``, loss Σ log π."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        if case == "unchunked":
            logprobs, entropy = _unchunked_forward(head, hidden, tokens, temperature)
        else:
            logprobs, entropy = head_logprobs_and_entropy(
                hidden,
                head.weight,
                tokens,
                temperature=temperature,
                with_entropy=True,
                entropy_grad=False,
                chunk_tokens=chunk,
            )
    assert entropy is not None
    logprobs.sum().backward()


def measure_case(
    case: str,
    tokens: int,
    vocab: int,
    hidden: int,
    chunk: int,
    temperature: float,
    seed: int,
    dtype: str = "bfloat16",
) -> dict:
    """Runs one pass of ``case`` in this process and returns its measurements."""
    torch.manual_seed(seed)
    # float32 master weights, initialised in place
    head = torch.nn.Linear(hidden, vocab, bias=False)
    h = torch.empty(tokens, hidden, dtype=DTYPES[dtype]).normal_().requires_grad_(True)
    y = torch.randint(0, vocab, (tokens,))
    warm = min(tokens, chunk)
    _pass(case, head, h[:warm].detach().requires_grad_(True), y[:warm], chunk, temperature, dtype)
    head.weight.grad = None
    gc.collect()
    _reset_high_water_mark()
    before = _status_bytes("VmRSS")
    start = time.perf_counter()
    _pass(case, head, h, y, chunk, temperature, dtype)
    seconds = time.perf_counter() - start
    after = _status_bytes("VmHWM")
    assert head.weight.grad is not None and h.grad is not None
    return {
        "case": case,
        "tokens": tokens,
        "vocab": vocab,
        "hidden": hidden,
        "chunk": chunk,
        "temperature": temperature,
        "dtype": dtype,
        "rss_before": before,
        "hwm_after": after,
        "peak_bytes": after - before,
        "seconds": seconds,
        "threads": torch.get_num_threads(),
    }


def run_logits_memory(
    tokens: list[int],
    vocab: int,
    hidden: int,
    chunk: int | None,
    temperature: float = 1.0,
    seed: int = 0,
    threads: int | None = None,
    cases: tuple[str, ...] = CASES,
    log=lambda text: None,
    dtype: str = "bfloat16",
) -> list[dict]:
    """Measures each case at each T in a fresh subprocess; returns one dict per measurement.

    An unchunked case predicted (``unchunked_need``) to need more than ``SAFE_SHARE`` of the
    memory available when it starts is skipped, with the reason in its row.
    """
    chunk = chunk or default_chunk_tokens(vocab)
    rows = []
    for t in tokens:
        for case in cases:
            need = unchunked_need(t, vocab, hidden) if case == "unchunked" else 0.0
            free = available_bytes()
            if need > SAFE_SHARE * free:
                rows.append(
                    {
                        "case": case,
                        "tokens": t,
                        "vocab": vocab,
                        "hidden": hidden,
                        "chunk": chunk,
                        "skipped": f"needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB available",
                    }
                )
                log(f"{case} T={t}: skipped ({rows[-1]['skipped']})")
                continue
            log(f"{case} T={t}: running")
            command = [
                sys.executable,
                "-m",
                "vapo_lab.bench.logits_memory",
                "--child",
                case,
                "--tokens",
                str(t),
                "--vocab",
                str(vocab),
                "--hidden",
                str(hidden),
                "--chunk",
                str(chunk),
                "--temperature",
                str(temperature),
                "--seed",
                str(seed),
                "--dtype",
                dtype,
            ]
            if threads:
                command += ["--threads", str(threads)]
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
            out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for row in rows:
        if "peak_bytes" in row:
            row["logits_bytes"] = 4 * row["tokens"] * row["vocab"]
            row["x_logits"] = row["peak_bytes"] / row["logits_bytes"]
            if row["case"] == "chunked":
                row["predicted_bytes"] = chunked_logprob_bytes(
                    row["tokens"], vocab, hidden, chunk, DTYPES[dtype].itemsize
                )
    return rows


def format_logits_memory(rows: list[dict]) -> str:
    """Returns ``run_logits_memory``'s rows as a table, each T's ratio of peaks, and a legend."""
    lines = [
        f"{'case':<10} {'T':>6} {'chunk':>6} {'peak MB':>10} {'x logits':>9} {'formula MB':>11} "
        f"{'measured/formula':>17} {'s':>6}"
    ]
    for row in rows:
        if "skipped" in row:
            lines.append(f"{row['case']:<10} {row['tokens']:>6} {'':>6} skipped: {row['skipped']}")
            continue
        formula = row.get("predicted_bytes")
        chunk = row["chunk"] if row["case"] == "chunked" else "-"
        predicted = (
            f"{formula / 1e6:>11.0f} {row['peak_bytes'] / formula:>17.3f}"
            if formula
            else f"{'-':>11} {'-':>17}"
        )
        lines.append(
            f"{row['case']:<10} {row['tokens']:>6} {chunk:>6} {row['peak_bytes'] / 1e6:>10.0f} "
            f"{row['x_logits']:>8.2f}x {predicted} {row['seconds']:>6.1f}"
        )
    for t in sorted({r["tokens"] for r in rows}):
        by = {r["case"]: r for r in rows if r["tokens"] == t and "peak_bytes" in r}
        if len(by) == 2:
            ratio = by["unchunked"]["peak_bytes"] / by["chunked"]["peak_bytes"]
            lines.append(f"T={t}: unchunked / chunked peak = {ratio:.2f}x")
    lines += [
        "peak: VmHWM after the pass − VmRSS before it, one fresh process per case (W's gradient "
        "included); x logits: peak / 4·T·V; formula: activations.chunked_logprob_bytes"
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Prints the table (`python -m vapo_lab.bench.logits_memory --tokens 2048,4096`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="2048,4096", help="comma-separated T values")
    parser.add_argument("--vocab", type=int, default=152_064, help="V (Qwen2.5's 152,064)")
    parser.add_argument("--hidden", type=int, default=896, help="h (Qwen2.5-0.5B's 896)")
    parser.add_argument(
        "--chunk", type=int, default=None, help="chunk_tokens (default: default_chunk_tokens(V))"
    )
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="τ (the default config's 1.0)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", choices=tuple(DTYPES), default="bfloat16", help="the compute dtype"
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's)"
    )
    parser.add_argument(
        "--cases", default=",".join(CASES), help="comma-separated: unchunked, chunked"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the rows as JSON instead of the table"
    )
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        print(
            json.dumps(
                measure_case(
                    args.child,
                    int(args.tokens),
                    args.vocab,
                    args.hidden,
                    args.chunk,
                    args.temperature,
                    args.seed,
                    args.dtype,
                )
            )
        )
        return
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = run_logits_memory(
        tokens,
        args.vocab,
        args.hidden,
        args.chunk,
        args.temperature,
        args.seed,
        args.threads,
        tuple(args.cases.split(",")),
        log=lambda text: print(text, file=sys.stderr),
        dtype=args.dtype,
    )
    if args.json:
        print(json.dumps(rows))
        return
    print(
        f"LM-head log-prob pass, {args.dtype} on CPU, V = {args.vocab:,}, h = {args.hidden}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )
    print(format_logits_memory(rows))


if __name__ == "__main__":
    main()
