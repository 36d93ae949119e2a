"""What a run needs before it runs: parameter counts, memory per GPU, KV cache, tokens per step.

Pure functions of a model's ``Shape`` (:mod:`vapo_lab.models.shapes`) and the run's sizes
(``Setup``); nothing here reads a config, touches a device or imports torch. ``vapo-lab plan``
prints ``estimate``'s numbers and ``train`` refuses a run that does not fit its devices
(``Footprint.fits``, called by ``vapo_lab.config.preflight.check_fits``). Bytes throughout; GB = 10^9 bytes (as the
ZeRO paper counts).

Sources:

* parameters: transformers' ``modeling_qwen2`` (q/k/v projections with biases, o_proj and the
  SwiGLU MLP without, two RMSNorms a layer, a final norm, lm_head unless tied) and
  ``vapo_lab.models.value.ValueModel`` (the critic: the backbone without lm_head + Linear(h, 1)).
* training state: ZeRO (Rajbhandari et al. 2020, §3.1): mixed-precision Adam holds 16 bytes per
  parameter (2 + 2 + 12), sharded over N data-parallel ranks by ZeRO-3 / FSDP. vapo-lab
  keeps float32 master weights on every strategy (``vapo_lab.models.precision``): 4 (weights) + 4
  (gradients) + 8 (Adam m, v), the same 16, sharded under ``trainer.strategy=fsdp``.
* activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", Eq. 1: s·b·h·(34 + 5·a·s/h) bytes per layer for 16-bit activations (s tokens, b
  sequences, h hidden, a heads); "full activation recomputation" keeps only each layer's input,
  2·s·b·h a layer (2·s·b·h·L in all, as the paper puts it), plus one layer's activations while it
  is recomputed.
* KV cache: 2 (K and V) x L x kv heads x d x bytes per token, as vLLM and the built-in sampler
  allocate it (``vapo_lab.rollout.decoder.FastDecoder``).
* log-probs: ``chunked_logprob_bytes``, the peak of ``vapo_lab.algo.lm.head_logprobs_and_entropy``
  (chunks of tokens; measured on CPU to 0.05%, docs/benchmarks.md).
* time: a roofline. Decoding is bound by memory bandwidth (each step reads the engine's weights and
  its sequences' KV cache once); the update by arithmetic (6 FLOPs per parameter and token forward
  and backward, 2 per forward-only pass or recomputation, plus causal attention's 2·L·s·h per token
  and pass). ``Hardware`` holds the rates and the shares of them reached, stated assumptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vapo_lab.models.shapes import Shape

GB = 1e9
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# -- parameters ----------------------------------------------------------------------------------
def layer_params(s: Shape) -> int:
    """Returns the parameters of one decoder layer (Qwen2):

    attention: q = h·(a·d) + a·d, k = v = h·(kv·d) + kv·d (biases when ``qkv_bias``), o = (a·d)·h;
    MLP: gate = up = h·i, down = i·h; norms: 2·h.
    """
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    bias = (q + 2 * kv) if s.qkv_bias else 0
    attention = s.hidden_size * (q + 2 * kv) + bias + q * s.hidden_size
    mlp = 3 * s.hidden_size * s.intermediate_size
    return attention + mlp + 2 * s.hidden_size


def embedding_params(s: Shape) -> int:
    """Returns V·h: the input embedding (and as much again for an untied lm_head)."""
    return s.vocab_size * s.hidden_size


def backbone_params(s: Shape) -> int:
    """Returns the transformer without an output head: V·h + L·layer + h (the final norm)."""
    return embedding_params(s) + s.num_layers * layer_params(s) + s.hidden_size


def actor_params(s: Shape) -> int:
    """Returns the causal LM's parameters: the backbone + lm_head (V·h) unless tied."""
    return backbone_params(s) + (0 if s.tie_word_embeddings else embedding_params(s))


def critic_params(s: Shape) -> int:
    """Returns the value model's parameters: the backbone + the scalar head Linear(h, 1), h + 1."""
    return backbone_params(s) + s.hidden_size + 1


def non_embedding_params(s: Shape) -> int:
    """Returns the actor's parameters less its embeddings (input and output): L·layer + h, the
    count model cards quote as "non-embedding"."""
    return s.num_layers * layer_params(s) + s.hidden_size


