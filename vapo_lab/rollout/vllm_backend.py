"""vLLM rollouts on GPUs (``rollout.backend=vllm``; ``pip install 'vapo-lab[gpu]'``).

vLLM is imported only here and only when this backend is chosen; without it, or without a CUDA
GPU, the run stops before any compute with one line naming the fix. The engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the trainer can push the policy's weights into it
after every update with the model's own ``load_weights``. Log-probs returned by vLLM are not used
for the PPO ratio: the trainer recomputes them with the training forward pass, since the two
engines' numerics differ.

Not exercised by CI (no GPU there); the error paths are tested.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vapo_lab.errors import VapoLabError
from vapo_lab.rollout.sampler import Samples


class BackendUnavailable(VapoLabError):
    """The chosen rollout backend cannot run here."""


def require_vllm() -> Any:
    """Returns the vllm module; raises BackendUnavailable when it or a CUDA GPU is missing."""
    try:
        import vllm
    except ImportError:
        raise BackendUnavailable(
            "rollout.backend=vllm needs vLLM, which is not installed: `pip install 'vapo-lab[gpu]'` on a "
            "machine with a CUDA GPU, or use rollout.backend=builtin") from None
    if not torch.cuda.is_available():
        raise BackendUnavailable("rollout.backend=vllm needs a CUDA GPU and none is visible: "
                                 "use rollout.backend=builtin")
    return vllm


class VllmEngine:
    """A vLLM engine holding a copy of the policy, refreshed with ``push_weights``."""

    def __init__(self, model_path: str | Path, dtype: str, seed: int, max_model_len: int | None,
                 gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                 enforce_eager: bool = False) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        vllm = require_vllm()
        self.llm = vllm.LLM(model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
                            gpu_memory_utilization=gpu_memory_utilization,
                            tensor_parallel_size=tensor_parallel_size, enforce_eager=enforce_eager)
        self.version = getattr(vllm, "__version__", "unknown")

    def _model(self) -> nn.Module:
        """Returns the engine's torch model (its location differs across vLLM releases)."""
        executor = self.llm.llm_engine.model_executor
        worker = getattr(executor, "driver_worker", None)
        for path in ("model_runner.model", "worker.model_runner.model"):
            obj: Any = worker
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if obj is not None:
                return obj
        raise BackendUnavailable(
            f"cannot reach the model inside vLLM {self.version} to update its weights: use a vLLM release "
            "with an in-process engine (0.6 to 0.10), or rollout.backend=builtin")

    def push_weights(self, policy: nn.Module) -> None:
        """Copies the policy's current weights into the engine."""
        self._model().load_weights(weights=((name, p.detach()) for name, p in policy.state_dict().items()))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()

    def sample(self, prompts: Sequence[Sequence[int]], n: int, max_new_tokens: int, temperature: float,
               top_p: float, eos_id: int | Sequence[int], pad_id: int, seed: int) -> Samples:
        """Returns n samples per prompt in the built-in sampler's layout (log-probs from vLLM)."""
        from vllm import SamplingParams

        eos = [eos_id] if isinstance(eos_id, int) else list(eos_id)
        params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                                stop_token_ids=eos, logprobs=0, seed=seed)
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        return _to_samples(prompts, outputs, n, max_new_tokens, pad_id)


def _to_samples(prompts: Sequence[Sequence[int]], outputs: Any, n: int, max_new: int, pad_id: int) -> Samples:
    rows = len(prompts) * n
    width = max(len(p) for p in prompts)
    responses = [c for out in outputs for c in out.outputs]
    t = max((len(c.token_ids) for c in responses), default=0)
    prompt_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(rows, width, dtype=torch.bool)
    ids = torch.full((rows, t), pad_id, dtype=torch.long)
    logprobs = torch.zeros(rows, t)
    lengths = torch.zeros(rows, dtype=torch.long)
    finished = torch.zeros(rows, dtype=torch.bool)
    for r, c in enumerate(responses):
        p = prompts[r // n]
        prompt_ids[r, width - len(p):] = torch.as_tensor(list(p))
        prompt_mask[r, width - len(p):] = True
        k = len(c.token_ids)
        ids[r, :k] = torch.as_tensor(list(c.token_ids))
        if c.logprobs:
            logprobs[r, :k] = torch.tensor([lp[tok].logprob for lp, tok in zip(c.logprobs, c.token_ids)])
        lengths[r] = k
        finished[r] = c.finish_reason == "stop"  # "length": cut at max_tokens
    mask = torch.arange(t)[None] < lengths[:, None]
    return Samples(prompt_ids, prompt_mask, ids, mask, logprobs, lengths, finished,
                   torch.arange(len(prompts)).repeat_interleave(n))
