"""Benchmarks the built-in sampler against Hugging Face ``model.generate`` and vLLM on one model.

Model, prompts, sampling, threads and the exact number of new tokens are held equal, so the ratios
measure the decoding loops alone (docs/benchmarks.md#generation). On CPU the model is the embedded
default's shape (random init, or its shipped base model); ``arch`` gives a random-init model of a
known shape (e.g. Qwen2.5-0.5B), on a GPU in bfloat16, where HF ``generate`` runs with a static
cache and a compiled forward if that works, else eagerly, and the result says which. The engines'
timed runs are interleaved round by round after an untimed warm-up each; vLLM (``engines`` with
"vllm") samples from its own engine, built once from the same weights saved to a folder.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from vapo_lab.errors import ConfigError

TEMPERATURE = 1.0
TOP_P = 0.7
# the engines, in the order of the default interleaving; their names in the report
ENGINES = {"builtin": "built-in sampler", "vllm": "vLLM", "hf": "HF generate"}
DEFAULT_ENGINES = ("builtin", "hf")
VLLM_BLOCK = 128  # tokens in a KV-cache block of vLLM's CPU platform: a row takes whole blocks


def parse_engines(text: str | Sequence[str]) -> tuple[str, ...]:
    """Returns the engines of ``--engines`` ("builtin,vllm,hf"), in the order given.

    Raises:
        ConfigError: none, an unknown or a repeated one.
    """
    names = [x.strip() for x in text.split(",")] if isinstance(text, str) else list(text)
    names = [x for x in names if x]
    unknown = [x for x in names if x not in ENGINES]
    if not names or unknown or len(set(names)) < len(names):
        raise ConfigError(
            f"--engines {','.join(names) or repr(text)}: give each of {', '.join(ENGINES)} at most "
            "once, comma-separated"
        )
    return tuple(names)


def require_vllm_engine() -> None:
    """Checks that vLLM can run here, before any model is built.

    Raises:
        ConfigError: no vLLM, too old a one or no device it runs on; one line.
    """
    from vapo_lab.rollout.vllm_backend import BackendUnavailable, require_vllm

    try:
        require_vllm()
    except BackendUnavailable as e:
        if "not installed" in str(e):
            raise ConfigError(
                "--engines vllm needs vLLM, which is not installed here: make its environment "
                "with `bash scripts/vllm-env.sh` (vLLM's CPU build) and run its vapo-lab, or "
                "drop vllm from --engines"
            ) from None
        raise ConfigError(f"--engines vllm: {e}") from None


def interleaved(engines: Sequence[str], repeats: int) -> list[str]:
    """Returns the order of the timed runs: round by round, every engine once in the order given
    (A B C A B C ...), so a change in the machine's load falls on every engine alike."""
    return [engine for _ in range(repeats) for engine in engines]


def summarize(seconds: Sequence[float], tokens: int, rows: int) -> dict[str, float]:
    """Returns one engine's rates over its timed runs: the median run's seconds, the median of the
    runs' tokens/s and samples/s, and the slowest and fastest run's tokens/s (the spread)."""
    rates = [tokens / s for s in seconds]
    return {
        "seconds": statistics.median(seconds),
        "samples_per_s": statistics.median(rows / s for s in seconds),
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_min": min(rates),
        "tokens_per_s_max": max(rates),
    }