# -- training state ------------------------------------------------------------------------------
def state_bytes_per_param(strategy: str, dtype: str) -> tuple[int, int, int]:
    """Returns (weights, gradients, optimizer) bytes per parameter, before sharding: (4, 4, 8) on
    every strategy and compute dtype. Parameters, gradients and Adam's m and v stay in float32, the
    master weights (``vapo_lab.models.precision``; FSDP2 keeps fp32 shards): 16 in all, ZeRO's
    figure for mixed-precision Adam (§3.1: 2Ψ + 2Ψ + 12Ψ)."""
    return 4, 4, 8


def sharded(total: float, world: int) -> float:
    """Returns a rank's share of ``total`` bytes sharded over ``world`` ranks: total / N (ZeRO-3)."""
    return total / world


# -- activations ---------------------------------------------------------------------------------
def layer_activation_bytes(s: int, b: int, h: int, a: int, scores_stored: bool = False,
                           bytes_per_value: int = 2) -> float:
    """Returns the activations one transformer layer keeps for its backward pass (Korthikanti Eq. 1).

    s·b·h·(34 + 5·a·s/h) bytes for 16-bit activations: 34·s·b·h for the layer's linear inputs,
    norms, GeLU/dropout tensors, and 5·a·s²·b for the attention scores, softmax and its dropout
    mask. With flash / SDPA attention (what HF models use here) the scores are recomputed in the
    backward pass and never stored: ``scores_stored=False`` drops the 5·a·s/h term. The formula is
    written for GPT's 4h MLP; it is the published reference kept here as is (Qwen2's SwiGLU with
    i ≈ 5.4h stores more, so without checkpointing it is a lower bound). 32-bit activations
    (``bytes_per_value=4``) double every term.

    Args:
        s: tokens per sequence; b: sequences (the micro-batch); h: hidden size; a: attention heads.
    """
    per_token = 34 + (5 * a * s / h if scores_stored else 0)
    return s * b * h * per_token * bytes_per_value / 2


def activation_bytes(shape: Shape, s: int, b: int, checkpointing: bool, scores_stored: bool = False,
                     bytes_per_value: int = 2) -> float:
    """Returns the activations of the whole layer stack for one micro-batch of b sequences of s tokens.

    Without checkpointing: L · ``layer_activation_bytes``. With full checkpointing (Korthikanti et
    al.'s "full activation recomputation", 2·s·b·h·L): each layer keeps only its input, 2·s·b·h bytes (16-bit), and
    the layer being recomputed holds its full activations: L·2·s·b·h + one layer.
    """
    one = layer_activation_bytes(s, b, shape.hidden_size, shape.num_heads, scores_stored, bytes_per_value)
    if not checkpointing:
        return shape.num_layers * one
    return shape.num_layers * 2 * s * b * shape.hidden_size * bytes_per_value / 2 + one


def logits_bytes(t: int, b: int, vocab: int) -> float:
    """Returns 4·t·b·V: fp32 logits over the t response tokens of b sequences, what an unchunked
    log-prob pass would hold (several times over: docs/benchmarks.md); the trainer's chunked pass
    never does (``chunked_logprob_bytes``)."""
    return 4 * t * b * vocab


