"""What a run needs before it runs: memory per GPU in each phase, KV cache, time per step.

Pure functions of a model's ``Shape`` (:mod:`vapo_lab.models.shapes`; its counts in
:mod:`vapo_lab.models.counts`) and the run's sizes (``Setup``), without torch or a config:
``vapo-lab plan`` prints ``estimate``'s numbers, and ``train`` refuses a run that does not fit its
devices (``Footprint.fits``, through ``vapo_lab.config.plan.fit_problems``). Bytes throughout;
GB = 10^9 bytes, as ZeRO counts. The sources of each formula: docs/distributed.md, Resource plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from vapo_lab.models.activations import (
    chunked_logprob_bytes,
    qwen2_forward_bytes,
    qwen2_pass_activation_bytes,
)
from vapo_lab.models.counts import (
    actor_params,
    backbone_params,
    critic_params,
    embedding_params,
    forward_flops_per_token,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    layer_params,
    non_embedding_params,
    sampler_copy_bytes,
    sharded,
    state_bytes_per_param,
    trained_flops_per_token,
)
from vapo_lab.models.peaks import PEAK_FLOPS
from vapo_lab.models.shapes import Shape

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# what torch's caching allocator reserves over what it allocates: 1.25-1.29x measured on the H200
# (docs/gpu-runs), rounded up; applied on CUDA to every phase's torch tensors, not to vLLM's share
ALLOCATOR_HEADROOM = 1.3
# what a GPU process holds outside torch's allocator and vLLM's share, counted once a rank: the
# CUDA context with torch's kernels is 0.29 GB loaded lazily (torch's default) and 0.67 GB with
# every module loaded (pytorch/pytorch#86509's measurement): the latter, rounded up, as a run
# loads many kernels, vLLM's among them
CUDA_CONTEXT_BYTES = 0.7e9
# an NCCL communicator's buffers, NCCL_BUFFSIZE (4 MiB by default) per channel and peer: 0.54 to
# 0.69 GB a process group measured on 4 A100s over NVLink (NVIDIA/nccl#964), more with the
# channels an H100's NVLink takes (NVIDIA/nccl#864): rounded up to 1 GB
NCCL_COMMUNICATOR_BYTES = 1e9
# bytes a checkpoint keeps a trained parameter: float32 weights and AdamW's m and v (no gradients)
CHECKPOINT_BYTES_PER_PARAM = 12


# -- a run ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """The sizes of a run that the footprint depends on (from the config; see ``estimate``)."""

    world: int  # N = trainer.nodes x trainer.nproc_per_node
    strategy: str  # single | fsdp
    dtype: str  # the compute dtype of activations, the KV cache and sampling weights (model.dtype)
    micro_tokens: int  # tokens per forward/backward on a rank (trainer.max_tokens_per_micro_batch)
    responses_per_step: int  # B
    prompt_tokens: int  # an estimate of the longest prompt
    max_new_tokens: int
    gradient_checkpointing: bool
    # responses per optimiser step, over all ranks (None: no limit)
    mini_batch_size: int | None = None
    critic: bool = True  # a value model is trained (GAE advantages)
    reference: bool = False  # a frozen reference policy (a KL term)
    engine: str = "builtin"  # builtin | vllm
    builtin_rows: int = 256  # the built-in sampler decodes at most this many rows at once
    tensor_parallel_size: int = 1  # vLLM: its weights and KV cache split over t GPUs
    engine_memory: float = 0.0  # vLLM: bytes it takes of each GPU (gpu_memory_utilization x memory)
    engine_sleeps: bool = True  # vLLM: frees its memory during the update (sleep mode)
    # trainer.offload_during_rollout: the training state in host memory while vLLM samples
    offload: bool = False
    # head_logprobs_and_entropy's tokens a chunk (None: the whole pass)
    logprob_chunk: int | None = None
    ppo_epochs: int = 1
    # the critic's start, on first use (trainer.caches): a reward model trained, value pretraining
    reward_model: bool = False
    value_pretraining: bool = False
    eval_responses: int = 0  # held-out problems x eval samples, over all ranks
    ranks_per_node: int = 1  # trainer.nproc_per_node: host memory is a node's
    # trainer.mesh: flat shards the training state over all N ranks, hsdp over a node's ranks only
    mesh: str = "flat"
    sleep_level: int = 2  # vLLM: 1 keeps its weights in host memory while asleep, 2 drops them
    total_steps: int = 1  # rollout steps (trainer.total_steps)
    save_every: int = 0  # trainer.save_every (0: never)
    headroom: float = 1.0  # ALLOCATOR_HEADROOM for CUDA devices
    cuda: bool = False  # CUDA ranks: each holds ``gpu_reserve`` beyond its tensors
    # bytes a value the built-in sampler decodes in (weights' copies, KV cache): bfloat16 on a
    # GPU, the float32 masters on CPU (rollout.sampler.sampling_dtype)
    sample_bytes: int = 4


def nccl_groups(world: int, tensor_parallel: int, shards: int | None = None) -> list[str]:
    """Returns the process groups a CUDA rank holds an NCCL communicator for: the trainer's
    ``world`` ranks when there are several, vLLM's tensor-parallel group when it spans several,
    and under HSDP (FSDP2 sharding over ``shards`` < ``world`` ranks) its mesh's shard and
    replicate groups, which it creates beside the world's."""
    groups = {"the trainer's ranks": world, "vLLM's tensor-parallel group": tensor_parallel}
    if shards is not None and shards < world:
        groups["HSDP's shard group"] = shards
        groups["HSDP's replicate group"] = world // shards
    return [name for name, size in groups.items() if size > 1]


