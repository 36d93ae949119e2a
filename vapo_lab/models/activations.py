"""The activation memory of a training pass: what autograd keeps, tensor by tensor, in bytes.

Pure functions of a model's ``Shape`` and a pass's sizes (no torch) for the plan
(:mod:`vapo_lab.models.footprint`): ``chunked_logprob_bytes`` is the chunked LM head's peak,
``qwen2_pass_activation_bytes`` a whole Qwen2 pass; both are checked against CPU peaks
(docs/benchmarks.md, Log-prob pass memory and Plan against measured memory).
"""

from __future__ import annotations

from vapo_lab.models.shapes import Shape


# -- the chunked log-prob pass -------------------------------------------------------------------
def chunked_logprob_bytes(
    t: int, vocab: int, hidden: int, chunk: int, compute_bytes: int = 2, entropy_grad: bool = False
) -> float:
    """Returns the peak bytes that the chunked log-prob pass adds, forward + backward over t tokens.

    ``vapo_lab.algo.lm.head_logprobs_and_entropy`` with the entropy (as the trainer asks for it)
    never holds the (t, V) logits, only chunks of c = min(chunk, t) tokens. Its tensors, with p the
    compute dtype's bytes (2 for bf16 under autocast, 4 for float32) and fp32 master weights:

    * W in the compute dtype, cast once in forward and once in backward: V·h·p (none when p = 4);
    * forward, a chunk: its float32 logits z − max and exp(z − max): 8·c·V (the bf16 logits, p·c·V,
      are freed before the exponential);
    * backward: the float32 gradient of W, 4·V·h, summed over the chunks (autograd then adds it to
      W.grad: all of it is extra once an earlier micro-batch's gradient is there); a chunk's
      float32 ∂L/∂z, computed in place in its recomputed logits, and the same in the compute
      dtype: (4 + p)·c·V (8·c·V with ``entropy_grad``: log p and p at once); then, under p < 4,
      its share of ∂L/∂W, a block of rows at a time in the compute dtype and in float32
      (``weight_block_rows``: at most 4·c·V, and at most (p + 4)·V·h), beside the p·c·V chunk;
    * per token: log π, H, lse, ∂L/∂log π (4 bytes each) and ∂L/∂h (h·p): t·(16 + h·p).

    peak = t·(16 + h·p) + max(V·h·p' + 8·c·V,
                              4·V·h + V·h·p'
                              + max(k·c·V, p'·c·V + min(4·c·V, (p' + 4)·V·h)·[p' > 0])),
    p' = p if p < 4 else 0, k = 8 with ``entropy_grad`` else 4 + p'. Against (t, V) logits this is
    constant in t but for the per-token term. Not counted: the caller's hidden states and W, and a
    GEMM library's own scratch (a few MB).

    Args:
        t: tokens through the head (a micro-batch's response tokens); vocab: V; hidden: h;
        chunk: ``chunk_tokens`` (``vapo_lab.algo.lm.default_chunk_tokens(V)`` by default, 441 at
        V = 152,064); compute_bytes: p; entropy_grad: whether H carries gradients.
    """
    c = min(chunk, t)
    # p': the narrower copies exist only under autocast
    low = compute_bytes if compute_bytes < 4 else 0
    copy = vocab * hidden * low  # W in the compute dtype
    forward = copy + 8 * c * vocab  # z − max and exp(z − max), float32
    k = 8 if entropy_grad else 4 + low  # log p and p, or ∂L/∂z in float32 and in the compute dtype
    # ∂L/∂W's block, p' and float32
    rows = min(4 * c * vocab, (low + 4) * vocab * hidden) if low else 0
    backward = 4 * vocab * hidden + copy + max(k * c * vocab, low * c * vocab + rows)
    return t * (16 + hidden * compute_bytes) + max(forward, backward)