def chunked_logprob_bytes(t: int, vocab: int, hidden: int, chunk: int, compute_bytes: int = 2,
                          entropy_grad: bool = False) -> float:
    """Returns the peak bytes that the chunked log-prob pass adds, forward + backward over t tokens.

    ``vapo_lab.algo.lm.head_logprobs_and_entropy`` with the entropy (as the trainer asks for it)
    never holds the (t, V) logits, only chunks of c = min(chunk, t) tokens. Its tensors, with p the
    compute dtype's bytes (2 for bf16 under autocast, 4 for float32) and fp32 master weights:

    * W in the compute dtype, cast once in forward and once in backward: V·h·p (none when p = 4);
    * forward, a chunk: its float32 logits z − max and exp(z − max): 8·c·V (the bf16 logits, p·c·V,
      are freed before the exponential);
    * backward: the float32 gradient of W, 4·V·h, summed over the chunks (autograd then adds it to
      W.grad: all of it is extra once an earlier micro-batch's gradient is there); a chunk's float32
      ∂L/∂z, computed in place in its recomputed logits, and the same in the compute dtype:
      (4 + p)·c·V (8·c·V with ``entropy_grad``: log p and p at once); then, under p < 4, its share of
      ∂L/∂W, a block of rows at a time in the compute dtype and in float32 (``weight_block_rows``:
      at most 4·c·V, and at most (p + 4)·V·h), beside the p·c·V chunk;
    * per token: log π, H, lse, ∂L/∂log π (4 bytes each) and ∂L/∂h (h·p): t·(16 + h·p).

    peak = t·(16 + h·p) + max(V·h·p' + 8·c·V,
                              4·V·h + V·h·p' + max(k·c·V, p'·c·V + min(4·c·V, (p' + 4)·V·h)·[p' > 0])),
    p' = p if p < 4 else 0, k = 8 with ``entropy_grad`` else 4 + p'. Against (t, V) logits this is
    constant in t but for the per-token term. Not counted: the caller's hidden states and W, and a
    GEMM library's own scratch (a few MB).

    Args:
        t: tokens through the head (a micro-batch's response tokens); vocab: V; hidden: h;
        chunk: ``chunk_tokens`` (``vapo_lab.algo.lm.default_chunk_tokens(V)`` by default, 441 at
        V = 152,064); compute_bytes: p; entropy_grad: whether H carries gradients.
    """
    c = min(chunk, t)
    low = compute_bytes if compute_bytes < 4 else 0  # p': the narrower copies exist only under autocast
    copy = vocab * hidden * low  # W in the compute dtype
    forward = copy + 8 * c * vocab  # z − max and exp(z − max), float32
    k = 8 if entropy_grad else 4 + low  # log p and p, or ∂L/∂z in float32 and in the compute dtype
    rows = min(4 * c * vocab, (low + 4) * vocab * hidden) if low else 0  # ∂L/∂W's block, p' and float32
    backward = 4 * vocab * hidden + copy + max(k * c * vocab, low * c * vocab + rows)
    return t * (16 + hidden * compute_bytes) + max(forward, backward)


# -- KV cache ------------------------------------------------------------------------------------
def kv_bytes_per_token(s: Shape, bytes_per_value: int = 2) -> int:
    """Returns 2·L·kv_heads·d·bytes: one token's keys and values in every layer."""
    return 2 * s.num_layers * s.num_kv_heads * s.head_dim * bytes_per_value


def kv_bytes_per_sequence(s: Shape, tokens: int, bytes_per_value: int = 2) -> int:
    """Returns the KV cache of one sequence of ``tokens`` (prompt + max_new_tokens)."""
    return kv_bytes_per_token(s, bytes_per_value) * tokens


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
    mini_batch_size: int | None = None  # responses per optimiser step, over all ranks (None: no limit)
    critic: bool = True  # a value model is trained (GAE advantages)
    reference: bool = False  # a frozen reference policy (a KL term)
    engine: str = "builtin"  # builtin | vllm
    builtin_rows: int = 256  # the built-in sampler decodes at most this many rows at once
    tensor_parallel_size: int = 1  # vLLM: its weights and KV cache split over t GPUs
    engine_memory: float = 0.0  # vLLM: bytes it takes of each GPU (gpu_memory_utilization x memory)
    engine_sleeps: bool = True  # vLLM: frees its memory during the update (sleep mode)
    offload: bool = False  # trainer.offload_during_rollout: the training state in host memory while vLLM samples
    logprob_chunk: int | None = None  # head_logprobs_and_entropy's tokens a chunk (None: the whole pass)
    ppo_epochs: int = 1


@dataclass(frozen=True)
class Hardware:
    """The rates a step's time is estimated from: one GPU's peak and the share of it reached.

    Defaults: an H100 SXM (NVIDIA's datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16). The shares
    are assumptions, not measurements: decoding reaching 60% of the bandwidth, the update 40% of the
    peak FLOPs (a typical MFU of FSDP training with activation recomputation).
    """

    bandwidth: float = 3.35e12  # bytes/s
    flops: float = 989e12  # FLOP/s
    bandwidth_share: float = 0.6
    flops_share: float = 0.4


