"""Loading what generation needs: the tokenizer, the policy or a vLLM engine, the sampler, prompts.

All through the trainer's own loader, sampler and prompt encoding, so that evaluation draws what
the trainer's periodic eval draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from vapo_lab.eval.benchmarks import ARITH, EvalBench
from vapo_lab.eval.model_ref import ModelRef
from vapo_lab.eval.settings import EvalError, EvalSettings


@dataclass
class Loaded:
    """A loaded generation engine, ``generate(prompts, n, temperature, top_p, generator)``, and its
    record."""

    policy: Any  # None for vLLM
    tokenizer: Any
    generate: Any
    engine: str
    engine_version: str
    dtype: str
    eos_ids: list[int]

    def context(self) -> int | None:
        """Returns the policy's context length in tokens, None when unknown (no HF policy)."""
        if self.policy is None:
            return None
        return getattr(getattr(self.policy, "config", None), "max_position_embeddings", None)


def device_name(name: str) -> str:
    """Returns the torch device ``--device`` names (auto: CUDA when visible, else CPU)."""
    from vapo_lab.models.load import pick_device

    return str(pick_device(name, "--device"))


def tokenizer_of(ref: ModelRef) -> Any:
    """Returns the tokenizer of ``ref`` (a tiny run's is rebuilt from its task's vocabulary)."""
    if ref.tokenizer_path is not None:
        from vapo_lab.models.load import load_tokenizer

        return load_tokenizer(ref.tokenizer_path, ref.trust_remote_code)
    from vapo_lab.models.tokenizer import build_tokenizer
    from vapo_lab.tasks import build_task

    c = ref.cfg.task
    task = build_task(ARITH, seed=c.seed, n_train=0, n_eval=0, **c.options)
    return build_tokenizer(task.vocabulary())


def _require_vllm() -> None:
    """Raises EvalError, worded for ``--backend vllm``, when vLLM or a GPU is missing."""
    from vapo_lab.rollout.vllm_backend import BackendUnavailable, require_vllm

    try:
        require_vllm()
    except BackendUnavailable as e:
        # no "[gpu]" in the message: the CLI prints errors as rich markup, which eats it
        if "not installed" in str(e):
            raise EvalError(
                "--backend vllm needs vLLM, which is not installed: install vapo-lab with its gpu "
                "extra in a GPU environment of its own (vLLM pins its own torch; "
                "docs/distributed.md, GPU / vLLM), on a CPU run bash scripts/vllm-env.sh "
                "(docs/vllm.md), or use --backend builtin"
            ) from None
        raise EvalError(str(e).replace("rollout.backend=", "--backend ")) from None


def _check_vllm_context(ref: ModelRef, needed: int | None, max_tokens: int) -> None:
    """Raises EvalError when the longest prompt plus ``max_tokens`` (``needed``) exceeds the
    model's context: vLLM refuses to build such an engine (the built-in sampler goes on, out of
    distribution, and says so)."""
    from vapo_lab.models.shapes import read_shape

    context = read_shape(ref.path).max_position_embeddings  # 0: the config does not say
    if needed is None or not context or needed <= context:
        return
    room = context - (needed - max_tokens)
    fix = f"lower --max-tokens to {room}" if room > 0 else "use shorter prompts"
    raise EvalError(
        f"--backend vllm: the longest prompt ({needed - max_tokens} tokens) plus --max-tokens "
        f"{max_tokens} exceeds the model's context of {context} tokens, which vLLM refuses: "
        f"{fix}, or use --backend builtin"
    )


def load_generator(
    ref: ModelRef,
    settings: EvalSettings,
    max_tokens: int,
    seed: int,
    prompt_tokens: Callable[[Any], int] | None = None,
) -> Loaded:
    """Returns the policy, its tokenizer and the sampling function of ``settings.backend``;
    ``prompt_tokens(tokenizer)``: the longest prompt in tokens, for vLLM's context (its
    ``max_model_len``: that plus ``max_tokens``; None: the model's whole context)."""
    import torch
    import transformers

    from vapo_lab import __version__
    from vapo_lab.models.dtypes import DTYPES
    from vapo_lab.models.load import load_causal_lm
    from vapo_lab.rollout import make_generator

    device = device_name(settings.device)
    default = "float32" if device == "cpu" else "bfloat16"
    dtype = settings.dtype or (ref.cfg.model.dtype if ref.cfg is not None else default)
    if dtype not in DTYPES:
        raise EvalError(f"dtype={dtype!r}: use one of {', '.join(DTYPES)}")
    if settings.backend == "vllm":  # fail before loading anything when vLLM or a GPU is missing
        _require_vllm()
    tokenizer = tokenizer_of(ref)
    policy = engine = None
    if settings.backend == "builtin":
        policy = load_causal_lm(ref.path, dtype, ref.trust_remote_code).to(device)
        name, version = (
            "builtin",
            f"vapo-lab {__version__}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}",
        )
    else:
        from vapo_lab.rollout.vllm_backend import VllmEngine

        context = prompt_tokens(tokenizer) + max_tokens if prompt_tokens is not None else None
        _check_vllm_context(ref, context, max_tokens)
        engine = VllmEngine(ref.path, dtype=dtype, seed=seed, max_model_len=context)
        name, version = "vllm", str(engine.version)
    eos_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos_ids or [0])[0]
    generate = make_generator(settings.backend, policy, max_tokens, eos_ids, pad_id, engine)
    return Loaded(policy, tokenizer, generate, name, version, dtype, eos_ids)


def prompt_ids(
    bench: EvalBench, tokenizer: Any, settings: EvalSettings
) -> tuple[list[list[int]], bool]:
    """Returns (prompt token ids per problem, whether a chat template was applied)."""
    from vapo_lab.rollout.prompts import encode_prompts

    if bench.verify is not None:  # arith: the trainer's own prompts
        mode, problems = bench.chat_template or "none", bench.problems
    else:
        mode = settings.chat_template
        problems = [
            replace(p, prompt=settings.template.replace("{problem}", p.prompt))
            for p in bench.problems
        ]
    applied = mode == "auto" and bool(getattr(tokenizer, "chat_template", None))
    return encode_prompts(tokenizer, problems, mode), applied


__all__ = ["Loaded", "device_name", "load_generator", "prompt_ids", "tokenizer_of"]
