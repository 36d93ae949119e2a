"""Benchmarks the built-in sampler against Hugging Face ``model.generate`` on one model.

Model, prompts, sampling, threads and the exact number of new tokens are held equal, so the ratio
measures the decoding loop alone (docs/benchmarks.md#generation). On CPU the model is the embedded
default's shape; ``arch`` gives a random-init model of a known shape (e.g. Qwen2.5-0.5B) for a GPU
(``device="cuda"``, bfloat16), where HF ``generate`` runs with a static cache and a compiled
forward if that works, else eagerly, and the result says which.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from vapo_lab.errors import ConfigError

TEMPERATURE = 1.0
TOP_P = 0.7


def _median_s(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Returns (median wall seconds of fn() over ``repeats`` runs after a warm-up, last result)."""
    out = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def build_bench_model(
    hidden_size: int = 128, num_layers: int = 4, intermediate_size: int = 352, max_digits: int = 40
) -> tuple[Any, Any, Any]:
    """Returns (tiny Qwen2 model, its tokenizer, the arith task) at the embedded default's shape."""
    from vapo_lab.models.tiny import build_tiny_model
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks.arith import ArithTask

    task = ArithTask(seed=0, n_train=0, n_eval=256, max_digits=max_digits)
    tokenizer = build_tokenizer(task.vocabulary())
    model = build_tiny_model(
        tokenizer,
        hidden_size=hidden_size,
        num_layers=num_layers,
        intermediate_size=intermediate_size,
    ).eval()
    return model, tokenizer, task