@dataclass(frozen=True)
class Footprint:
    """What one rank of a run holds, in bytes, and how long its step takes, in seconds (``estimate``)."""

    actor_params: int
    critic_params: int  # 0 without a critic
    reference_params: int  # 0 without a reference policy
    sequence: int  # s: tokens per sequence, prompt + response (capped by the context)
    pass_tokens: int  # tokens through one forward/backward pass on a rank (the token budget's worst case)
    weights: float  # the actor's and critic's (sharded) weights
    gradients: float
    optimizer: float
    reference: float  # the reference policy's (sharded) weights
    gathered: float  # fsdp: the unsharded units in flight (root + 2 layers), transient
    replica: float  # builtin under fsdp: an unsharded copy of the actor for sampling, always resident
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
        critic's activations (they are updated one after the other) + vLLM's share if it stays awake."""
        awake = self.engine_memory if self.vllm and not self.engine_sleeps else 0.0
        return self.state + self.gathered + max(self.actor_activations, self.critic_activations) + awake

    @property
    def rollout_peak(self) -> float:
        """Returns the rollout phase: the state (none with offload) + vLLM's share, or the built-in
        sampler's KV cache."""
        if self.vllm:
            return (0.0 if self.offload else self.state) + self.engine_memory
        return self.state + self.sequences_at_once * self.kv_per_sequence

    @property
    def need(self) -> float:
        """Returns the memory a rank needs: the larger of the update and rollout phases."""
        return max(self.train_peak, self.rollout_peak)

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
      the reference policy: 4 bytes (float32) x its parameters, / N under fsdp.
    * fsdp gathers each FSDP unit (a decoder layer; the root: embeddings, final norm and heads)
      in the compute dtype while it computes; the root stays gathered through forward and backward
      (FSDP2 does not reshard the root after forward) and one layer is prefetched: root + 2 layers.
    * A pass holds at most ``micro_tokens`` tokens (``trainer.max_tokens_per_micro_batch``, counted
      in the padded layout a pass runs), and at least one longest sequence: pass_tokens =
      max(s, min(micro_tokens, rows x s)), rows = min(mini_batch_size, ceil(B / N)) (a mini-batch is a
      random draw from the whole batch, so a rank's share of one can reach all its responses).
      Activations: ``qwen2_pass_activation_bytes`` for pass_tokens // s rows of s tokens (the tensors
      autograd keeps, derived one by one and within 5% of CPU measurements, docs/benchmarks.md; no
      stored attention scores, as flash attention), the actor's with the chunked log-prob pass over
      its response tokens. FSDP2 computes in bf16 copies ("cast"); one process under autocast,
      whose float32 residual stream and cast-weight cache it counts.
    * Sampling, builtin: under single the sampler runs the policy itself; under fsdp each rank
      keeps an unsharded replica of the actor in the compute dtype. Its static KV cache holds up to
      ``builtin_rows`` of the rank's ceil(B / N) responses at once.
    * Sampling, vLLM: one engine per t ranks takes ``engine_memory`` of each GPU during rollouts
      (and the update too unless it sleeps); in it, the actor's weights / t, and a paged KV cache
      (/ t) that decodes as many of its requests (the t ranks' responses) at once as fit and
      queues the rest. With ``offload`` the training state is in host memory meanwhile.
    * Time: a decoding step of one sampler reads its weights and its running sequences' KV cache
      (at an average context of prompt + t/2) at ``bandwidth x bandwidth_share``; the rollout is
      ceil(requests / at once) waves of t steps, every response at max_new_tokens: an upper bound.
      The update: 6·P FLOPs per trained parameter and token (8·P with recomputation), 2·P per
      forward-only pass (old log-probs, values, reference), + 2·L·s·h per token and pass for causal
      attention (x3 with its backward), times ppo_epochs for the trained passes, over a rank's
      ceil(B / N)·s tokens, at ``flops x flops_share``. Prefill, the weight push and sampling
      overheads are not counted.
    """
    hw = hardware or Hardware()
    world = setup.world if setup.strategy == "fsdp" else 1
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
        return qwen2_pass_activation_bytes(shape, rows_a_pass, s - t, t, ckpt, head, p, False, "packed", chunk,
                                           precision)

    logprob = chunked_logprob_bytes(rows_a_pass * t, shape.vocab_size, shape.hidden_size, chunk, min(p, 4))
    gathered = 0.0
    if setup.strategy == "fsdp":
        root = actor - shape.num_layers * layer_params(shape)  # embeddings, final norm, lm_head (> the critic's)
        gathered = (root + 2 * layer_params(shape)) * p
    vllm = setup.engine == "vllm"
    tp = setup.tensor_parallel_size if vllm else 1
    kv_seq = kv_bytes_per_sequence(shape, s, p) / tp
    engine_weights = actor * p / tp if vllm else 0.0
    requests = responses * tp
    if vllm:
        at_once = min(requests, max(0, int((setup.engine_memory - engine_weights) // kv_seq)))
    else:
        at_once = min(responses, setup.builtin_rows)
    # decoding: a step reads the sampler's weights (a GPU's share) and its sequences' KV cache once
    context = setup.prompt_tokens + t / 2
    step_bytes = (engine_weights if vllm else actor * p) + at_once * kv_bytes_per_token(shape, p) / tp * context
    decode_step = step_bytes / (hw.bandwidth * hw.bandwidth_share)
    rollout = math.ceil(requests / at_once) * t * decode_step if at_once else math.inf
    # FLOPs a token: causal attention's QK and AV over s/2 keys on average, 4·(s/2)·h a layer
    attention = 2 * shape.num_layers * s * shape.hidden_size
    again = 1 if setup.gradient_checkpointing else 0  # recomputation: one more forward pass

    def trained_pass(params: int) -> float:
        return (6 + 2 * again) * params + (3 + again) * attention

    def forward_pass(params: int) -> float:
        return 2 * params + attention

    flops = setup.ppo_epochs * (trained_pass(actor) + (trained_pass(critic) if critic else 0.0))
    # before the update: the old log-probs (recomputed where vLLM sampled), the reference's, the values
    flops += forward_pass(actor) * ((1 if vllm else 0) + (1 if setup.reference else 0))
    flops += forward_pass(critic) if critic else 0.0
    update = responses * s * flops / (hw.flops * hw.flops_share)
    ckpt = setup.gradient_checkpointing
    return Footprint(
        actor_params=actor, critic_params=critic, reference_params=ref, sequence=s, pass_tokens=pass_tokens,
        weights=sharded(w * trained, world), gradients=sharded(g * trained, world),
        optimizer=sharded(o * trained, world), reference=sharded(w * ref, world), gathered=gathered,
        replica=actor * p if not vllm and setup.strategy == "fsdp" else 0.0,
        actor_activations=acts("lm", ckpt), critic_activations=acts("value", ckpt) if critic else 0.0,
        actor_activations_full=acts("lm", False), actor_activations_ckpt=acts("lm", True),
        critic_activations_full=acts("value", False) if critic else 0.0,
        critic_activations_ckpt=acts("value", True) if critic else 0.0,
        logprob=logprob, kv_per_sequence=kv_seq, responses_per_rank=responses, requests_per_engine=requests,
        sequences_at_once=at_once, vllm=vllm, offload=setup.offload and vllm, engine_weights=engine_weights,
        engine_memory=setup.engine_memory if vllm else 0.0, engine_sleeps=setup.engine_sleeps,
        generated_tokens=setup.responses_per_step * t, step_tokens=setup.responses_per_step * s,
        decode_step_seconds=decode_step, rollout_seconds=rollout, update_seconds=update)


def smallest_world(shape: Shape, setup: Setup, memory: float, divides: int | None = None,
                   engine_at_minimum: bool = False, limit: int = 1 << 20) -> int | None:
    """Returns the fewest fsdp ranks N at which ``estimate(...)`` fits in ``memory`` bytes a GPU.

    ``need`` never grows with N (state / N, ceil(B / N) responses and micro-batches no larger),
    so a binary search finds the memory minimum; with ``divides`` (the prompts per step, which must
    divide among the ranks) the answer is the smallest divisor of it at or above that minimum.
    ``engine_at_minimum``: vLLM's share is set to the least it needs (``Footprint.engine_minimum``),
    which leaves the most room for training. Returns None when no N up to ``limit`` (or
    ``divides``) fits: the parts that do not shrink with N (activations of a micro-batch, gathered
    units, a sampling replica, the engine's share) exceed ``memory`` alone.
    """
    top = divides if divides else limit

    def fits(n: int) -> bool:
        at_n = _with_world(setup, n)
        fp = estimate(shape, at_n)
        if engine_at_minimum and fp.vllm:
            fp = estimate(shape, replace(at_n, engine_memory=fp.engine_minimum))
        return fp.fits(memory)

    if top < 1 or not fits(top):
        return None
    lo, hi = 1, top
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
    return replace(setup, world=world, strategy="fsdp")


__all__ = ["DTYPE_BYTES", "GB", "Footprint", "Hardware", "Setup", "chunked_logprob_bytes", "activation_bytes", "actor_params", "backbone_params",
           "chunked_logprob_bytes", "critic_params", "embedding_params", "estimate", "kv_bytes_per_sequence",
           "kv_bytes_per_token", "layer_activation_bytes", "layer_params", "logits_bytes", "non_embedding_params",
           "sharded", "smallest_world", "state_bytes_per_param"]


# == Activations tensor by tensor: a Qwen2 pass as vapo-lab runs it ==============================
# Measured against peak RSS on CPU by ``python -m vapo_lab.bench.plan_check`` (docs/benchmarks.md,
# "Plan against measured memory"). Korthikanti's Eq. 1 (``layer_activation_bytes``) is written for
# GPT (a 4h GeLU MLP, LayerNorm, dropout, everything in one 16-bit dtype); these count the tensors
# that autograd keeps for vapo-lab's Qwen2 passes: the SwiGLU MLP, RMSNorms computed in float32,
# RoPE, grouped-query attention through torch's SDPA with the packed path's boolean mask, under
# either mixed precision vapo-lab runs (``vapo_lab.models.precision``):
#
# * ``precision="autocast"`` (trainer.strategy=single): float32 parameters, ``torch.autocast`` casts
#   each linear's input and weight to the compute dtype: the residual stream stays float32, every
#   linear keeps its own cast of its input, and the casts of the weights live through the pass;
# * ``precision="cast"`` (trainer.strategy=fsdp: FSDP2's MixedPrecisionPolicy): the parameters
#   themselves are cast to the compute dtype, so the residual stream, RoPE and the head's input are
#   in it; no weight copies beyond FSDP's gathered units (``Footprint.gathered``). Its inventory is
#   checked on CPU on a model cast to bf16 (FSDP computes in float32 on CPU); FSDP's own buffers
#   (all-gathers, reduce-scatters) are not measured here.
#
# At p = 4 (float32) the two coincide.

F32 = 4  # bytes: the RMSNorms' float32 internals, SDPA's logsumexp, float32 gradients


def qwen2_layer_activation_bytes(shape: Shape, rows: int, prompt: int, response: int, compute_bytes: int = 2,
                                 scores_stored: bool = False, layout: str = "packed",
                                 precision: str = "autocast") -> float:
    """Returns the bytes that one Qwen2 decoder layer keeps for its backward pass over ``rows``
    (prompt, response) pairs, every token valid: n = rows·(prompt + response) tokens.

    With p = ``compute_bytes`` (4: float32 throughout; 2: bf16/fp16), r = 4 under autocast (the
    float32 residual stream and RoPE tables) and p under cast, h hidden, i intermediate, q = a·d
    (query heads x head_dim), k = kv·d. Per token:

    * two RMSNorms (Qwen2RMSNorm upcasts to float32): x in float32 (4·h), the rsqrt (4) and
      x·rsqrt (4·h under autocast; under cast its compute-dtype copy, which the weight's product
      keeps, p·h);
    * the norms' outputs as the linears keep them: one tensor each (2·p·h), but under autocast with
      p < 4 a cast per linear, q/k/v and gate/up: 5·p·h;
    * MLP: gate's output (SiLU's input), SiLU's output, up's output, their product (down's input):
      4·p·i (GPT's 4h GeLU MLP keeps 4h + 4h + h in Korthikanti's 19·s·b·h);
    * o_proj's input p·q; SDPA's query p·q and logsumexp 4·a;
    * ``layout="packed"`` (``vapo_lab.models.packed``): q and k after RoPE (in r: the tables are)
      and v, which index_copy keeps to spread them into the padded layout, r·(q + k) + p·k; SDPA's
      output apart from o_proj's input (the valid rows are gathered), p·q. ``"padded"``
      (Hugging Face's forward): SDPA's output is o_proj's input.

    Per row, over a key position or a (query, key) pair: SDPA's K and V, 2·p·k a key position,
    and the boolean mask, which torch turns into an additive bias in the compute dtype and keeps,
    p a pair. Packed: prompt queries see the prompt (prompt keys, prompt² pairs), response queries
    the prompt and the response ((prompt + response) keys, response·(prompt + response) pairs).
    Padded: s = prompt + response keys, s² pairs, and K and V repeated to the a query heads, 2·p·q a
    key position (Hugging Face's SDPA attention repeats them where it passes a mask, i.e. where rows
    are padded; rows without padding get neither mask nor repeat: an upper bound there).
    ``scores_stored`` (torch's math backend, e.g. where no fused kernel takes the mask with
    grouped-query heads): no output, logsumexp or mask, but q·scale (p·q a token), the softmax
    probabilities (p·a a pair) and K and V repeated to the a query heads (2·p·q a key position).

    Under autocast with p < 4, the compute-dtype copies of the layer's linear weights, which the
    linears keep: p·(h·(q + 2k) + q·h + 3·h·i).

    Args:
        shape: the model; rows, prompt, response: the pass's layout (rows x (longest prompt +
        longest response), as ``trainer.max_tokens_per_micro_batch`` counts it); compute_bytes: p;
        scores_stored: the attention probabilities are kept (math SDPA); layout: packed | padded;
        precision: autocast | cast.
    """
    h, a, i = shape.hidden_size, shape.num_heads, shape.intermediate_size
    q, k = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    p, seq = compute_bytes, prompt + response
    n = rows * seq
    autocast = precision == "autocast" and p < F32  # casts of inputs and weights, float32 stream
    r = F32 if precision == "autocast" else p  # the residual stream's and RoPE's bytes
    normed = F32 * h if precision == "autocast" else p * h  # x·rsqrt as the weight's product keeps it
    norm_outputs = 5 * p * h if autocast else 2 * p * h  # q/k/v and gate/up casts, or one tensor a norm
    per_token = 2 * (F32 * h + F32 + normed) + norm_outputs + 4 * p * i + p * q  # norms, MLP, o_proj's input
    if layout == "packed":
        per_token += r * (q + k) + p * k  # q, k after RoPE, v: index_copy's sources
        keys = rows * (prompt + seq)  # prompt attention: the prompt; response attention: prompt + response
        pairs = rows * (prompt * prompt + response * seq)
    else:
        keys, pairs = rows * seq, rows * seq * seq
    if scores_stored:  # math SDPA: q·scale, softmax(q·Kᵀ), K and V repeated to a heads
        attention = n * p * q + pairs * p * a + keys * 2 * p * q
    else:  # fused SDPA: q, logsumexp, K, V, the mask as an additive bias (+ its output when packed)
        out = n * p * q if layout == "packed" else 0
        kv = k if layout == "packed" else q  # Hugging Face repeats K and V to the query heads beside a mask
        attention = n * (p * q + F32 * a) + out + keys * 2 * p * kv + pairs * p
    weights = p * _linear_weights(shape) if autocast else 0
    return n * per_token + attention + weights


def _linear_weights(shape: Shape) -> int:
    """Returns one decoder layer's linear weights (no biases, no norms): h·(q + 2k) + q·h + 3·h·i."""
    h = shape.hidden_size
    q, k = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return h * (q + 2 * k) + q * h + 3 * h * shape.intermediate_size


def qwen2_saved_bytes(shape: Shape, rows: int, prompt: int, response: int, head: str = "lm",
                      compute_bytes: int = 2, scores_stored: bool = False, layout: str = "packed",
                      precision: str = "autocast") -> float:
    """Returns what autograd keeps through a pass without checkpointing: L layers
    (``qwen2_layer_activation_bytes``) + the RoPE tables, cos and sin (2·d·r a token, r = 4 under
    autocast, p under cast; shared by the layers) + the final RMSNorm (4·h + 4 + x·rsqrt as in a
    layer) and the head's input.

    ``head="lm"`` (the actor): the chunked log-prob pass keeps its input (float32 under autocast,
    p·h under cast; its own peak, its per-token logsumexp included, is ``chunked_logprob_bytes``);
    ``"value"`` (the critic): Linear(h, 1) keeps its input in the compute dtype, p·h (and under
    autocast its weight's copy, p·h once). Packed, the final norm and head see the response tokens
    only; padded, the norm sees every token, the value head too, the LM head a copy of the response
    positions. Floating-point tensors only: index and mask tensors (a few bytes a token) are not counted.
    """
    h, p = shape.hidden_size, compute_bytes
    n, t = rows * (prompt + response), rows * response
    r = F32 if precision == "autocast" else p
    rope = n * 2 * shape.head_dim * r
    head_input = r * h if head == "lm" else p * h
    normed = t if layout == "packed" else n
    final = normed * (F32 * h + F32 + r * h) + (n if head == "value" and layout == "padded" else t) * head_input
    head_weight = p * h if head == "value" and precision == "autocast" and p < F32 else 0
    layers = shape.num_layers * qwen2_layer_activation_bytes(shape, rows, prompt, response, p, scores_stored, layout,
                                                             precision)
    return layers + rope + final + head_weight


def qwen2_pass_activation_bytes(shape: Shape, rows: int, prompt: int, response: int, checkpointing: bool,
                                head: str = "lm", compute_bytes: int = 2, scores_stored: bool = False,
                                layout: str = "packed", logprob_chunk: int | None = None,
                                precision: str = "autocast") -> float:
    """Returns the peak bytes that one forward + backward pass adds above the training state
    (gradients already allocated), the largest of three moments:

    * the head, after the layers' forward: saved (``qwen2_saved_bytes``, or with ``checkpointing``
      each layer's input, r·h·n a layer (r = 4 under autocast, p under cast), + the RoPE tables,
      final norm and head input) + the chunked log-prob pass's peak over the rows·response tokens
      (``chunked_logprob_bytes``, less its copy of W, V·h·p, under cast; ``head="lm"`` only). With
      checkpointing under autocast (p < 4),
      autocast's cast cache still holds every layer's compute-dtype weights until the forward ends:
      + L·p·(linear weights);
    * the last layer's MLP backward, the final norm's and the head's tensors freed: saved as above,
      less those, + (with ``checkpointing``) the recomputed layer's activations + the working set:
      the gradients of the SiLU output and the up output while the product's gradient replaces the
      product, and the residual stream's gradient: m·(2·p·i + r·h), over the m tokens one MLP call
      sees (packed: prompts and responses apart, rows·max(prompt, response); padded: n);
    * the embedding's backward, last: a dense gradient of the (V, h) table for each embedding call,
      e·V·h in the parameters' dtype (e = 4 under autocast, p under cast; the packed path embeds
      prompts and responses apart: two, summed by the autograd engine while both exist), + the
      gradient of its output, r·h·n.

    Not counted: index and mask tensors of a few bytes a token, a GEMM library's scratch (a few MB),
    the gradient of one weight matrix in flight (4·h·i), FSDP's buffers.
    """
    h, p, layers = shape.hidden_size, compute_bytes, shape.num_layers
    n, t = rows * (prompt + response), rows * response
    r = F32 if precision == "autocast" else p
    saved = qwen2_saved_bytes(shape, rows, prompt, response, head, p, scores_stored, layout, precision)
    one = qwen2_layer_activation_bytes(shape, rows, prompt, response, p, scores_stored, layout, precision)
    logprob = (chunked_logprob_bytes(t, shape.vocab_size, h, logprob_chunk or t, p) if head == "lm" and t
               else 0.0)
    if logprob and precision == "cast" and p < F32:
        logprob -= shape.vocab_size * h * p  # W is in the compute dtype already: no copy of it
    mlp_tokens = rows * max(prompt, response) if layout == "packed" else n
    working = mlp_tokens * (2 * p * shape.intermediate_size + r * h)
    rope = n * 2 * shape.head_dim * r
    head_part = saved - layers * one - rope  # the final norm's tensors and the head's input
    if checkpointing:
        cache = layers * p * _linear_weights(shape) if precision == "autocast" and p < F32 else 0
        kept = rope + head_part + layers * r * h * n  # each layer's input instead of its activations
        peak = max(kept + logprob + cache, kept - head_part + one + working)
    else:
        peak = max(saved + logprob, saved - head_part + working)
    embedding_calls = 2 if layout == "packed" else 1
    return max(peak, embedding_calls * r * shape.vocab_size * h + r * h * n)


__all__ += ["qwen2_layer_activation_bytes", "qwen2_pass_activation_bytes", "qwen2_saved_bytes"]