def time_engines(
    runs: dict[str, Callable[[], int]], repeats: int
) -> dict[str, tuple[float, list[float], list[int]]]:
    """Times each engine's run (it returns the tokens it generated): an untimed warm-up each, then
    ``repeats`` rounds in ``interleaved`` order.

    Returns:
        {engine: (warm-up seconds, the timed runs' seconds, their tokens)}.
    """
    timed: dict[str, tuple[float, list[float], list[int]]] = {}
    for name, fn in runs.items():
        start = time.perf_counter()
        fn()
        timed[name] = (time.perf_counter() - start, [], [])
    for name in interleaved(list(runs), repeats):
        start = time.perf_counter()
        tokens = runs[name]()
        timed[name][1].append(time.perf_counter() - start)
        timed[name][2].append(tokens)
    return timed


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
    base: bool = False,
    dtype: str | None = None,
) -> tuple[Any, Any, Any]:
    """Returns (model on ``device`` in ``dtype``, its tokenizer, the task of its prompts): the tiny
    model at random init, the embedded default's shipped base model (``base``), or a random-init
    one of ``arch``'s shape; built once for every setting of a grid.

    Args:
        dtype: "float32" or "bfloat16"; None: float32 on CPU, bfloat16 on a GPU.

    Raises:
        ConfigError: an unknown device, cuda without a GPU, an unknown shape or dtype, both a shape
            and the base model.
    """
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device here; run on a GPU machine or drop it")
    if base and arch is not None:
        raise ConfigError(f"--base and --arch {arch}: choose one model")
    torch_dtype = _dtype(device, dtype)
    if base:
        model, tokenizer, task = _base_model()
    else:
        model, tokenizer, task = build_bench_model(hidden_size, num_layers, intermediate_size)
    if arch is not None:
        model = build_arch_model(arch, seed, device)
    return model.to(device=device, dtype=torch_dtype), tokenizer, task


def _base_model() -> tuple[Any, Any, Any]:
    """Returns (the embedded default's base model, its tokenizer, the default task): shipped in the
    package, so nothing is built."""
    from vapo_lab.basemodel import build_base_for
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed
    from vapo_lab.models.load import load_model_and_tokenizer
    from vapo_lab.trainer.setup import task_for

    cfg = typed(compose_config(overrides=[]).cfg)
    built = build_base_for(cfg.model, cfg.task, progress=None)
    model, tokenizer = load_model_and_tokenizer(built.path)
    return model.eval(), tokenizer, task_for(cfg.task)


def _dtype(device: str, name: str | None = None) -> torch.dtype:
    if name is None:
        return torch.bfloat16 if device == "cuda" else torch.float32
    if name not in ("float32", "bfloat16"):
        raise ConfigError(f"--dtype {name}: choose float32 or bfloat16")
    return getattr(torch, name)


def prompt_ids(tokenizer: Any, task: Any, prompts: int) -> list[list[int]]:
    """Returns the ids of the task's first ``prompts`` held-out prompts (no special tokens)."""
    return [tokenizer(p.prompt, add_special_tokens=False)["input_ids"] for p in task.eval[:prompts]]


def kv_cache_gb(shape: Any, rows: int, max_model_len: int, dtype: torch.dtype) -> float:
    """Returns the host memory (GiB) of a vLLM CPU KV cache that holds every row at once, each in
    whole blocks; at least the wrapper's 1 GiB (a smaller one would make vLLM queue rows)."""
    from vapo_lab.models.counts import kv_bytes_per_token

    per_token = kv_bytes_per_token(shape, dtype.itemsize)
    blocks = rows * (math.ceil(max_model_len / VLLM_BLOCK) + 1)
    return max(1.0, blocks * VLLM_BLOCK * per_token / 2**30)