def build_arch_model(arch: str, seed: int) -> Any:
    """Returns a random-init Qwen2 causal LM of ``models.shapes.KNOWN_ARCHS[arch]``'s shape."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vapo_lab.models.shapes import known_arch

    s = known_arch(arch)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        num_hidden_layers=s.num_layers,
        num_attention_heads=s.num_heads,
        num_key_value_heads=s.num_kv_heads,
        intermediate_size=s.intermediate_size,
        tie_word_embeddings=s.tie_word_embeddings,
        max_position_embeddings=s.max_position_embeddings,
    )
    return Qwen2ForCausalLM(config).eval()


def run_generate_benchmark(
    prompts: int = 8,
    samples: int = 8,
    max_new_tokens: int = 128,
    repeats: int = 3,
    threads: int | None = 1,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 4,
    intermediate_size: int = 352,
    device: str = "cpu",
    arch: str | None = None,
    hf_compile: bool | None = None,
) -> dict[str, Any]:
    """Returns the built-in sampler's and HF ``generate``'s timings on one batch, and their ratio.

    Args:
        prompts: prompts in the batch (the first of the arith eval split).
        max_new_tokens: new tokens per row, generated exactly (eos disabled in both).
        threads: torch CPU threads for both; None keeps the current setting.
        seed: seeds the built-in sampler's generator and torch's global RNG (HF samples from it).
        device: "cpu" (float32) or "cuda" (bfloat16, both engines).
        arch: a known shape (``models.shapes.KNOWN_ARCHS``) at random init instead of the tiny
            model; its prompts are the tiny tokenizer's ids (a random model reads any ids).
        hf_compile: HF ``generate`` with a static cache and ``torch.compile(mode=
            "reduce-overhead")``, falling back to eager where that fails; None: on a GPU only.

    Returns:
        {"rows", "max_new_tokens", "prompt_tokens" (mean), "threads", "engines": [{"engine",
        "seconds", "samples_per_s", "tokens_per_s"}, ...], "ratio_tokens_per_s" (built-in / HF),
        "ratio_samples_per_s", "device", "dtype", "hf_mode"}.

    Raises:
        ConfigError: a size below 1.
        RuntimeError: an engine did not generate exactly ``max_new_tokens`` tokens per row.
    """
    for name, value in (
        ("prompts", prompts),
        ("samples", samples),
        ("max_new_tokens", max_new_tokens),
        ("repeats", repeats),
    ):
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be >= 1")
    from transformers import GenerationConfig

    from vapo_lab.rollout.sampler import sample

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device here; run on a GPU machine or drop it")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    hf_compile = device == "cuda" if hf_compile is None else hf_compile
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, tokenizer, task = build_bench_model(hidden_size, num_layers, intermediate_size)
        if arch is not None:
            model = build_arch_model(arch, seed)
        model = model.to(device=device, dtype=dtype)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        problems = task.eval[:prompts]
        ids = [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        rows = prompts * samples
        no_eos = -1  # no token has this id: nothing ends early
        pad = tokenizer.pad_token_id

        def ours() -> int:
            g = torch.Generator().manual_seed(seed)
            s = sample(
                model,
                ids,
                n=samples,
                max_new_tokens=max_new_tokens,
                temperature=TEMPERATURE,
                top_p=TOP_P,
                eos_id=no_eos,
                pad_id=pad,
                generator=g,
                max_batch=max(256, rows),
            )
            sync()
            return int(s.lengths.sum())

        width = max(len(x) for x in ids)
        input_ids = torch.full((prompts, width), pad, dtype=torch.long)
        attention = torch.zeros(prompts, width, dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, width - len(x) :] = torch.tensor(x)
            attention[i, width - len(x) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        # top_k=0: HF's default top_k=50 would otherwise cut the vocabulary before top-p (less work,
        # and another distribution than ours)
        config = GenerationConfig(
            do_sample=True,
            temperature=TEMPERATURE,
            top_p=TOP_P,
            top_k=0,
            max_new_tokens=max_new_tokens,
            num_return_sequences=samples,
            eos_token_id=None,
            pad_token_id=pad,
            bos_token_id=None,
        )
        model.generation_config.eos_token_id = None

        def hf() -> int:
            torch.manual_seed(seed)
            with torch.no_grad():
                out = model.generate(
                    input_ids=input_ids, attention_mask=attention, generation_config=config
                )
            sync()
            return int(out.shape[0] * (out.shape[1] - width))

        hf_mode = "eager, dynamic cache"
        ours_timed = _median_s(ours, repeats)  # before HF compiles the shared model's forward
        if hf_compile:
            eager_forward = model.forward
            try:
                config.cache_implementation = "static"
                model.forward = torch.compile(model.forward, mode="reduce-overhead")
                hf_timed = _median_s(hf, repeats)
                hf_mode = "static cache + torch.compile(mode='reduce-overhead')"
            except Exception as e:  # an engine's own failure: measured eagerly instead, and said
                model.forward = eager_forward
                config.cache_implementation = None
                hf_mode = f"eager, dynamic cache (static + compile failed: {type(e).__name__})"
                hf_timed = _median_s(hf, repeats)
        else:
            hf_timed = _median_s(hf, repeats)

        engines = []
        for name, (seconds, tokens) in (
            ("built-in sampler", ours_timed),
            ("HF generate", hf_timed),
        ):
            if tokens != rows * max_new_tokens:
                raise RuntimeError(
                    f"{name} generated {tokens} tokens, not {rows} rows x {max_new_tokens}: "
                    "the comparison would be unfair"
                )
            engines.append(
                {
                    "engine": name,
                    "seconds": seconds,
                    "samples_per_s": rows / seconds,
                    "tokens_per_s": tokens / seconds,
                }
            )
        ratio = engines[0]["tokens_per_s"] / engines[1]["tokens_per_s"]
        return {
            "rows": rows,
            "prompts": prompts,
            "samples": samples,
            "max_new_tokens": max_new_tokens,
            "prompt_tokens": sum(map(len, ids)) / len(ids),
            "threads": torch.get_num_threads(),
            "repeats": repeats,
            "n_params": sum(p.numel() for p in model.parameters()),
            "engines": engines,
            "ratio_tokens_per_s": ratio,
            "ratio_samples_per_s": engines[0]["samples_per_s"] / engines[1]["samples_per_s"],
            "device": device,
            "dtype": str(dtype).removeprefix("torch."),
            "arch": arch or "tiny",
            "hf_mode": hf_mode,
        }
    finally:
        torch.set_num_threads(previous)


def format_generate_benchmark(result: dict[str, Any]) -> str:
    """Returns ``run_generate_benchmark``'s report: settings, a line per engine, the ratio."""
    r = result
    lines = [
        (
            f"{r.get('arch', 'tiny')} Qwen2 ({r['n_params'] / 1e6:.2f}M params, "
            f"{r.get('dtype', 'float32')}, {r.get('device', 'cpu')}, {r['threads']} threads); "
            f"{r['prompts']} prompts x {r['samples']} samples = {r['rows']} rows, "
            f"prompts {r['prompt_tokens']:.0f} tokens on average; "
            f"exactly {r['max_new_tokens']} new tokens per row (eos disabled in both); "
            f"temperature {TEMPERATURE}, top_p {TOP_P}; "
            f"median of {r['repeats']} runs after a warm-up"
        ),
        f"{'engine':<18} {'seconds':>9} {'samples/s':>10} {'tokens/s':>10}",
    ]
    for e in r["engines"]:
        lines.append(
            f"{e['engine']:<18} {e['seconds']:>9.3f} {e['samples_per_s']:>10.1f} "
            f"{e['tokens_per_s']:>10.0f}"
        )
    lines.append(
        f"ratio built-in / HF generate: {r['ratio_tokens_per_s']:.2f}x tokens/s "
        f"({r['ratio_samples_per_s']:.2f}x samples/s); HF generate: "
        f"{r.get('hf_mode', 'eager, dynamic cache')}"
    )
    return "\n".join(lines)


__all__ = ["build_bench_model", "format_generate_benchmark", "run_generate_benchmark"]
