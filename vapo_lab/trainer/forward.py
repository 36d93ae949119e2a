"""Training-time forward passes over (prompt, response) rows: log-probs, entropy, values.

Rows are the sampler's layout: prompts left-padded to P, responses right-padded to T. A
micro-batch is trimmed to its own longest prompt and response before the forward pass, so short
rows do not pay for the batch's longest. The logits at position P−1+t predict response token t;
the critic's value there is V(s_t), the value of the state before token t.

Group sampling puts G responses of one prompt in a batch, so the prompts of a micro-batch repeat.
For Qwen2/Llama-style models ``response_states`` runs each distinct prompt through the
transformer once and lets every response attend to its prompt's keys and values (the same maths
as a forward pass over each prompt ++ response, so the same gradients: a shared prompt's gradient
is the sum of its responses'). It runs where prompts repeat at least ``MIN_ROWS_PER_PROMPT``
times, as in the full-batch value and reference passes of group sampling; elsewhere, and for
other models, HF's forward runs.

Gradient checkpointing (``model.gradient_checkpointing``): ``enable_checkpointing`` turns on
Hugging Face's, which recomputes each decoder layer in the backward pass instead of keeping its
activations, for a model in training mode. ``response_states`` calls the layers' submodules
itself, past HF's wrapper, so it reads the same switch and checkpoints its own per-layer step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vapo_lab.algo import token_logprobs, token_logprobs_and_entropy
from vapo_lab.dist.fsdp import is_sharded
from vapo_lab.rollout.decoder import _rotate_half, rope_theta


@dataclass
class Rows:
    """The token layout of a batch of rows (B = rows)."""

    prompt_ids: Tensor  # (B, P) left-padded
    prompt_mask: Tensor  # (B, P) bool
    response_ids: Tensor  # (B, T) right-padded
    response_mask: Tensor  # (B, T) bool

    def take(self, index: Tensor) -> Rows:
        """Returns the rows ``index``, trimmed to their own longest prompt and response."""
        pm, rm = self.prompt_mask[index], self.response_mask[index]
        p = int(pm.sum(-1).max().item()) if len(index) else 0
        t = int(rm.sum(-1).max().item()) if len(index) else 0
        width = self.prompt_ids.shape[1]
        return Rows(self.prompt_ids[index][:, width - p:], pm[:, width - p:],
                    self.response_ids[index][:, :t], rm[:, :t])

    @staticmethod
    def dummy(device: torch.device | str = "cpu") -> Rows:
        """Returns one row of a one-token prompt and a one-token response (token 0): the input of
        the zero-loss passes that keep a rank's FSDP collectives in step with the others'."""
        one = torch.zeros(1, 1, dtype=torch.long, device=device)
        flag = torch.ones_like(one, dtype=torch.bool)
        return Rows(one, flag, one, flag)

    def sequence(self) -> tuple[Tensor, Tensor]:
        """Returns (input_ids, attention_mask) of prompt ++ response, (B, P+T)."""
        return (torch.cat([self.prompt_ids, self.response_ids], 1),
                torch.cat([self.prompt_mask, self.response_mask], 1))


def shares_prompts(decoder: nn.Module) -> bool:
    """Returns True when ``response_states`` can run the transformer ``decoder`` (a Qwen2/Llama
    ``*Model`` with default RoPE, no sliding window and no attention dropout)."""
    cfg = getattr(decoder, "config", None)
    return (cfg is not None and getattr(cfg, "model_type", "") in ("qwen2", "llama")
            and rope_theta(cfg) is not None and not getattr(cfg, "use_sliding_window", False)
            and not getattr(cfg, "attention_dropout", 0.0)
            and all(hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm")))


def enable_checkpointing(model: nn.Module) -> None:
    """Turns on Hugging Face's gradient checkpointing of ``model`` (a causal LM or a bare
    transformer): active while the model is in training mode, i.e. during updates, not sampling.
    Non-reentrant, as ``response_states`` checkpoints, so inputs need not require grad."""
    # transformers 5 renames it activation_checkpointing_enable (the old name warns)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})


def checkpointing(decoder: nn.Module) -> bool:
    """Returns True when ``decoder``'s forward pass should recompute its layers in the backward pass:
    HF's checkpointing is on, the model is training and gradients are being recorded."""
    return bool(getattr(decoder, "gradient_checkpointing", False)) and decoder.training and torch.is_grad_enabled()


# share prompts only when each is repeated >= this many times on average: with distinct prompts
# the split prompt/response attention is ~12% slower than HF's single pass, with 8 rows per
# prompt ~12% faster (fp32, 2 threads, 16 rows of 22 + 32 tokens, forward + backward)
MIN_ROWS_PER_PROMPT = 4


