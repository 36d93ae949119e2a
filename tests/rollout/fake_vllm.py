"""A CPU stand-in for the part of vLLM 0.33.0's public API that vapo_lab.rollout.vllm_backend calls.

``install()`` puts this module in ``sys.modules["vllm"]``. It is not vLLM: no paged KV cache, no
prefix cache (vLLM caches whole 16-token blocks, which the tiny task's prompts do not fill), no
CUDA, no kernels. What it does do as vLLM 0.33.0 does, read from that release's wheel
(``vllm-0.33.0``, commit g4ba787ec9; paths inside it):

* ``LLM(...)`` (vllm/entrypoints/llm.py): keyword-only settings, an unknown one a TypeError (they
  go to ``EngineArgs``); loads the model from ``model`` in ``dtype`` and a tokenizer from
  ``tokenizer`` or ``model`` (vLLM needs one unless ``skip_tokenizer_init``); ``max_model_len``
  None takes the config's ``max_position_embeddings``, a larger one is a ValueError
  (vllm/config/model.py ``_get_and_verify_max_len``); ``seed`` re-seeds Python's, NumPy's and
  torch's global RNGs (vllm/utils/torch_utils.py ``set_random_seed``); ``model_config.dtype`` is
  a torch.dtype. ``load_format="dummy"`` builds random weights and reads none (vLLM's
  DummyModelLoader, uniform in ±1e-3).
* ``worker_extension_cls`` (vllm/v1/worker/worker_base.py ``init_worker``): the class named
  "module.Class" is imported and added to the worker's bases, refusing a name the worker
  already has. The worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``
  hands the iterator to the model's ``load_weights``; a parameter given nothing keeps its weights
  (vLLM's layerwise reload restores such a layer's old tensors). tests/vllm/test_stand_in.py
  checks these behaviours against the real engine (its CPU build), call by call.
  ``collective_rpc(method, timeout=None, args=(), kwargs=None)`` runs the method on this
  process's one worker and returns ``[result]`` (vllm/v1/executor/uniproc_executor.py; with
  ``external_launcher`` every rank has one worker of its own). With
  ``VLLM_ENABLE_V1_MULTIPROCESSING`` not "0" the engine core would be another process, where
  tensors (and generators) do not arrive as such: the stand-in then refuses them.
* The worker's ``get_model()`` is a vLLM-style Qwen2 (vllm/model_executor/models/qwen2.py): q/k/v
  fused into ``qkv_proj``, gate/up into ``gate_up_proj``; ``named_parameters()`` gives the vLLM
  names (a tied lm_head only as ``model.embed_tokens.weight``); ``load_weights`` takes (HF name,
  tensor) pairs, copies each into its slice, returns the set of vLLM names written (a fused
  parameter once any of its parts is), and refuses a name the model does not have. The HF model
  computes with views of these fused tensors, so what is loaded is what samples. Under tensor
  parallelism each rank holds the whole model (vLLM would hold a slice).
* ``sleep(level)`` / ``wake_up(tags)`` (vllm/v1/engine/core.py, vllm/v1/worker/gpu_worker.py):
  level 1 keeps a CPU copy of the weights and restores it on waking "weights"; level 2 discards
  them (here: every parameter becomes NaN, so sampling without a push is detectably wrong) and
  keeps the buffers. The scheduler stays paused until every tag is awake again (``wake_up``
  returns whether it is): vLLM would queue the requests and ``generate`` would not return; the
  stand-in raises instead.
* ``generate(prompts, sampling_params, use_tqdm=False)`` returns one ``RequestOutput`` per prompt,
  in order, each with ``n`` ``CompletionOutput`` (vllm/outputs.py) ordered by index: ``token_ids``
  a list of ints, ``logprobs`` a list with one ``{token_id: Logprob}`` per token
  (vllm/logprobs.py; ``logprobs=0``: the sampled token only, its ``rank`` the number of tokens at
  least as likely, ``decoded_token`` its token string), ``finish_reason`` "stop" (the tokenizer's
  eos, a ``stop_token_ids`` entry or the generation config's eos; ``stop_reason`` the stop token
  id, None for eos) or "length" (``max_tokens``, or ``max_model_len`` reached), checked in that
  order (vllm/v1/core/sched/utils.py ``check_stop``). A prompt of ``max_model_len`` tokens or more
  is a ValueError (vllm/v1/engine/input_processor.py ``_validate_prompt_len``). Sampling
  (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py): float32 logits, temperature below 1e-5
  greedy, else logits / temperature, top-p masking, and the exponential race argmax(p / q),
  q ~ Exp(1) from the request's own generator; the k-th of n samples is seeded with ``seed + k``
  (vllm/v1/engine/parallel_sampling.py). ``logprobs_mode="processed_logprobs"``: log_softmax of
  the logits after temperature and top-p (greedy: of the raw logits); "raw_logprobs": before.
  The random draws are the stand-in's own, not vLLM's CUDA streams.
* ``distributed_executor_backend="external_launcher"`` (vllm/v1/executor/uniproc_executor.py
  ``ExecutorWithExternalLauncher``, vllm/distributed/parallel_state.py
  ``initialize_model_parallel``): needs RANK and LOCAL_RANK and the caller's torch.distributed
  world; tensor-parallel groups are consecutive ranks, created by every rank at start-up
  together with a world-wide all-reduce (vLLM's memory budget), and a group's ranks must run the
  same batches: the stand-in compares them over its own gloo group (vLLM's all-reduces would hang
  or mix batches). ``tensor_parallel_size`` > 1 without it would start worker processes: refused.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import pickle
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from torch import nn

__version__ = "0.33.0"

SLEEP_TAGS = ("weights", "kv_cache")
# the GPU the stand-in pretends to run on: its memory ledger reserves gpu_memory_utilization of it
DEVICE_BYTES = 80e9
_SAMPLING_EPS = 1e-5
_LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
# LLM's keyword arguments the stand-in knows (vLLM passes the rest to EngineArgs, which refuses
# unknown names)
_ENGINE_ARGS = {
    "load_format",
    "max_model_len",
    "enable_sleep_mode",
    "worker_extension_cls",
    "logprobs_mode",
    "distributed_executor_backend",
}
# HF name part -> the vLLM parameter it is stacked into (Qwen2Model.hf_to_vllm_mapper), in HF's
# parameter order: q, k, v; gate, up
_STACKED = {
    ".q_proj.": ".qkv_proj.",
    ".k_proj.": ".qkv_proj.",
    ".v_proj.": ".qkv_proj.",
    ".gate_proj.": ".gate_up_proj.",
    ".up_proj.": ".gate_up_proj.",
}
_GROUP_TIMEOUT = timedelta(seconds=60)  # the stand-in's own collectives never hang a test for long


def install(monkeypatch: Any = None) -> None:
    """Makes ``import vllm`` return this module and the backend's GPU check pass; with a pytest
    ``monkeypatch`` both are undone after the test (a spawned rank passes none)."""
    from vapo_lab.rollout import vllm_backend

    module = sys.modules[__name__]
    if monkeypatch is None:
        sys.modules["vllm"] = module
        vllm_backend._cuda_visible = lambda: True
        vllm_backend.platform_of = lambda: CUDA
        vllm_backend._gpu_index = _own_gpu
    else:
        monkeypatch.setitem(sys.modules, "vllm", module)
        monkeypatch.setattr(vllm_backend, "_cuda_visible", lambda: True)
        monkeypatch.setattr(vllm_backend, "platform_of", lambda: CUDA)
        monkeypatch.setattr(vllm_backend, "_gpu_index", _own_gpu)


def _own_gpu(local_rank: int) -> int:
    """The GPU index of a rank on the stand-in's node, which shows every rank its own GPU."""
    return local_rank