def build_vllm_engine(
    built: tuple[Any, Any, Any],
    folder: str | Path,
    settings: Sequence[tuple[int, int]],
    samples: int,
    threads: int | None = 1,
    seed: int = 0,
    eager: bool = False,
) -> tuple[Any, float]:
    """Saves ``bench_model``'s model and tokenizer to ``folder`` (vLLM loads a Hugging Face folder)
    and builds an in-process vLLM engine from it, sized for the largest of ``settings``.

    Args:
        settings: the (prompts, max_new_tokens) the engine will run: its context and KV cache.
        threads: torch CPU threads during the build (vLLM's CPU platform compiles for them).
        eager: vLLM without torch.compile (``rollout.vllm.enforce_eager``; a faster build).

    Returns:
        (the engine, seconds its build took: saving the folder is not counted).

    Raises:
        ConfigError: vLLM cannot run here (``require_vllm_engine``).
    """
    require_vllm_engine()
    from vapo_lab.models.shapes import Shape
    from vapo_lab.rollout.vllm_backend import VllmEngine

    model, tokenizer, task = built
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    most = max(p for p, _ in settings)
    max_model_len = max(map(len, prompt_ids(tokenizer, task, most))) + max(t for _, t in settings)
    dtype = next(model.parameters()).dtype
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        engine = VllmEngine(
            folder,
            dtype=str(dtype).removeprefix("torch."),
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=eager,
            cpu_kv_cache_gb=kv_cache_gb(
                Shape.from_hf_config(model.config.to_dict()), most * samples, max_model_len, dtype
            ),
        )
        return engine, time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)  # the engine's build keeps torch.set_num_threads working


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
    engines: str | Sequence[str] = DEFAULT_ENGINES,
    vllm: tuple[Any, float] | None = None,
    vllm_eager: bool = False,
    base: bool = False,
    dtype: str | None = None,
) -> dict[str, Any]:
    """Returns each engine's timings on one batch, and the built-in sampler's ratios to the others.

    The engines' timed runs are interleaved round by round (``interleaved``) after an untimed
    warm-up each. HF ``generate`` is timed eagerly among them, so that a ratio exists before a
    compile (which can take minutes on a GPU) starts; with ``hf_compile`` it is then timed again
    compiled, alone.

    Args:
        prompts: prompts in the batch (the first of the task's held-out split).
        max_new_tokens: new tokens per row, generated exactly (eos disabled in every engine).
        repeats: timed runs per engine (rounds).
        threads: torch CPU threads for every engine; None keeps the current setting.
        seed: seeds the built-in sampler's generator and torch's global RNG (HF and vLLM sample
            from it).
        device: "cpu" (float32 by default) or "cuda" (bfloat16 by default).
        arch: a known shape (``models.shapes.KNOWN_ARCHS``) at random init instead of the tiny
            model; its prompts are the tiny tokenizer's ids (a random model reads any ids).
        hf_compile: HF ``generate`` also with a static cache and ``torch.compile(mode=
            "reduce-overhead")`` (a failure is said); None: on a GPU only.
        built: ``bench_model``'s (model, tokenizer, task) for ``device``; None: built here.
        partial: called with the result of the eager timings before the compiled one starts.
        engines: "builtin", "vllm", "hf" (``parse_engines``), in the order each round runs them.
        vllm: ``build_vllm_engine``'s (engine, build seconds) for ``built``; None: built here
            (``vllm_eager``: without torch.compile) when ``engines`` has vllm.
        base: the embedded default's shipped base model instead of the random tiny one.
        dtype: "float32" or "bfloat16" (``bench_model``); None: the device's default.

    Returns:
        {"rows", "max_new_tokens", "prompt_tokens" (mean), "threads", "engines": [{"engine",
        "mode", "seconds", "samples_per_s", "tokens_per_s", "tokens_per_s_min",
        "tokens_per_s_max", "warmup_s"}, ...] (in ``engines``' order, HF generate compiled last
        where it ran), "ratios" ({engine: built-in tokens/s / its}), "device", "dtype"; with vLLM
        "vllm_build_s"; with the built-in sampler and HF generate "ratio_tokens_per_s" (built-in /
        the faster HF generate), "ratio_samples_per_s" and "hf_mode" (how that HF generate ran)}.

    Raises:
        ConfigError: a size below 1, an unknown engine, vLLM asked for and missing; an unknown
            device or shape (``bench_model``).
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
    engines = parse_engines(engines)
    if "vllm" in engines and vllm is None:
        require_vllm_engine()  # before a model is built
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with contextlib.ExitStack() as stack:
            built = built or bench_model(
                device, arch, seed, hidden_size, num_layers, intermediate_size, base, dtype
            )
            if "vllm" in engines and vllm is None:
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="vapo-bench-"))
                vllm = build_vllm_engine(
                    built, folder, [(prompts, max_new_tokens)], samples, threads, seed, vllm_eager
                )
            return _measure(
                built,
                engines,
                vllm,
                prompts=prompts,
                samples=samples,
                max_new_tokens=max_new_tokens,
                repeats=repeats,
                seed=seed,
                device=device,
                hf_compile=device == "cuda" if hf_compile is None else hf_compile,
                partial=partial,
                label=arch or ("base" if base else "tiny"),
            )
    finally:
        torch.set_num_threads(previous)


def _measure(
    built: tuple[Any, Any, Any],
    engines: tuple[str, ...],
    vllm: tuple[Any, float] | None,
    prompts: int,
    samples: int,
    max_new_tokens: int,
    repeats: int,
    seed: int,
    device: str,
    hf_compile: bool,
    partial: Callable[[dict[str, Any]], None] | None,
    label: str,
) -> dict[str, Any]:
    """``run_generate_benchmark`` with its model, engines and threads set (its arguments)."""
    from transformers import GenerationConfig

    from vapo_lab.rollout.sampler import sample

    model, tokenizer, task = built
    dtype = next(model.parameters()).dtype
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ids = prompt_ids(tokenizer, task, prompts)
    prompts = len(ids)
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
    modes = {"builtin": "fast decoder (CUDA graphs on a GPU)", "hf": eager}
    runs = {"builtin": ours, "hf": hf}
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
        "arch": label,
    }
    if "vllm" in engines:
        engine, settings["vllm_build_s"] = vllm
        runs["vllm"] = _vllm_run(engine, ids, samples, max_new_tokens, seed)
        modes["vllm"] = f"vLLM {engine.version}, in-process, {_vllm_mode(engine)}"
    timed = [
        (ENGINES[name], modes[name], t)
        for name, t in time_engines({name: runs[name] for name in engines}, repeats).items()
    ]
    if not hf_compile or "hf" not in engines:
        return _result(settings, timed)
    if partial is not None:
        partial(_result(settings, timed, f"{eager}; static cache + torch.compile next"))
    eager_forward = model.forward
    try:
        config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead")
        compiled = "static cache + torch.compile(mode='reduce-overhead')"
        timed.append(("HF generate, compiled", compiled, time_engines({"hf": hf}, repeats)["hf"]))
    except Exception as e:  # an engine's own failure: the eager timing stands, and is said
        return _result(settings, timed, f"{eager} (static + compile failed: {type(e).__name__})")
    finally:
        model.forward = eager_forward  # the next setting's eager timing is eager
        config.cache_implementation = None
    return _result(settings, timed)


def _vllm_run(
    engine: Any, ids: list[list[int]], samples: int, max_new_tokens: int, seed: int
) -> Callable[[], int]:
    """Returns a run of vLLM on the batch: the rollout's request (each sampled token's log-prob,
    no detokenizing) with eos ignored, so every row has exactly ``max_new_tokens`` tokens (the
    wrapper's ``sample`` stops at eos; a model's own eos can only be ignored by vLLM itself)."""
    from vllm import SamplingParams

    params = SamplingParams(
        n=samples,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        max_tokens=max_new_tokens,
        ignore_eos=True,
        logprobs=0,
        detokenize=False,
    )
    requests = [{"prompt_token_ids": list(x)} for x in ids]

    def run() -> int:
        torch.manual_seed(seed)  # in-process, an unseeded request draws from torch's generator
        outputs = engine.llm.generate(requests, params, use_tqdm=False)
        return sum(len(c.token_ids) for out in outputs for c in out.outputs)

    return run


def _vllm_mode(engine: Any) -> str:
    """Returns how the engine runs its model: eagerly or compiled (its compilation config)."""
    eager = getattr(getattr(engine.llm, "llm_engine", None), "vllm_config", None)
    eager = getattr(getattr(eager, "model_config", None), "enforce_eager", None)
    return {True: "eager", False: "torch.compile"}.get(eager, "mode unknown")


def _result(
    settings: dict[str, Any],
    timed: list[tuple[str, str, tuple[float, list[float], list[int]]]],
    hf_mode: str | None = None,
) -> dict[str, Any]:
    """Returns the benchmark's result: ``settings``, each engine's rates (name, how it ran,
    ``time_engines``' timings) and the built-in sampler's ratios to the others (to the faster HF
    generate for "ratio_tokens_per_s").

    Raises:
        RuntimeError: an engine did not generate exactly rows x max_new_tokens tokens in a run.
    """
    rows, want = settings["rows"], settings["rows"] * settings["max_new_tokens"]
    engines = []
    for name, mode, (warmup_s, seconds, tokens) in timed:
        wrong = [t for t in tokens if t != want]
        if wrong:
            raise RuntimeError(
                f"{name} generated {wrong[0]} tokens, not {rows} rows x "
                f"{settings['max_new_tokens']}: the comparison would be unfair"
            )
        engines.append(
            {"engine": name, "mode": mode, **summarize(seconds, want, rows), "warmup_s": warmup_s}
        )
    result: dict[str, Any] = {**settings, "engines": engines}
    ours = next((e for e in engines if e["engine"] == ENGINES["builtin"]), None)
    if ours is not None:
        result["ratios"] = {
            e["engine"]: ours["tokens_per_s"] / e["tokens_per_s"] for e in engines if e is not ours
        }
    hfs = [e for e in engines if e["engine"].startswith(ENGINES["hf"])]
    if ours is not None and hfs:
        hf = max(hfs, key=lambda e: e["tokens_per_s"])
        result["ratio_tokens_per_s"] = ours["tokens_per_s"] / hf["tokens_per_s"]
        result["ratio_samples_per_s"] = ours["samples_per_s"] / hf["samples_per_s"]
        result["hf_mode"] = hf_mode or hf["mode"]
    return result


def format_generate_benchmark(result: dict[str, Any]) -> str:
    """Returns ``run_generate_benchmark``'s report: settings, a line per engine, the ratios."""
    r = result
    n = len(r["engines"])
    every = {1: "it", 2: "both"}.get(n, f"all {n}")
    lines = [
        (
            f"{r.get('arch', 'tiny')} Qwen2 ({r['n_params'] / 1e6:.2f}M params, "
            f"{r.get('dtype', 'float32')}, {r.get('device', 'cpu')}, {r['threads']} threads); "
            f"{r['prompts']} prompts x {r['samples']} samples = {r['rows']} rows, "
            f"prompts {r['prompt_tokens']:.0f} tokens on average; "
            f"exactly {r['max_new_tokens']} new tokens per row (eos disabled in {every}); "
            f"temperature {TEMPERATURE}, top_p {TOP_P}; "
            f"median of {r['repeats']} interleaved runs after a warm-up each"
        ),
        f"{'engine':<22} {'seconds':>9} {'samples/s':>10} {'tokens/s':>10} {'min-max':>15} "
        f"{'warm-up s':>10}",
    ]
    for e in r["engines"]:
        spread = (
            f"{e['tokens_per_s_min']:.0f}-{e['tokens_per_s_max']:.0f}"
            if "tokens_per_s_min" in e
            else ""
        )
        warmup = f"{e['warmup_s']:.2f}" if "warmup_s" in e else ""
        lines.append(
            f"{e['engine']:<22} {e['seconds']:>9.3f} {e['samples_per_s']:>10.1f} "
            f"{e['tokens_per_s']:>10.0f} {spread:>15} {warmup:>10}"
        )
    if "vllm_build_s" in r:
        vllm = next(e for e in r["engines"] if e["engine"] == ENGINES["vllm"])
        lines.append(f"vLLM: {vllm['mode']}; engine built in {r['vllm_build_s']:.1f} s (not timed)")
    if "ratio_tokens_per_s" in r:
        lines.append(
            f"ratio built-in / HF generate: {r['ratio_tokens_per_s']:.2f}x tokens/s "
            f"({r['ratio_samples_per_s']:.2f}x samples/s); HF generate: "
            f"{r.get('hf_mode', 'eager, dynamic cache')}"
        )
    if ENGINES["vllm"] in r.get("ratios", {}):
        lines.append(f"ratio built-in / vLLM: {r['ratios'][ENGINES['vllm']]:.2f}x tokens/s")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_ENGINES",
    "ENGINES",
    "bench_model",
    "build_bench_model",
    "build_vllm_engine",
    "format_generate_benchmark",
    "interleaved",
    "kv_cache_gb",
    "parse_engines",
    "require_vllm_engine",
    "run_generate_benchmark",
    "summarize",
    "time_engines",
]