# -- a Qwen2 pass --------------------------------------------------------------------------------
# The tensors autograd keeps in vapo-lab's Qwen2 passes (SwiGLU MLP, float32 RMSNorms, RoPE,
# grouped-query SDPA with the packed path's boolean mask), under either mixed precision
# (``vapo_lab.models.precision``); at p = 4 (float32) the two coincide:
#
# * ``precision="autocast"`` (trainer.strategy=single): float32 parameters; ``torch.autocast``
#   casts each linear's input and weight, so the residual stream stays float32, every linear keeps
#   its own cast of its input, and the weights' casts live through the pass;
# * ``precision="cast"`` (trainer.strategy=fsdp, FSDP2's MixedPrecisionPolicy): the parameters
#   themselves are cast, so the residual stream, RoPE and the head's input are in the compute
#   dtype, with no weight copies beyond FSDP's gathered units (``Footprint.gathered``). Checked on
#   CPU on a model cast to bf16; FSDP's own communication buffers are not counted.

F32 = 4  # bytes: the RMSNorms' float32 internals, SDPA's logsumexp, float32 gradients


def qwen2_layer_activation_bytes(
    shape: Shape,
    rows: int,
    prompt: int,
    response: int,
    compute_bytes: int = 2,
    scores_stored: bool = False,
    layout: str = "packed",
    precision: str = "autocast",
) -> float:
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
      4·p·i;
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
    # x·rsqrt as the weight's product keeps it
    normed = F32 * h if precision == "autocast" else p * h
    # q/k/v and gate/up casts, or one tensor a norm
    norm_outputs = 5 * p * h if autocast else 2 * p * h
    # norms, MLP, o_proj's input
    per_token = 2 * (F32 * h + F32 + normed) + norm_outputs + 4 * p * i + p * q
    if layout == "packed":
        per_token += r * (q + k) + p * k  # q, k after RoPE, v: index_copy's sources
        # prompt attention: the prompt; response attention: prompt + response
        keys = rows * (prompt + seq)
        pairs = rows * (prompt * prompt + response * seq)
    else:
        keys, pairs = rows * seq, rows * seq * seq
    if scores_stored:  # math SDPA: q·scale, softmax(q·Kᵀ), K and V repeated to a heads
        attention = n * p * q + pairs * p * a + keys * 2 * p * q
    else:  # fused SDPA: q, logsumexp, K, V, the mask as an additive bias (+ its output when packed)
        out = n * p * q if layout == "packed" else 0
        # Hugging Face repeats K and V to the query heads beside a mask
        kv = k if layout == "packed" else q
        attention = n * (p * q + F32 * a) + out + keys * 2 * p * kv + pairs * p
    weights = p * _linear_weights(shape) if autocast else 0
    return n * per_token + attention + weights


def _linear_weights(shape: Shape) -> int:
    """Returns one decoder layer's linear weights, no biases or norms: h·(q + 2k) + q·h + 3·h·i."""
    h = shape.hidden_size
    q, k = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return h * (q + 2 * k) + q * h + 3 * h * shape.intermediate_size


def qwen2_saved_bytes(
    shape: Shape,
    rows: int,
    prompt: int,
    response: int,
    head: str = "lm",
    compute_bytes: int = 2,
    scores_stored: bool = False,
    layout: str = "packed",
    precision: str = "autocast",
) -> float:
    """Returns what autograd keeps through a pass without checkpointing: L layers
    (``qwen2_layer_activation_bytes``) + the RoPE tables, cos and sin (2·d·r a token, r = 4 under
    autocast, p under cast; shared by the layers) + the final RMSNorm (4·h + 4 + x·rsqrt as in a
    layer) and the head's input.

    ``head="lm"`` (the actor): the chunked log-prob pass keeps its input (float32 under autocast,
    p·h under cast; its own peak, its per-token logsumexp included, is ``chunked_logprob_bytes``);
    ``"value"`` (the critic): Linear(h, 1) keeps its input in the compute dtype, p·h (and under
    autocast its weight's copy, p·h once). Packed, the final norm and head see the response tokens
    only; padded, the norm sees every token, the value head too, the LM head a copy of the response
    positions. Floating-point tensors only: index and mask tensors (a few bytes a token) are not
    counted.
    """
    h, p = shape.hidden_size, compute_bytes
    n, t = rows * (prompt + response), rows * response
    r = F32 if precision == "autocast" else p
    rope = n * 2 * shape.head_dim * r
    head_input = r * h if head == "lm" else p * h
    normed = t if layout == "packed" else n
    final = (
        normed * (F32 * h + F32 + r * h)
        + (n if head == "value" and layout == "padded" else t) * head_input
    )
    head_weight = p * h if head == "value" and precision == "autocast" and p < F32 else 0
    layers = shape.num_layers * qwen2_layer_activation_bytes(
        shape, rows, prompt, response, p, scores_stored, layout, precision
    )
    return layers + rope + final + head_weight