class _CudaPlatform:
    """vllm.platforms.current_platform on a CUDA GPU (vllm/platforms/cuda.py, interface.py)."""

    device_type = "cuda"

    @staticmethod
    def is_sleep_mode_available() -> bool:
        return True


CUDA = _CudaPlatform()


# ---- vllm/logprobs.py, vllm/outputs.py, vllm/sampling_params.py --------------------------------


@dataclass
class Logprob:
    """vllm.logprobs.Logprob."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """vllm.outputs.CompletionOutput (the fields vapo-lab reads, and the ones beside them)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """vllm.outputs.RequestOutput."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool


@dataclass
class SamplingParams:
    """vllm.SamplingParams: the fields vapo-lab sets, with vLLM's defaults."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"temperature must be >= 0 and top_p in (0, 1], got "
                f"{self.temperature}, {self.top_p}"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None and self.logprobs != 0:
            raise NotImplementedError(
                "the stand-in returns the sampled token's log-prob only (logprobs=0)"
            )


@dataclass
class _Row:
    """One completion while it is decoded."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    reason: str | None = None
    stop_reason: int | None = None


@dataclass
class ModelConfig:
    """The ``LLM.model_config`` fields vapo-lab reads."""

    model: str
    dtype: torch.dtype
    max_model_len: int


# ---- the worker and its model --------------------------------------------------------------------


class VllmStyleModel:
    """The worker's model: vLLM's parameter names and ``load_weights`` over the HF model that
    samples."""

    def __init__(self, hf: nn.Module) -> None:
        self.hf = hf.requires_grad_(False)
        self.params: dict[
            str, nn.Parameter
        ] = {}  # vLLM name -> the storage the HF model computes with
        self.slices: dict[str, tuple[str, slice]] = {}  # HF name -> (vLLM name, its rows there)
        groups: dict[str, list[tuple[str, nn.Parameter]]] = {}
        for name, param in hf.named_parameters():  # a tied lm_head is not listed (its alias)
            groups.setdefault(_vllm_name(name), []).append((name, param))
        for vname, parts in groups.items():
            if len(parts) == 1:  # kept as it is: a tied embedding stays tied to the output layer
                self.params[vname] = parts[0][1]
                self.slices[parts[0][0]] = (vname, slice(None))
                continue
            fused = nn.Parameter(torch.cat([p.detach() for _, p in parts]), requires_grad=False)
            self.params[vname] = fused
            start = 0
            for name, param in parts:
                rows = slice(start, start + param.shape[0])
                _set_parameter(hf, name, nn.Parameter(fused.data[rows], requires_grad=False))
                self.slices[name] = (vname, rows)
                start = rows.stop

    def named_parameters(self) -> Iterable[tuple[str, nn.Parameter]]:
        """Yields (vLLM name, parameter)."""
        return iter(self.params.items())

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copies each (HF name, tensor) into its parameter; returns the vLLM names written."""
        loaded = set()
        for name, tensor in weights:
            if name not in self.slices:
                raise ValueError(
                    f"There is no module or parameter named '{name}' in Qwen2ForCausalLM"
                )
            vname, rows = self.slices[name]
            target = self.params[vname].data[rows]
            if target.shape != tensor.shape:
                raise AssertionError(
                    f"{name}: parameter {tuple(target.shape)}, loaded weight {tuple(tensor.shape)}"
                )
            target.copy_(tensor)
            loaded.add(vname)
        return loaded

    def hf_state(self) -> dict[str, torch.Tensor]:
        """Returns the weights by HF name (tests compare them with the policy's)."""
        return {name: self.params[v].data[rows] for name, (v, rows) in self.slices.items()}