def gpu_reserve(world: int, tensor_parallel: int, shards: int | None = None) -> float:
    """Returns the bytes a CUDA rank holds outside torch's tensors and vLLM's share: its CUDA
    context and its NCCL communicators' buffers (``nccl_groups``)."""
    groups = nccl_groups(world, tensor_parallel, shards)
    return CUDA_CONTEXT_BYTES + len(groups) * NCCL_COMMUNICATOR_BYTES


def shard_ranks(setup: Setup) -> int:
    """Returns the ranks one copy of the training state is sharded over: 1 in one process, the
    world under fsdp, a node's ranks under fsdp with trainer.mesh=hsdp (each node a replica)."""
    if setup.strategy != "fsdp":
        return 1
    return min(setup.ranks_per_node, setup.world) if setup.mesh == "hsdp" else setup.world


@dataclass(frozen=True)
class Hardware:
    """The rates a step's time is estimated from: one GPU's peak and the share of it reached.

    Defaults: an H100 SXM (NVIDIA's datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16). The shares
    are assumptions, not measurements: decoding reaching 60% of the bandwidth, the update 40% of the
    peak FLOPs (a typical MFU of FSDP training with activation recomputation).
    """

    bandwidth: float = 3.35e12  # bytes/s
    flops: float = PEAK_FLOPS["H100"]["bfloat16"]  # FLOP/s
    bandwidth_share: float = 0.6
    flops_share: float = 0.4
    # a node's write rate to the shared file system a checkpoint goes to: an assumption
    write_bandwidth: float = 1e9  # bytes/s


@dataclass(frozen=True)
class Phase:
    """One phase of a run on one rank: the bytes of torch's tensors (the allocator's headroom
    applies to them) and of vLLM's share while it is awake (its own pool)."""

    name: str
    tensors: float
    engine: float
    how: str

    def need(self, headroom: float = 1.0) -> float:
        """Returns the device bytes the phase needs: tensors x headroom + the engine's share."""
        return self.tensors * headroom + self.engine


