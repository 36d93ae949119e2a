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


def build_arch_model(arch: str, seed: int, device: str = "cpu") -> Any:
    """Returns a random-init Qwen2 causal LM of ``models.shapes.KNOWN_ARCHS[arch]``'s shape, built
    on ``device`` (a 0.5B model's initialisation takes seconds on one CPU thread)."""
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
    with torch.device(device):
        return Qwen2ForCausalLM(config).eval()


def bench_model(
    device: str = "cpu",
    arch: str | None = None,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 4,
    intermediate_size: int = 352,
) -> tuple[Any, Any, Any]:
    """Returns (model on ``device`` in its dtype, the tiny tokenizer, the arith task): the tiny
    model, or a random-init one of ``arch``'s shape; built once for every setting of a grid.

    Raises:
        ConfigError: an unknown device, cuda without a GPU, an unknown shape.
    """
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device here; run on a GPU machine or drop it")
    model, tokenizer, task = build_bench_model(hidden_size, num_layers, intermediate_size)
    if arch is not None:
        model = build_arch_model(arch, seed, device)
    return model.to(device=device, dtype=_dtype(device)), tokenizer, task


def _dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device == "cuda" else torch.float32


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
    built: tuple[Any, Any, Any] | None = None,
    partial: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Returns the built-in sampler's and HF ``generate``'s timings on one batch, and their ratio.

    HF ``generate`` is timed eagerly first, so that a ratio exists before a compile (which can
    take minutes on a GPU) starts; with ``hf_compile`` it is then timed again compiled.

    Args:
        prompts: prompts in the batch (the first of the arith eval split).
        max_new_tokens: new tokens per row, generated exactly (eos disabled in both).
        threads: torch CPU threads for both; None keeps the current setting.
        seed: seeds the built-in sampler's generator and torch's global RNG (HF samples from it).
        device: "cpu" (float32) or "cuda" (bfloat16, both engines).
        arch: a known shape (``models.shapes.KNOWN_ARCHS``) at random init instead of the tiny
            model; its prompts are the tiny tokenizer's ids (a random model reads any ids).
        hf_compile: HF ``generate`` also with a static cache and ``torch.compile(mode=
            "reduce-overhead")`` (a failure is said); None: on a GPU only.
        built: ``bench_model``'s (model, tokenizer, task) for ``device``; None: built here.
        partial: called with the result of the eager timings before the compiled one starts.

    Returns:
        {"rows", "max_new_tokens", "prompt_tokens" (mean), "threads", "engines": [{"engine",
        "seconds", "samples_per_s", "tokens_per_s"}, ...] (HF generate eager, then compiled where
        it ran), "ratio_tokens_per_s" (built-in / the faster HF generate), "ratio_samples_per_s",
        "device", "dtype", "hf_mode" (how that HF generate ran)}.

    Raises:
        ConfigError: a size below 1; an unknown device or shape (``bench_model``).
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

    dtype = _dtype(device)
    hf_compile = device == "cuda" if hf_compile is None else hf_compile
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model, tokenizer, task = built or bench_model(
            device, arch, seed, hidden_size, num_layers, intermediate_size
        )
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

        eager = "eager, dynamic cache"
        ours_timed = _median_s(ours, repeats)  # before HF compiles the shared model's forward
        timed = [
            ("built-in sampler", "fast decoder (CUDA graphs on a GPU)", ours_timed),
            ("HF generate", eager, _median_s(hf, repeats)),
        ]
        settings = {
            "rows": rows,
            "prompts": prompts,
            "samples": samples,
            "max_new_tokens": max_new_tokens,
            "prompt_tokens": sum(map(len, ids)) / len(ids),
            "threads": torch.get_num_threads(),
            "repeats": repeats,
            "n_params": sum(p.numel() for p in model.parameters()),
            "device": device,
            "dtype": str(dtype).removeprefix("torch."),
            "arch": arch or "tiny",
        }
        if not hf_compile:
            return _result(settings, timed)
        if partial is not None:
            partial(_result(settings, timed, f"{eager}; static cache + torch.compile next"))
        eager_forward = model.forward
        try:
            config.cache_implementation = "static"
            model.forward = torch.compile(model.forward, mode="reduce-overhead")
            compiled = "static cache + torch.compile(mode='reduce-overhead')"
            timed.append(("HF generate, compiled", compiled, _median_s(hf, repeats)))
        except Exception as e:  # an engine's own failure: the eager timing stands, and is said
            return _result(
                settings, timed, f"{eager} (static + compile failed: {type(e).__name__})"
            )
        finally:
            model.forward = eager_forward  # the next setting's eager timing is eager
            config.cache_implementation = None
        return _result(settings, timed)
    finally:
        torch.set_num_threads(previous)


def _result(
    settings: dict[str, Any],
    timed: list[tuple[str, str, tuple[float, int]]],
    hf_mode: str | None = None,
) -> dict[str, Any]:
    """Returns the benchmark's result: ``settings``, each engine's rates (name, how it ran,
    (seconds, tokens)), and the built-in sampler's ratio to the faster HF generate.

    Raises:
        RuntimeError: an engine did not generate exactly rows x max_new_tokens tokens.
    """
    rows, want = settings["rows"], settings["rows"] * settings["max_new_tokens"]
    engines = []
    for name, mode, (seconds, tokens) in timed:
        if tokens != want:
            raise RuntimeError(
                f"{name} generated {tokens} tokens, not {rows} rows x "
                f"{settings['max_new_tokens']}: the comparison would be unfair"
            )
        engines.append(
            {
                "engine": name,
                "mode": mode,
                "seconds": seconds,
                "samples_per_s": rows / seconds,
                "tokens_per_s": tokens / seconds,
            }
        )
    ours, hf = engines[0], max(engines[1:], key=lambda e: e["tokens_per_s"])
    return {
        **settings,
        "engines": engines,
        "ratio_tokens_per_s": ours["tokens_per_s"] / hf["tokens_per_s"],
        "ratio_samples_per_s": ours["samples_per_s"] / hf["samples_per_s"],
        "hf_mode": hf_mode or hf["mode"],
    }


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
        f"{'engine':<22} {'seconds':>9} {'samples/s':>10} {'tokens/s':>10}",
    ]
    for e in r["engines"]:
        lines.append(
            f"{e['engine']:<22} {e['seconds']:>9.3f} {e['samples_per_s']:>10.1f} "
            f"{e['tokens_per_s']:>10.0f}"
        )
    lines.append(
        f"ratio built-in / HF generate: {r['ratio_tokens_per_s']:.2f}x tokens/s "
        f"({r['ratio_samples_per_s']:.2f}x samples/s); HF generate: "
        f"{r.get('hf_mode', 'eager, dynamic cache')}"
    )
    return "\n".join(lines)


__all__ = [
    "bench_model",
    "build_bench_model",
    "format_generate_benchmark",
    "run_generate_benchmark",
]
