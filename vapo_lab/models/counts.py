"""What a model of a given ``Shape`` counts: parameters, FLOPs a token, bytes of training state a
parameter and of KV cache a token.

Pure functions of a ``Shape`` (:mod:`vapo_lab.models.shapes`), exact for Qwen2: the resource plan
(:mod:`vapo_lab.models.footprint`) sums them into a run's memory and time, and the trainer's
throughput metrics (``perf/mfu``) count FLOPs with them. The sources of each formula:
docs/distributed.md, Resource plan.
"""

from __future__ import annotations

from vapo_lab.models.shapes import Shape


# -- parameters ----------------------------------------------------------------------------------
def attention_flops_per_token(s: Shape, sequence: float) -> float:
    """Returns causal attention's FLOPs a token of a ``sequence``-token row, one forward: QK and AV
    over sequence / 2 keys on average, 4·(sequence / 2)·h a layer."""
    return 2.0 * s.num_layers * sequence * s.hidden_size


def forward_flops_per_token(s: Shape, params: int, sequence: float) -> float:
    """Returns a forward pass's FLOPs a token: 2 a parameter + attention."""
    return 2.0 * params + attention_flops_per_token(s, sequence)


def trained_flops_per_token(s: Shape, params: int, sequence: float, recompute: bool) -> float:
    """Returns a trained pass's FLOPs a token, forward and backward: 6 a parameter + 3x attention,
    and one more forward where activations are recomputed (``recompute``; MFU counts none)."""
    again = 1 if recompute else 0
    return (6 + 2 * again) * params + (3 + again) * attention_flops_per_token(s, sequence)


def sampler_copy_bytes(s: Shape, actor: int, sample_bytes: int) -> float:
    """Returns the bytes of the weights the built-in fast decoder copies while it samples: in the
    masters' float32 (4 B), q/k/v and gate/up fused (``rollout.decoder.FastDecoder._fuse``); in
    another dtype, every weight of the actor in it (a replica)."""
    if sample_bytes != 4:
        return float(actor * sample_bytes)
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    fused = s.hidden_size * (q + 2 * kv) + 2 * s.hidden_size * s.intermediate_size
    return float(s.num_layers * fused * 4)


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
    """Returns (weights, gradients, optimizer) bytes per parameter before sharding: (4, 4, 8) on
    every strategy and compute dtype, float32 masters and Adam's m and v (``models.precision``):
    16 in all, ZeRO's figure for mixed-precision Adam (§3.1: 2Ψ + 2Ψ + 12Ψ)."""
    return 4, 4, 8


def sharded(total: float, world: int) -> float:
    """Returns a rank's share of ``total`` bytes sharded over N = ``world`` ranks: total / N."""
    return total / world


# -- KV cache ------------------------------------------------------------------------------------
def kv_bytes_per_token(s: Shape, bytes_per_value: int = 2) -> int:
    """Returns 2·L·kv_heads·d·bytes: one token's keys and values in every layer."""
    return 2 * s.num_layers * s.num_kv_heads * s.head_dim * bytes_per_value


def kv_bytes_per_sequence(s: Shape, tokens: int, bytes_per_value: int = 2) -> int:
    """Returns the KV cache of one sequence of ``tokens`` (prompt + max_new_tokens)."""
    return kv_bytes_per_token(s, bytes_per_value) * tokens