def prompt_groups(rows: Rows) -> tuple[Tensor, Tensor]:
    """Returns (distinct prompts as [ids ++ mask] rows, each row's index into them); torch.unique
    sorts, so the order is deterministic."""
    key = torch.cat([rows.prompt_ids, rows.prompt_mask.long()], 1)
    return torch.unique(key, dim=0, return_inverse=True)


def _shared(decoder: nn.Module, rows: Rows) -> tuple[Tensor, Tensor] | None:
    """Returns ``prompt_groups(rows)`` when the shared-prompt forward runs ``decoder`` and saves work."""
    if not shares_prompts(decoder):
        return None
    groups = prompt_groups(rows)
    return groups if len(groups[0]) * MIN_ROWS_PER_PROMPT <= len(rows.prompt_ids) else None


def response_states(decoder: nn.Module, rows: Rows, groups: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Returns the final hidden states at positions P−1 .. P+T−2 of every row, (B, T, H): the
    states that predict response tokens 0..T−1 (and whose values are V(s_0)..V(s_{T−1})).

    ``decoder`` is a Qwen2/Llama transformer (``Qwen2Model``: embed_tokens, layers, norm). Each
    distinct prompt of ``rows`` is computed once; responses attend to their prompt's cached keys
    and values, causally among themselves. Padding keys (left of a prompt) are masked; padded
    response tokens sit after the valid ones, so causality keeps them out of every valid state.
    """
    cfg = decoder.config
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    scale = head_dim ** -0.5
    b, p = rows.prompt_ids.shape
    t = rows.response_ids.shape[1]
    device = rows.prompt_ids.device
    uniq, inverse = groups if groups is not None else prompt_groups(rows)
    p_ids, p_mask = uniq[:, :p], uniq[:, p:].bool()
    p_pos = (p_mask.long().cumsum(-1) - 1).clamp(min=0)  # (U, P), as HF's cumsum positions
    r_pos = p_pos[inverse, -1:] + 1 + torch.arange(t, device=device)  # (B, T)
    inv_freq = 1.0 / (rope_theta(cfg) ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    dtype = decoder.embed_tokens.weight.dtype

    def rope(pos: Tensor) -> tuple[Tensor, Tensor]:
        freqs = pos.float()[..., None] * inv_freq  # (N, S, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (N, 1, S, hd)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    p_cos, p_sin = rope(p_pos)
    r_cos, r_sin = rope(r_pos)
    causal_p = torch.ones(p, p, dtype=torch.bool, device=device).tril()
    eye_p = torch.eye(p, dtype=torch.bool, device=device)
    # prompt queries: causal and not padding; a padding query sees itself (no NaN; output unused)
    p_allow = ((causal_p[None] & p_mask[:, None, :]) | eye_p[None])[:, None]  # (U, 1, P, P)
    causal_r = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    r_allow = torch.cat([p_mask[inverse][:, None, :].expand(b, t, p), causal_r[None].expand(b, t, t)], -1)
    r_allow = r_allow[:, None]  # (B, 1, T, P+T)

    def attend(q: Tensor, k: Tensor, v: Tensor, allow: Tensor) -> Tensor:
        n, _, s_, _ = q.shape  # grouped-query attention by SDPA itself (enable_gqa: torch >= 2.5)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allow, scale=scale, enable_gqa=True)
        return o.transpose(1, 2).reshape(n, s_, -1)

    def qkv(attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        n, s, _ = x.shape
        q = attn.q_proj(x).view(n, s, n_heads, head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(n, s, n_kv, head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(n, s, n_kv, head_dim).transpose(1, 2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def block(layer: nn.Module, h: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        """One decoder layer over the prompts' states ``h`` and the responses' states ``g``."""
        attn = layer.self_attn
        q, k, v = qkv(attn, layer.input_layernorm(h), p_cos, p_sin)
        qr, kr, vr = qkv(attn, layer.input_layernorm(g), r_cos, r_sin)
        h = h + attn.o_proj(attend(q, k, v, p_allow))
        keys, values = torch.cat([k[inverse], kr], 2), torch.cat([v[inverse], vr], 2)
        g = g + attn.o_proj(attend(qr, keys, values, r_allow))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        g = g + layer.mlp(layer.post_attention_layernorm(g))
        return h, g

    # HF's checkpointing wraps each layer's own forward, which this path does not call: the same
    # per-layer recompute is applied here, so that the setting holds on every training forward
    recompute = checkpointing(decoder)
    h = decoder.embed_tokens(p_ids)  # (U, P, H)
    g = decoder.embed_tokens(rows.response_ids)  # (B, T, H)
    for layer in decoder.layers:
        h, g = checkpoint(block, layer, h, g, use_reentrant=False) if recompute else block(layer, h, g)
    last_prompt = h[:, -1][inverse][:, None]  # (B, 1, H): the state before response token 0
    return decoder.norm(torch.cat([last_prompt, g[:, :t - 1]], 1))


def policy_forward(model: nn.Module, rows: Rows, temperature: float = 1.0,
                   with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Returns (log-probs of the response tokens (B, T), entropy (B, T) or None).

    Logits are divided by ``temperature`` so that the ratio to the sampler's log-probs is exact.
    Only the response positions go through the LM head (a P-fold saving for long prompts). The
    entropy carries gradients only with ``entropy_grad`` (an entropy bonus); as a metric it is
    computed from detached logits, so the backward pass does not go through it.
    """
    groups = None if is_sharded(model) else _shared(model.model, rows)
    if groups is not None:
        hidden = response_states(model.model, rows, groups)
    elif is_sharded(model):
        # FSDP2 gathers the root's parameters (embeddings, tied LM head) in the root's forward:
        # call it, keeping logits only for the positions before each response token
        ids, mask = rows.sequence()
        t = rows.response_ids.shape[1]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions,
                       logits_to_keep=t + 1).logits[:, :-1].float()
        if temperature != 1.0:
            logits = logits / temperature
        if with_entropy:
            return token_logprobs_and_entropy(logits, rows.response_ids, entropy_grad)
        return token_logprobs(logits, rows.response_ids), None
    else:
        ids, mask = rows.sequence()
        p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = model.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions).last_hidden_state
        hidden = hidden[:, p - 1:p - 1 + t]
    logits = model.lm_head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    if with_entropy:
        return token_logprobs_and_entropy(logits, rows.response_ids, entropy_grad)
    return token_logprobs(logits, rows.response_ids), None