@dataclass(frozen=True)
class Footprint:
    """What one rank of a run holds, in bytes, and how long its step takes, in seconds."""

    actor_params: int
    critic_params: int  # 0 without a critic
    reference_params: int  # 0 without a reference policy
    sequence: int  # s: tokens per sequence, prompt + response (capped by the context)
    # tokens through one forward/backward pass on a rank (the token budget's worst case)
    pass_tokens: int
    weights: float  # the actor's and critic's (sharded) weights
    gradients: float
    optimizer: float
    reference: float  # the reference policy's (sharded) weights
    gathered: float  # fsdp: the unsharded units in flight (root + 2 layers), transient
    # builtin under fsdp: an unsharded copy of the actor for sampling, always resident
    replica: float
    actor_activations: float  # with checkpointing as configured, the log-prob pass included
    critic_activations: float
    actor_activations_full: float  # without checkpointing, the log-prob pass included
    actor_activations_ckpt: float  # with full checkpointing, the log-prob pass included
    critic_activations_full: float
    critic_activations_ckpt: float
    logprob: float  # the chunked log-prob pass's peak over a pass's response tokens
    kv_per_sequence: float  # one max-length sequence, on one GPU (/ t under vLLM)
    responses_per_rank: int
    requests_per_engine: int  # responses one sampler runs: a rank's, x t under vLLM
    sequences_at_once: int  # sequences one sampler decodes at once (vLLM queues the rest)
    vllm: bool
    offload: bool
    engine_weights: float  # vLLM: its weights on one GPU (the actor in the compute dtype / t)
    engine_memory: float  # vLLM: what it takes of each GPU during rollouts
    engine_sleeps: bool
    generated_tokens: int  # per step, every response at max_new_tokens
    step_tokens: int  # per step, prompt + response of every response
    decode_step_seconds: float  # one decoding step of one sampler at its full concurrency
    rollout_seconds: float  # a step's rollout, every response at max_new_tokens (an upper bound)
    update_seconds: float  # a step's passes: log-probs, values, reference, updates
    phases: tuple[Phase, ...] = ()  # every phase a rank goes through (``estimate``)
    # builtin: the fast decoder's weight copies while it samples (``sampler_copy_bytes``)
    sampler_copy: float = 0.0
    headroom: float = 1.0  # ALLOCATOR_HEADROOM on CUDA, 1 elsewhere
    reserve: float = 0.0  # the CUDA context and NCCL buffers on CUDA (``gpu_reserve``), 0 elsewhere
    updates_per_step: int = 1  # optimiser steps a rollout step (each model's)
    total_steps: int = 1
    host_per_node: float = 0.0  # host memory a node holds for the run beyond its processes
    checkpoint_bytes: float = 0.0  # one save, all ranks together
    save_every: int = 0
    # the held-out evaluation: responses one sampler runs (a rank's ceil(P·k / N), x t under
    # vLLM), how many it decodes at once, and its time, every response at max_new_tokens
    eval_requests_per_engine: int = 0
    eval_at_once: int = 0
    eval_seconds: float = 0.0

    @property
    def total_updates(self) -> int:
        """Returns the gradient updates of the run (the paper's unit): steps x updates a step."""
        return self.total_steps * self.updates_per_step

    @property
    def micro_batch(self) -> int:
        """Returns the longest sequences a pass holds: pass_tokens // s, at least 1."""
        return max(1, self.pass_tokens // self.sequence)

    @property
    def state(self) -> float:
        """Returns the training state a rank keeps through the step: weights, gradients (freed only
        at the next zero_grad), optimizer, reference, a resident sampling replica."""
        return self.weights + self.gradients + self.optimizer + self.reference + self.replica

    @property
    def kv_cache(self) -> float:
        """Returns the KV cache of all of a rank's responses at once."""
        return self.responses_per_rank * self.kv_per_sequence

    @property
    def train_peak(self) -> float:
        """Returns the update phase: state + gathered units + the larger of the actor's and the
        critic's activations (updated one after the other) + vLLM's share if it stays awake."""
        awake = self.engine_memory if self.vllm and not self.engine_sleeps else 0.0
        return (
            self.state
            + self.gathered
            + max(self.actor_activations, self.critic_activations)
            + awake
        )

    @property
    def rollout_peak(self) -> float:
        """Returns the rollout phase: the state (none with offload) + vLLM's share, or the built-in
        sampler's KV cache."""
        if self.vllm:
            return (0.0 if self.offload else self.state) + self.engine_memory
        return self.state + self.sampler_copy + self.sequences_at_once * self.kv_per_sequence

    @property
    def need(self) -> float:
        """Returns the memory a rank needs: its largest phase, torch's tensors x ``headroom`` +
        vLLM's share where it is awake (the update and rollout phases alone without ``phases``),
        + ``reserve``."""
        if not self.phases:
            return max(self.train_peak, self.rollout_peak) + self.reserve
        return max(phase.need(self.headroom) for phase in self.phases) + self.reserve

    @property
    def largest_phase(self) -> Phase | None:
        """Returns the phase that sets ``need``."""
        return max(self.phases, key=lambda ph: ph.need(self.headroom), default=None)

    @property
    def step_seconds(self) -> float:
        """Returns the estimated time of a step: rollout + update."""
        return self.rollout_seconds + self.update_seconds

    @property
    def engine_minimum(self) -> float:
        """Returns what vLLM needs of a GPU to start: its weights + one max-length sequence's KV
        cache (it refuses a max_model_len its cache cannot hold); 0 for the built-in sampler."""
        return self.engine_weights + self.kv_per_sequence if self.vllm else 0.0

    def fits(self, memory: float) -> bool:
        """Returns True when a rank fits in ``memory`` bytes: ``need`` <= memory and vLLM's share
        holds its weights and one sequence."""
        return self.need <= memory and self.engine_memory >= self.engine_minimum


def estimate(shape: Shape, setup: Setup, hardware: Hardware | None = None) -> Footprint:
    """Returns the per-rank footprint of ``setup`` on a model of ``shape``, and its step's time on
    ``hardware`` (an H100 by default).

    * s = prompt_tokens + max_new_tokens, capped at the model's context; t = its response tokens.
    * Training state: ``state_bytes_per_param`` x (actor + critic parameters), / N under fsdp;
      the reference policy: 4 bytes (float32) x its parameters, / N under fsdp. Under
      trainer.mesh=hsdp N is here a node's ranks (``shard_ranks``): each node holds a replica.
    * fsdp gathers each FSDP unit (a decoder layer; the root: embeddings, final norm and heads)
      in the compute dtype while it computes; the root stays gathered through forward and backward
      (FSDP2 does not reshard the root after forward) and one layer is prefetched: root + 2 layers.
    * A pass holds at most ``micro_tokens`` tokens (``trainer.max_tokens_per_micro_batch``, counted
      in the padded layout a pass runs), and at least one longest sequence: pass_tokens =
      max(s, min(micro_tokens, rows x s)), rows = min(mini_batch_size, ceil(B / N)) (a mini-batch
      is a random draw from the whole batch, so a rank's share of one can reach all its
      responses). Activations: ``qwen2_pass_activation_bytes`` for pass_tokens // s rows of s
      tokens (no stored attention scores, as flash attention), the actor's with the chunked
      log-prob pass over its response tokens. FSDP2 computes in bf16 copies ("cast"); one process
      under autocast, whose float32 residual stream and cast-weight cache it counts.
    * Sampling, builtin: under single the sampler runs the policy itself; under fsdp each rank
      keeps an unsharded float32 replica of the actor. While it samples, the fast decoder holds
      copies of weights (``sampler_copy_bytes``: bfloat16 copies of all on a GPU, the fused
      float32 ones on CPU) and a static KV cache in ``sample_bytes`` of up to ``builtin_rows`` of
      the rank's ceil(B / N) responses at once.
    * Evaluation: the P x k (problem, sample) pairs of ``eval_responses`` spread over the N ranks
      (``vapo_lab.trainer.evaluation.eval_runs``), ceil(P·k / N) responses a rank, sampled as a
      rollout's are: its KV cache (builtin) or vLLM's share beside the training state.
    * Sampling, vLLM: one engine per t ranks takes ``engine_memory`` of each GPU during rollouts
      (and the update too unless it sleeps); in it, the actor's weights / t, and a paged KV cache
      (/ t) that decodes as many of its requests (the t ranks' responses) at once as fit and
      queues the rest. With ``offload`` the training state is in host memory meanwhile.
    * Time: a decoding step of one sampler reads its weights and its running sequences' KV cache
      (at an average context of prompt + t/2) at ``bandwidth x bandwidth_share``; the rollout is
      ceil(requests / at once) waves of t steps, every response at max_new_tokens: an upper bound.
      An evaluation likewise, over ceil(P·k / N) responses a rank.
      The update: 6·P FLOPs per trained parameter and token (8·P with recomputation), 2·P per
      forward-only pass (old log-probs, values, reference), + 2·L·s·h per token and pass for causal
      attention (x3 with its backward), times ppo_epochs for the trained passes, over a rank's
      ceil(B / N)·s tokens, at ``flops x flops_share``. Prefill, the weight push and sampling
      overheads are not counted.
    * On CUDA (``cuda``) each rank holds ``gpu_reserve`` beyond every phase: its CUDA context and
      its NCCL communicators' buffers.
    """
    hw = hardware or Hardware()
    world = setup.world if setup.strategy == "fsdp" else 1
    shards = shard_ranks(setup)
    p = DTYPE_BYTES[setup.dtype]
    s = setup.prompt_tokens + setup.max_new_tokens
    if shape.max_position_embeddings:
        s = min(s, shape.max_position_embeddings)
    t = min(setup.max_new_tokens, s)
    actor = actor_params(shape)
    critic = critic_params(shape) if setup.critic else 0
    ref = actor if setup.reference else 0
    w, g, o = state_bytes_per_param(setup.strategy, setup.dtype)
    trained = actor + critic
    responses = math.ceil(setup.responses_per_step / world)
    rows = min(responses, setup.mini_batch_size or responses)
    pass_tokens = max(s, min(setup.micro_tokens, rows * s))
    rows_a_pass = max(1, pass_tokens // s)  # the longest sequences a pass holds
    chunk = setup.logprob_chunk or rows_a_pass * t
    # FSDP2 computes with bf16 copies of its shards ("cast"); one process under torch.autocast
    precision = "cast" if setup.strategy == "fsdp" else "autocast"

    def acts(head: str, ckpt: bool) -> float:
        return qwen2_pass_activation_bytes(
            shape, rows_a_pass, s - t, t, ckpt, head, p, False, "packed", chunk, precision
        )

    logprob = chunked_logprob_bytes(
        rows_a_pass * t, shape.vocab_size, shape.hidden_size, chunk, min(p, 4)
    )
    gathered = 0.0
    if setup.strategy == "fsdp":
        # embeddings, final norm, lm_head (> the critic's)
        root = actor - shape.num_layers * layer_params(shape)
        gathered = (root + 2 * layer_params(shape)) * p
    vllm = setup.engine == "vllm"
    tp = setup.tensor_parallel_size if vllm else 1
    # the built-in sampler decodes in setup.sample_bytes: bfloat16 copies of the float32 masters on
    # a GPU, the masters themselves on CPU
    sampled = p if vllm else setup.sample_bytes
    kv_seq = kv_bytes_per_sequence(shape, s, sampled) / tp
    engine_weights = actor * p / tp if vllm else 0.0
    # sequences one sampler decodes at once: as many as vLLM's share holds; builtin_rows
    room = int((setup.engine_memory - engine_weights) // kv_seq) if vllm else setup.builtin_rows
    context = setup.prompt_tokens + t / 2

    def sampling(rank_responses: int) -> tuple[int, int, float, float]:
        # (requests one sampler runs, at once, a decoding step's s, all of them's s): a step reads
        # the sampler's weights (a GPU's share) and its sequences' KV cache once
        requests = rank_responses * tp
        at_once = min(requests, max(0, room))
        step_bytes = (engine_weights if vllm else actor * sampled) + at_once * kv_bytes_per_token(
            shape, sampled
        ) / tp * context
        step = step_bytes / (hw.bandwidth * hw.bandwidth_share)
        waves = math.ceil(requests / at_once) if at_once else (0 if not requests else math.inf)
        return requests, at_once, step, waves * t * step

    requests, at_once, decode_step, rollout = sampling(responses)
    # the held-out evaluation: the (problem, sample) pairs spread over the ranks
    eval_requests, eval_at_once, _, eval_time = sampling(math.ceil(setup.eval_responses / world))
    ckpt_on = setup.gradient_checkpointing

    def trained_pass(params: int) -> float:
        return trained_flops_per_token(shape, params, s, ckpt_on)

    def forward_pass(params: int) -> float:
        return forward_flops_per_token(shape, params, s)

    flops = setup.ppo_epochs * (trained_pass(actor) + (trained_pass(critic) if critic else 0.0))
    # before the update: the old log-probs (recomputed where vLLM sampled), the reference's, values
    flops += forward_pass(actor) * ((1 if vllm else 0) + (1 if setup.reference else 0))
    flops += forward_pass(critic) if critic else 0.0
    update = responses * s * flops / (hw.flops * hw.flops_share)
    ckpt = setup.gradient_checkpointing
    fp = Footprint(
        actor_params=actor,
        critic_params=critic,
        reference_params=ref,
        sequence=s,
        pass_tokens=pass_tokens,
        weights=sharded(w * trained, shards),
        gradients=sharded(g * trained, shards),
        optimizer=sharded(o * trained, shards),
        reference=sharded(w * ref, shards),
        gathered=gathered,
        replica=actor * 4 if not vllm and setup.strategy == "fsdp" else 0.0,  # float32
        sampler_copy=0.0 if vllm else sampler_copy_bytes(shape, actor, setup.sample_bytes),
        actor_activations=acts("lm", ckpt),
        critic_activations=acts("value", ckpt) if critic else 0.0,
        actor_activations_full=acts("lm", False),
        actor_activations_ckpt=acts("lm", True),
        critic_activations_full=acts("value", False) if critic else 0.0,
        critic_activations_ckpt=acts("value", True) if critic else 0.0,
        logprob=logprob,
        kv_per_sequence=kv_seq,
        responses_per_rank=responses,
        requests_per_engine=requests,
        sequences_at_once=at_once,
        vllm=vllm,
        offload=setup.offload and vllm,
        engine_weights=engine_weights,
        engine_memory=setup.engine_memory if vllm else 0.0,
        engine_sleeps=setup.engine_sleeps,
        generated_tokens=setup.responses_per_step * t,
        step_tokens=setup.responses_per_step * s,
        decode_step_seconds=decode_step,
        rollout_seconds=rollout,
        update_seconds=update,
        eval_requests_per_engine=eval_requests,
        eval_at_once=eval_at_once,
        eval_seconds=eval_time,
        updates_per_step=setup.ppo_epochs
        * (
            math.ceil(setup.responses_per_step / setup.mini_batch_size)
            if setup.mini_batch_size
            else 1
        ),
        total_steps=setup.total_steps,
        save_every=setup.save_every,
        checkpoint_bytes=CHECKPOINT_BYTES_PER_PARAM * trained,
        headroom=setup.headroom,
        reserve=gpu_reserve(world, tp, shards) if setup.cuda else 0.0,
    )
    return replace(
        fp,
        phases=_phases(shape, setup, fp, acts_args=(rows_a_pass, s - t, t, chunk)),
        host_per_node=_host_per_node(shape, setup, fp),
    )


def _host_per_node(shape: Shape, setup: Setup, fp: Footprint) -> float:
    """Returns the host bytes a node holds for the run beyond its processes' own: each rank's
    state pinned while vLLM samples (offload), vLLM's weights asleep at level 1, and rank 0's
    critic-cache write (a parameter at a time under fsdp: the largest, the (V, h) embedding, in
    float32; the whole float32 critic in one process)."""
    ranks = setup.ranks_per_node if setup.strategy == "fsdp" else 1
    host = ranks * fp.state if fp.offload else 0.0
    if fp.vllm and setup.sleep_level == 1:
        host += ranks * fp.engine_weights
    if fp.critic_params and (setup.reward_model or setup.value_pretraining):
        host += 4 * (embedding_params(shape) if setup.strategy == "fsdp" else fp.critic_params)
    return host


def _phases(
    shape: Shape, setup: Setup, fp: Footprint, acts_args: tuple[int, int, int, int]
) -> tuple[Phase, ...]:
    """Returns every phase of a step and of the critic's start on one rank (``estimate``)."""
    world = setup.world if setup.strategy == "fsdp" else 1
    shards = shard_ranks(setup)
    p = DTYPE_BYTES[setup.dtype]
    precision = "cast" if setup.strategy == "fsdp" else "autocast"
    rows, prompt, t, chunk = acts_args

    def forward(head: str) -> float:
        return qwen2_forward_bytes(shape, rows, prompt, t, head, p, "packed", chunk, precision)

    engine = fp.engine_memory
    # vLLM's share in the passes and updates: none once it sleeps after sampling
    awake_in_update = engine if fp.vllm and not fp.engine_sleeps else 0.0
    sampler_kv = 0.0 if fp.vllm else fp.sequences_at_once * fp.kv_per_sequence
    rollout = Phase(
        "rollout",
        (0.0 if fp.offload else fp.state) + sampler_kv + fp.sampler_copy,
        engine,
        ("vLLM's share" + (" (state in host memory until it sleeps)" if fp.offload else " + state"))
        if fp.vllm
        else "state + the sampler's weight copies and KV cache",
    )
    # old log-probs where vLLM sampled (or a replica: no), the reference's, the critic's values
    actor_forward = forward("lm") if fp.vllm or fp.reference_params else 0.0
    critic_forward = forward("value") if fp.critic_params else 0.0
    outputs = Phase(
        "model outputs",
        fp.state + fp.gathered + max(actor_forward, critic_forward),
        awake_in_update,
        "state + gathered + a no-grad pass" + (" + vLLM awake" if awake_in_update else ""),
    )
    update = Phase(
        "update",
        fp.state + fp.gathered + max(fp.actor_activations, fp.critic_activations),
        awake_in_update,
        "state + gathered + max(actor, critic) activations"
        + (" + vLLM awake" if awake_in_update else ""),
    )
    phases = [rollout, outputs, update]
    if fp.critic_params and (setup.reward_model or setup.value_pretraining):
        # before the actor's optimiser exists: its float32 weights (sharded where vLLM samples,
        # whole where the built-in sampler does: trainer.start shards after), the reference's,
        # and a critic-shaped model trained (16 B/param / N); sampling then is as a step's, less
        layer = layer_params(shape)
        policy = 4 * (fp.actor_params + fp.reference_params) / (shards if fp.vllm else 1)
        critic_state = 16 * fp.critic_params / shards
        gathered = (fp.critic_params - shape.num_layers * layer + 2 * layer) * p if world > 1 else 0
        held = policy + critic_state + gathered
        how = "policy weights + a critic's state + gathered + its activations"
        if setup.reward_model:
            phases.append(
                Phase("reward-model build", held + fp.critic_activations, awake_in_update, how)
            )
        if setup.value_pretraining:
            phases.append(
                Phase(
                    "value pretraining",
                    held + max(fp.critic_activations, critic_forward),
                    awake_in_update,
                    how,
                )
            )
    # a rank's ceil(P·k / N) responses (the pairs spread over the ranks), builtin_rows at once
    eval_kv = 0.0 if fp.vllm else fp.eval_at_once * fp.kv_per_sequence
    phases.append(
        Phase(
            "evaluation",
            fp.state + eval_kv + fp.sampler_copy,
            engine,
            "state + vLLM's share (awake after the push)"
            if fp.vllm
            else "state + the sampler's weight copies and KV cache",
        )
    )
    return tuple(phases)


def share_bound(share: float, upper: bool) -> float:
    """Returns a bound on vLLM's share of a GPU (rollout.vllm.gpu_memory_utilization) to the two
    decimals a plan prints: an upper bound rounded down and a lower one up, so that the printed
    value passes the plan's own check (an upper bound of 0.8685 is 0.86: 0.87 would not fit)."""
    exact = Decimal(repr(share))  # the shortest decimal that is this float: 0.29 stays 0.29
    return float(exact.quantize(Decimal("0.01"), ROUND_FLOOR if upper else ROUND_CEILING))


def smallest_world(
    shape: Shape,
    setup: Setup,
    memory: float,
    divides: int | None = None,
    engine_at_minimum: bool = False,
    limit: int = 1 << 20,
) -> int | None:
    """Returns the fewest fsdp ranks N at which ``estimate(...)`` fits in ``memory`` bytes a GPU.

    N ranks in the flat layout (trainer.mesh=flat): under hsdp a rank's state does not shrink
    with more nodes, and the mesh's two groups add NCCL buffers past one node. ``need`` never grows
    with N from 2 on (state / N, ceil(B / N) responses and micro-batches no larger; a GPU's NCCL
    reserve is there from 2), so after N = 1 a binary search finds the memory minimum; with
    ``divides`` (the prompts per step, which must divide among the ranks) the answer is the
    smallest divisor of it at or above that minimum.
    ``engine_at_minimum``: vLLM's share is set to the least it needs (``Footprint.engine_minimum``,
    to the hundredth of a GPU above: ``share_bound``), which leaves the most room for training.
    Returns None when no N up to ``limit`` (or ``divides``) fits: the parts that do not shrink with
    N (activations of a micro-batch, gathered units, a sampling replica, the engine's share) exceed
    ``memory`` alone.
    """
    top = divides if divides else limit

    def fits(n: int) -> bool:
        at_n = _with_world(setup, n)
        fp = estimate(shape, at_n)
        if engine_at_minimum and fp.vllm:
            least = share_bound(fp.engine_minimum / memory, upper=False) * memory
            fp = estimate(shape, replace(at_n, engine_memory=least))
        return fp.fits(memory)

    if top >= 1 and fits(1):
        return 1  # one rank needs no NCCL communicator: it may fit where two do not
    if top < 2 or not fits(top):
        return None
    lo, hi = 2, top
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    if divides:
        return next(n for n in range(lo, divides + 1) if divides % n == 0)
    return lo


def _with_world(setup: Setup, world: int) -> Setup:
    return replace(setup, world=world, strategy="fsdp", mesh="flat")


__all__ = [
    "ALLOCATOR_HEADROOM",
    "CHECKPOINT_BYTES_PER_PARAM",
    "CUDA_CONTEXT_BYTES",
    "DTYPE_BYTES",
    "GB",
    "Footprint",
    "Phase",
    "Hardware",
    "NCCL_COMMUNICATOR_BYTES",
    "Setup",
    "actor_params",
    "backbone_params",
    "critic_params",
    "embedding_params",
    "estimate",
    "gpu_reserve",
    "nccl_groups",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "layer_params",
    "non_embedding_params",
    "share_bound",
    "shard_ranks",
    "sharded",
    "smallest_world",
    "state_bytes_per_param",
]
