"""Rollout: the built-in KV-cache sampler and, on GPUs, vLLM, behind one call.

``make_generator`` returns ``generate(prompts, n, temperature, top_p, generator) -> Samples``; the
trainer, value pretraining, the reward model and evaluation all sample through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vapo_lab.rollout.sampler import Samples, sample

if TYPE_CHECKING:
    from vapo_lab.config.schema import ModelConfig, VllmConfig

Generate = Callable[[Sequence[Sequence[int]], int, float, float, torch.Generator], Samples]


def make_generator(
    backend: str,
    policy: nn.Module,
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    engine: Any = None,
    graphs: bool = True,
) -> Generate:
    """Returns the sampling function of ``rollout.backend`` (builtin, or vllm with its
    ``engine``); ``graphs``: the builtin sampler's CUDA graphs on a GPU (rollout.cuda_graphs)."""
    if backend == "builtin":

        def generate(
            prompts: Sequence[Sequence[int]],
            n: int,
            temperature: float,
            top_p: float,
            generator: torch.Generator,
        ) -> Samples:
            return sample(
                policy,
                prompts,
                n=n,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                eos_id=eos_ids,
                pad_id=pad_id,
                generator=generator,
                graphs=graphs,
            )

        return generate

    def generate_vllm(
        prompts: Sequence[Sequence[int]],
        n: int,
        temperature: float,
        top_p: float,
        generator: torch.Generator,
    ) -> Samples:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        return engine.sample(prompts, n, max_new_tokens, temperature, top_p, eos_ids, pad_id, seed)

    return generate_vllm


def make_engine(
    model_path: str | Path, vllm: VllmConfig, model: ModelConfig, seed: int, max_model_len: int
) -> Any:
    """Returns this rank's vLLM engine (rollout.backend=vllm); fails early and clearly.

    Under torch.distributed every rank builds its own engine here, colocated with its trainer
    process. ``max_model_len`` is the longest prompt plus ``rollout.max_new_tokens``: vLLM reserves
    KV cache for at least one sequence of that length, and a model's whole context (131,072 tokens
    for Qwen2.5-7B and -32B) would take much of ``gpu_memory_utilization``'s share.
    """
    from vapo_lab.rollout.vllm_backend import VllmEngine

    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)
    return VllmEngine(
        model_path,
        dtype=model.dtype,
        seed=seed,
        max_model_len=max_model_len,
        gpu_memory_utilization=vllm.gpu_memory_utilization,
        tensor_parallel_size=vllm.tensor_parallel_size,
        enforce_eager=vllm.enforce_eager,
        enable_sleep_mode=vllm.enable_sleep_mode,
        sleep_level=vllm.sleep_level,
        weight_bucket_mb=vllm.weight_bucket_mb,
        dummy_weights=vllm.dummy_weights,
        seed_per_request=vllm.seed_per_request,
        cpu_kv_cache_gb=vllm.cpu_kv_cache_gb,
        rank=rank,
        world_size=world,
        trust_remote_code=model.trust_remote_code,
        tokenizer_path=model.tokenizer_path,
    )