def value_forward(critic: nn.Module, rows: Rows) -> Tensor:
    """Returns V(s_t) for each response token, (B, T)."""
    backbone = getattr(critic, "backbone", None)
    groups = (_shared(backbone, rows) if backbone is not None and hasattr(critic, "head") and not is_sharded(critic)
              else None)
    if groups is not None:
        return critic.head(response_states(backbone, rows, groups)).squeeze(-1).float()
    ids, mask = rows.sequence()
    p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    return critic(ids, mask.long())[:, p - 1:p - 1 + t]


def _reshard(model: nn.Module) -> None:
    """Frees a sharded model's gathered parameters after passes without a backward: FSDP2 keeps the
    root's gathered until its backward, and while gathered, ``parameters()`` are the whole
    temporary tensors, not the shards an optimiser or a checkpoint must see."""
    if is_sharded(model):
        model.reshard()


def passes(n_rows: int, micro: int) -> int:
    """Returns how many forward passes ``batched_*`` makes over ``n_rows`` rows, ``micro`` at a time."""
    return -(-n_rows // micro)


@torch.no_grad()
def batched_logprobs(model: nn.Module, rows: Rows, micro: int, temperature: float, extra: int = 0) -> Tensor:
    """Returns the response log-probs of ``model`` for all rows, (B, T), ``micro`` rows at a time,
    after ``extra`` discarded passes on a dummy row (a sharded model's ranks make equal passes)."""
    t = rows.response_ids.shape[1]
    for _ in range(extra):
        policy_forward(model, Rows.dummy(rows.prompt_ids.device), temperature)
    parts = [policy_forward(model, rows.take(i), temperature)[0]
             for i in torch.arange(len(rows.response_ids)).split(micro)]
    _reshard(model)
    if not parts:
        return torch.zeros(0, t)
    return torch.cat([torch.nn.functional.pad(p, (0, t - p.shape[1])) for p in parts])


@torch.no_grad()
def batched_values(critic: nn.Module, rows: Rows, micro: int, extra: int = 0) -> Tensor:
    """Returns V(s_t) for all rows, (B, T), computed ``micro`` rows at a time (``extra``: as
    ``batched_logprobs``)."""
    width = rows.response_ids.shape[1]
    for _ in range(extra):
        value_forward(critic, Rows.dummy(rows.prompt_ids.device))
    parts = [value_forward(critic, rows.take(idx)) for idx in torch.arange(len(rows.response_ids)).split(micro)]
    _reshard(critic)
    if not parts:
        return torch.zeros(0, width)
    return torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in parts])