def _vllm_name(hf_name: str) -> str:
    for part, fused in _STACKED.items():
        if part in hf_name:
            return hf_name.replace(part, fused)
    return hf_name


def _set_parameter(root: nn.Module, name: str, param: nn.Parameter) -> None:
    module_name, _, attr = name.rpartition(".")
    setattr(root.get_submodule(module_name), attr, param)


class Worker:
    """vLLM's GPU worker, as far as the extension and sleep mode see it."""

    def __init__(self, model: VllmStyleModel) -> None:
        self.model = model
        self.cpu_copy: dict[str, torch.Tensor] = {}

    def get_model(self) -> VllmStyleModel:
        return self.model

    def reload_weights(
        self,
        weights_iterator: Iterable[tuple[str, torch.Tensor]] | None = None,
        weights_path: str | None = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        """vLLM's in-place reload (vllm/model_executor/model_loader/reload/inplace.py), from an
        iterator of checkpoint-format weights: the model's own ``load_weights`` writes them; a
        parameter that gets nothing keeps its weights (vLLM only warns)."""
        if weights_iterator is None or not is_checkpoint_format:
            raise NotImplementedError("the stand-in reloads checkpoint-format weights it is given")
        self.model.load_weights(weights_iterator)

    @torch.no_grad()
    def sleep(self, level: int) -> None:
        """Level 1: the weights go to CPU RAM; level 2: they are discarded (NaN), buffers kept."""
        params = dict(self.model.named_parameters())
        if level == 1:
            self.cpu_copy = {name: p.detach().clone() for name, p in params.items()}
        for p in params.values():
            p.fill_(float("nan"))  # the GPU memory is unmapped: nothing of it survives

    @torch.no_grad()
    def wake_up(self, tags: list[str]) -> None:
        """Re-maps memory; level 1's weights come back from the CPU copy, level 2's stay garbage."""
        if "weights" in tags and self.cpu_copy:
            for name, p in self.model.named_parameters():
                p.copy_(self.cpu_copy[name])
            self.cpu_copy = {}


def _worker_class(qualname: str) -> type:
    """Returns Worker with the extension named ``qualname`` ("module.Class") added to its bases."""
    module, _, cls = qualname.rpartition(".")
    extension = getattr(importlib.import_module(module), cls)
    for attr in dir(extension):
        if not attr.startswith("__") and hasattr(Worker, attr):
            raise AssertionError(
                f"Worker class {Worker} already has an attribute {attr}, which conflicts "
                f"with the worker extension class {extension}."
            )
    return type("Worker", (Worker, extension), {})


# ---- LLM -----------------------------------------------------------------------------------------


class LLM:
    """vllm.LLM on the CPU; see the module docstring for what it does as vLLM 0.33.0 does."""

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.92,
        enforce_eager: bool = False,
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - _ENGINE_ARGS
        if unknown:
            raise TypeError(
                f"EngineArgs.__init__() got an unexpected keyword argument {sorted(unknown)[0]!r}"
            )
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}"
            )
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        if self.logprobs_mode not in _LOGPROBS_MODES:
            raise NotImplementedError(
                f"the stand-in computes {_LOGPROBS_MODES}, not {self.logprobs_mode!r}"
            )
        self.sleep_mode = bool(kwargs.get("enable_sleep_mode", False))
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        self.tp = int(tensor_parallel_size)
        self._tp_group = self._join_world(kwargs.get("distributed_executor_backend"))
        _set_random_seed(seed)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer or model, local_files_only=True, trust_remote_code=trust_remote_code
        )
        load_format = kwargs.get("load_format", "auto")
        if load_format == "dummy":  # vLLM's DummyModelLoader: random weights, nothing read
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(
                model, local_files_only=True, trust_remote_code=trust_remote_code
            )
            hf = AutoModelForCausalLM.from_config(config, dtype=_dtype(dtype, model)).eval()
            with torch.no_grad():
                for p in hf.parameters():
                    p.uniform_(-1e-3, 1e-3)  # initialize_dummy_weights' range
        elif load_format == "auto":
            hf = AutoModelForCausalLM.from_pretrained(
                model,
                dtype=_dtype(dtype, model),
                local_files_only=True,
                trust_remote_code=trust_remote_code,
            ).eval()
        else:
            raise NotImplementedError(f"load_format={load_format!r} is not in the stand-in")
        self.model_config = ModelConfig(
            model,
            next(hf.parameters()).dtype,
            _max_model_len(kwargs.get("max_model_len"), hf.config),
        )
        self.hf = hf
        # the KV cache's keyword: "cache" in transformers 5.2x, "past_key_values" before
        self._cache_kw = (
            "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
        )
        self.stop_ids = _generation_eos(hf)
        worker_cls = (
            _worker_class(kwargs["worker_extension_cls"])
            if kwargs.get("worker_extension_cls")
            else Worker
        )
        self.worker = worker_cls(VllmStyleModel(hf))
        self.sleeping: set[str] = set()
        self.share = float(gpu_memory_utilization)
        self.calls: list[tuple[str, Any]] = []  # what the engine was asked, for tests
        self.params_seen: list[SamplingParams] = []
        self._requests = 0

    def _join_world(self, backend: str | None) -> Any:
        """Returns this rank's tensor-parallel group under external_launcher (None otherwise),
        after the collectives every rank of the world makes at start-up."""
        if backend is None:
            if self.tp > 1:
                raise NotImplementedError(
                    "tensor_parallel_size > 1 without external_launcher starts worker "
                    "processes: not in the stand-in"
                )
            return None
        if backend != "external_launcher":
            raise NotImplementedError(
                f"distributed_executor_backend={backend!r} is not in the stand-in"
            )
        if not self.in_process:
            raise AssertionError(
                "To get deterministic execution, please set VLLM_ENABLE_V1_MULTIPROCESSING=0"
            )
        dist = torch.distributed
        rank, _ = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        if not dist.is_initialized():
            raise RuntimeError(
                "the stand-in joins the caller's torch.distributed world; none is initialised"
            )
        world = dist.get_world_size()
        if rank != dist.get_rank() or world % self.tp:
            raise ValueError(
                f"RANK={rank} / world {world} do not fit tensor_parallel_size={self.tp}"
            )
        everyone = dist.new_group(backend="gloo", timeout=_GROUP_TIMEOUT)
        # vLLM's memory budget
        dist.all_reduce(torch.zeros(1), op=dist.ReduceOp.MIN, group=everyone)
        group, _ = dist.new_subgroups_by_enumeration(
            [list(range(s, s + self.tp)) for s in range(0, world, self.tp)],
            timeout=_GROUP_TIMEOUT,
            backend="gloo",
        )
        return group if self.tp > 1 else None

    # -- weights ---------------------------------------------------------------------------------

    def collective_rpc(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Runs ``method`` (a worker method's name, or a function of the worker) on this rank's
        worker."""
        if not self.in_process and any(
            isinstance(t, torch.Tensor) or inspect.isgenerator(t) for t in _leaves(args)
        ):
            raise TypeError(
                "the engine core runs in another process "
                "(VLLM_ENABLE_V1_MULTIPROCESSING is not 0): "
                "tensors do not reach it as tensors"
            )
        self.calls.append(("collective_rpc", method))
        fn = (
            getattr(self.worker, method) if isinstance(method, str) else method.__get__(self.worker)
        )
        return [fn(*args, **(kwargs or {}))]

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.sleep_mode:
            raise RuntimeError("sleep mode is not enabled (enable_sleep_mode=True)")
        if level not in (1, 2):
            raise NotImplementedError(f"sleep level {level} is not in the stand-in")
        self.calls.append(("sleep", level))
        if "weights" in self.sleeping:
            return  # vLLM: "Executor is already sleeping."
        self.worker.sleep(level)
        self.sleeping = set(SLEEP_TAGS)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Wakes ``tags`` (None: all); returns whether the engine is fully awake (and
        scheduling)."""
        self.calls.append(("wake_up", None if tags is None else tuple(tags)))
        tags = list(self.sleeping) if tags is None else list(tags)
        if any(t not in self.sleeping for t in tags):
            return not self.sleeping  # vLLM: "Tag ... is not in sleeping tags", nothing done
        self.worker.wake_up(tags)
        self.sleeping -= set(tags)
        return not self.sleeping

    def device_bytes(self) -> dict[str, float]:
        """The memory ledger: what vLLM would hold of its GPU now. Its weights (this rank's 1/tp of
        them) and a KV cache of the rest of its share (gpu_memory_utilization x DEVICE_BYTES, as
        vLLM sizes it at start-up), each 0 while that tag sleeps (level 1 keeps the weights in host
        memory, level 2 drops them: neither on the GPU)."""
        weights = sum(p.numel() * p.element_size() for p in self.hf.parameters()) / self.tp
        kv = max(0.0, self.share * DEVICE_BYTES - weights)
        return {
            "weights": 0.0 if "weights" in self.sleeping else weights,
            "kv_cache": 0.0 if "kv_cache" in self.sleeping else kv,
        }

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        self.calls.append(("reset_prefix_cache", None))
        return True

    # -- sampling --------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """Returns one RequestOutput per prompt, in order; each prompt a
        ``{"prompt_token_ids": [...]}``."""
        prompts = prompts if isinstance(prompts, list) else [prompts]
        params = (
            sampling_params
            if isinstance(sampling_params, list)
            else [sampling_params or SamplingParams()] * len(prompts)
        )
        if len(params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        if self.sleeping:
            raise RuntimeError(
                f"the engine sleeps ({sorted(self.sleeping)} released): vLLM would queue the "
                "requests until every tag is awake and LLM.generate would not return"
            )
        ids = [list(p["prompt_token_ids"]) for p in prompts]
        self.calls.append(("generate", (ids, [sp.seed for sp in params])))
        self.params_seen.extend(params)
        self._check_lockstep(ids, params)
        outputs = []
        for prompt, sp in zip(ids, params):
            self._validate_prompt(prompt)
            outputs.append(
                RequestOutput(
                    str(self._requests), None, prompt, None, self._complete(prompt, sp), True
                )
            )
            self._requests += 1
        return outputs

    def _validate_prompt(self, prompt: list[int]) -> None:
        limit = self.model_config.max_model_len
        if not prompt:
            raise ValueError("The decoder prompt cannot be empty")
        if len(prompt) >= limit:
            raise ValueError(
                f"The decoder prompt (length {len(prompt)}) plus the number of requested output "
                f"tokens (at least 1) is longer than the maximum model length of {limit}."
            )

    def _check_lockstep(self, ids: list[list[int]], params: list[SamplingParams]) -> None:
        """Under tensor parallelism: raises unless every rank of the group runs this same batch."""
        if self._tp_group is None:
            return
        mine = hashlib.sha256(pickle.dumps((ids, [vars(sp) for sp in params]))).hexdigest()
        digests: list[Any] = [None] * self.tp
        torch.distributed.all_gather_object(digests, mine, group=self._tp_group)
        if len(set(digests)) != 1:
            raise RuntimeError(
                "the ranks of a tensor-parallel group ran different batches: vLLM's all-reduces "
                "would mix them or hang"
            )

    def _complete(self, prompt: list[int], sp: SamplingParams) -> list[CompletionOutput]:
        """Returns the n completions of ``prompt``, decoded together (one row each) with the HF
        model's KV cache."""
        from transformers import DynamicCache

        n, limit = sp.n, self.model_config.max_model_len
        gens = [
            torch.Generator().manual_seed(sp.seed + k) if sp.seed is not None else None
            for k in range(n)
        ]
        max_tokens = sp.max_tokens if sp.max_tokens is not None else limit - len(prompt)
        rows = [_Row() for _ in range(n)]
        step_ids, cache = torch.tensor([prompt] * n), DynamicCache()
        while any(row.reason is None for row in rows):
            logits = (
                self.hf(input_ids=step_ids, use_cache=True, **{self._cache_kw: cache})
                .logits[:, -1]
                .float()
            )
            for k, row in enumerate(rows):
                if row.reason is None:
                    self._extend(
                        row, *self._draw(logits[k], sp, gens[k]), sp, len(prompt), max_tokens
                    )
            step_ids = torch.tensor([[row.tokens[-1]] for row in rows])
        return [self._output(k, row, sp) for k, row in enumerate(rows)]

    def _extend(
        self,
        row: _Row,
        token: int,
        logprob: float,
        rank: int,
        sp: SamplingParams,
        prompt_len: int,
        max_tokens: int,
    ) -> None:
        """Appends one sampled token to ``row`` and ends it where vLLM's check_stop would."""
        row.tokens.append(token)
        row.logprobs.append(
            {
                token: Logprob(
                    logprob,
                    rank,
                    self.tokenizer.convert_ids_to_tokens(token) if sp.detokenize else None,
                )
            }
        )
        if token == self.tokenizer.eos_token_id:
            row.reason = "stop"
        elif token in set(sp.stop_token_ids or ()) | self.stop_ids:
            row.reason, row.stop_reason = "stop", token
        elif (
            prompt_len + len(row.tokens) >= self.model_config.max_model_len
            or len(row.tokens) >= max_tokens
        ):
            row.reason = "length"

    def _output(self, index: int, row: _Row, sp: SamplingParams) -> CompletionOutput:
        if sp.logprobs is None:
            cumulative, logprobs = None, None
        else:
            cumulative, logprobs = (
                sum(lp[t].logprob for lp, t in zip(row.logprobs, row.tokens)),
                row.logprobs,
            )
        return CompletionOutput(
            index,
            self.tokenizer.decode(row.tokens, skip_special_tokens=True) if sp.detokenize else "",
            row.tokens,
            cumulative,
            logprobs,
            row.reason,
            row.stop_reason,
        )

    def _draw(
        self, logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator | None
    ) -> tuple[int, float, int]:
        """Returns (token, its log-prob in ``logprobs_mode``, its rank) for one position's float32
        logits."""
        raw = logits.log_softmax(-1)
        if sp.temperature < _SAMPLING_EPS:
            token, processed = int(logits.argmax()), raw
        else:
            scaled = _top_p(logits / sp.temperature, sp.top_p)
            processed = scaled.log_softmax(-1)
            q = torch.empty_like(scaled).exponential_(generator=gen)
            token = int((scaled.softmax(-1) / q).argmax())
        chosen = processed if self.logprobs_mode == "processed_logprobs" else raw
        return token, float(chosen[token]), int((chosen >= chosen[token]).sum())


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM's apply_top_k_top_p_pytorch, top-p only: drops the least likely tokens whose mass stays
    within 1 - p."""
    if top_p >= 1:
        return logits
    sorted_logits, order = logits.sort(descending=False)
    drop = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p
    drop[-1] = False  # at least one
    return logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def _dtype(name: str, model: str) -> torch.dtype:
    """Returns the torch dtype of ``LLM(dtype=name)``; "auto": the config's, float32 served as
    float16."""
    if name != "auto":
        return _DTYPES[name]
    from transformers import AutoConfig

    own = (
        getattr(AutoConfig.from_pretrained(model, local_files_only=True), "dtype", None)
        or torch.float32
    )
    return torch.float16 if own == torch.float32 else own


def _max_model_len(asked: int | None, config: Any) -> int:
    derived = int(config.max_position_embeddings)
    if asked is None:
        return derived
    if asked > derived:
        raise ValueError(
            f"User-specified max_model_len ({asked}) is greater than the derived max_model_len "
            f"(max_position_embeddings={derived} or model_max_length=None in model's config.json)."
        )
    return int(asked)


def _generation_eos(hf: nn.Module) -> set[int]:
    """The generation config's eos id(s), which vLLM adds to every request's stop ids."""
    eos = getattr(getattr(hf, "generation_config", None), "eos_token_id", None)
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def _set_random_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _leaves(obj: Any) -> Iterable[Any]:
    if isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from _leaves(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _leaves(item)
    else:
        yield obj