def qwen2_pass_activation_bytes(
    shape: Shape,
    rows: int,
    prompt: int,
    response: int,
    checkpointing: bool,
    head: str = "lm",
    compute_bytes: int = 2,
    scores_stored: bool = False,
    layout: str = "packed",
    logprob_chunk: int | None = None,
    precision: str = "autocast",
) -> float:
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
    saved = qwen2_saved_bytes(
        shape, rows, prompt, response, head, p, scores_stored, layout, precision
    )
    one = qwen2_layer_activation_bytes(
        shape, rows, prompt, response, p, scores_stored, layout, precision
    )
    logprob = (
        chunked_logprob_bytes(t, shape.vocab_size, h, logprob_chunk or t, p)
        if head == "lm" and t
        else 0.0
    )
    if logprob and precision == "cast" and p < F32:
        logprob -= shape.vocab_size * h * p  # W is in the compute dtype already: no copy of it
    mlp_tokens = rows * max(prompt, response) if layout == "packed" else n
    working = mlp_tokens * (2 * p * shape.intermediate_size + r * h)
    rope = n * 2 * shape.head_dim * r
    head_part = saved - layers * one - rope  # the final norm's tensors and the head's input
    if checkpointing:
        cache = layers * p * _linear_weights(shape) if precision == "autocast" and p < F32 else 0
        # each layer's input instead of its activations
        kept = rope + head_part + layers * r * h * n
        peak = max(kept + logprob + cache, kept - head_part + one + working)
    else:
        peak = max(saved + logprob, saved - head_part + working)
    embedding_calls = 2 if layout == "packed" else 1
    return max(peak, embedding_calls * r * shape.vocab_size * h + r * h * n)


def qwen2_forward_bytes(
    shape: Shape,
    rows: int,
    prompt: int,
    response: int,
    head: str = "lm",
    compute_bytes: int = 2,
    layout: str = "packed",
    logprob_chunk: int | None = None,
    precision: str = "autocast",
) -> float:
    """Returns an upper bound of the peak bytes one forward pass without gradients adds (old
    log-probs, values, the reference's log-probs): nothing is kept from layer to layer, so the
    peak is one layer's tensors at once (at most what it would keep for backward,
    ``qwen2_layer_activation_bytes``) + the residual stream in and out (2·r·h·n) + the RoPE tables
    + one layer's weights in the compute dtype under autocast (no cast cache without gradients),
    or at the end the head: the chunked log-prob pass (``chunked_logprob_bytes``, forward and
    backward, so an upper bound) over the response tokens, or the values (p a token)."""
    h, p = shape.hidden_size, compute_bytes
    n, t = rows * (prompt + response), rows * response
    r = F32 if precision == "autocast" else p
    rope = n * 2 * shape.head_dim * r
    stream = 2 * r * h * n
    layer = qwen2_layer_activation_bytes(shape, rows, prompt, response, p, False, layout, precision)
    weights = p * _linear_weights(shape) if precision == "autocast" and p < F32 else 0
    if head == "lm":
        tail = chunked_logprob_bytes(t, shape.vocab_size, h, logprob_chunk or t, p) if t else 0.0
    else:
        tail = p * n
    return rope + max(stream + layer + weights, r * h * n + tail)


__all__ = [
    "F32",
    "chunked_logprob_bytes",
    "qwen2_forward_bytes",
    "qwen2_layer_activation_bytes",
    "qwen2_pass_activation_bytes",
    "qwen2_saved_bytes",
]
