"""Training-time forward passes over (prompt, response) rows: log-probs, entropy, values.

Rows are the sampler's layout: prompts left-padded to P, responses right-padded to T. A
micro-batch is trimmed to its own longest prompt and response before the forward pass, so short
rows do not pay for the batch's longest. The logits at position P−1+t predict response token t;
the critic's value there is V(s_t), the value of the state before token t.

For Qwen2/Llama-style models the training passes run packed (``packed_states``): every
token-wise op sees only the valid tokens, and only attention the padded layout, so padding costs
almost nothing. Where prompts repeat (group sampling puts G responses of one prompt in a batch) each
distinct prompt runs through the transformer once and every response attends to its prompt's keys
and values (the same maths as a forward pass over each prompt ++ response, so the same gradients:
a shared prompt's gradient is the sum of its responses'). Other models, and sharded ones, run
HF's padded forward.

Gradient checkpointing (``model.gradient_checkpointing``): ``enable_checkpointing`` turns on
Hugging Face's, which recomputes each decoder layer in the backward pass instead of keeping its
activations, for a model in training mode. ``packed_states`` calls the layers' submodules
itself, past HF's wrapper, so it reads the same switch and checkpoints its own per-layer step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vapo_lab.algo import token_logprobs, token_logprobs_and_entropy
from vapo_lab.distributed.fsdp import is_sharded
from vapo_lab.models.value import wide
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
    """Returns True when ``packed_states`` can run the transformer ``decoder`` (a Qwen2/Llama
    ``*Model`` with default RoPE, no sliding window and no attention dropout)."""
    cfg = getattr(decoder, "config", None)
    return (cfg is not None and getattr(cfg, "model_type", "") in ("qwen2", "llama")
            and rope_theta(cfg) is not None and not getattr(cfg, "use_sliding_window", False)
            and not getattr(cfg, "attention_dropout", 0.0)
            and all(hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm")))


def enable_checkpointing(model: nn.Module) -> None:
    """Turns on Hugging Face's gradient checkpointing of ``model`` (a causal LM or a bare
    transformer): active while the model is in training mode, i.e. during updates, not sampling.
    Non-reentrant, as ``packed_states`` checkpoints, so inputs need not require grad."""
    # transformers 5 renames it activation_checkpointing_enable (the old name warns)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable({"use_reentrant": False})


def checkpointing(decoder: nn.Module) -> bool:
    """Returns True when ``decoder``'s forward pass should recompute its layers in the backward pass:
    HF's checkpointing is on, the model is training and gradients are being recorded."""
    return bool(getattr(decoder, "gradient_checkpointing", False)) and decoder.training and torch.is_grad_enabled()


# share prompts only when each is repeated >= this many times on average; below that each row keeps
# its own copy of its prompt (torch.unique would find little to share)
MIN_ROWS_PER_PROMPT = 2
# Without repeated prompts, rows whose valid tokens fill at least this share of the padded layout
# take HF's padded forward: its single attention over prompt ++ response beats the packed path's
# split one when there is little padding to skip (16 distinct prompts x 32 tokens, no padding,
# forward + backward of actor and critic: packed 0.95x; the default's micro-batches, 56% valid
# tokens: packed 1.5x; 1 thread, bench.update).
PACK_BELOW_SHARE = 0.9


def _groups(decoder: nn.Module, rows: Rows) -> tuple[Tensor, Tensor] | None:
    """Returns the prompt grouping ``packed_states`` runs ``decoder`` with: (distinct prompts as
    [ids ++ mask] rows, each row's index into them), or None for HF's padded forward.

    None where ``packed_states`` cannot run ``decoder`` (not a Qwen2/Llama transformer), and where
    prompts do not repeat and there is little padding (``PACK_BELOW_SHARE``). The distinct prompts
    (``torch.unique``: sorted, so the order is deterministic) where they repeat enough to save
    work, else one prompt per row, in row order.
    """
    if not shares_prompts(decoder):
        return None
    key = torch.cat([rows.prompt_ids, rows.prompt_mask.long()], 1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(uniq) * MIN_ROWS_PER_PROMPT <= len(key):
        return uniq, inverse
    valid = int(rows.prompt_mask.sum()) + int(rows.response_mask.sum())
    if valid >= PACK_BELOW_SHARE * (rows.prompt_ids.numel() + rows.response_ids.numel()):
        return None
    return key, torch.arange(len(key), device=key.device)


def packed_states(decoder: nn.Module, rows: Rows, groups: tuple[Tensor, Tensor]) -> Tensor:
    """Returns the final hidden states that predict the response tokens, packed: (N, H) for the N
    valid response tokens of ``rows`` in row-major order (those of ``rows.response_mask``).

    ``decoder`` is a Qwen2/Llama transformer (``Qwen2Model``: embed_tokens, layers, norm);
    ``groups`` = (distinct prompts as [ids ++ mask] rows, each row's index into them), from
    ``_groups``. Every token-wise op (embedding, norms, q/k/v/o projections, MLP) runs on the
    valid tokens only, packed into one (tokens, H) matrix: padding costs nothing there. Attention
    alone sees the padded layout: each layer spreads the packed queries, keys and values into
    (rows, heads, length, head_dim) with zeros at padding, runs SDPA with the padding and causal
    masks, and packs the valid outputs back. Each distinct prompt is computed once; responses
    attend to their prompt's keys and values (left padding masked) and causally among themselves
    (right padding comes after every valid token, so causality keeps it out). The same maths as
    Hugging Face's forward over each padded prompt ++ response, so the same log-probs, values and
    gradients to float rounding (tests/trainer/test_forward.py).
    """
    cfg = decoder.config
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    scale = head_dim ** -0.5
    b, p = rows.prompt_ids.shape
    t = rows.response_ids.shape[1]
    device = rows.prompt_ids.device
    uniq, inverse = groups
    u = len(uniq)
    p_ids, p_mask = uniq[:, :p], uniq[:, p:].bool()
    p_pos = (p_mask.long().cumsum(-1) - 1).clamp(min=0)  # (U, P), as HF's cumsum positions
    r_pos = p_pos[inverse, -1:] + 1 + torch.arange(t, device=device)  # (B, T)
    p_flat = p_mask.reshape(-1)
    p_sel = p_flat.nonzero().squeeze(1)  # valid prompt tokens in the (U·P) layout
    r_sel = rows.response_mask.reshape(-1).nonzero().squeeze(1)  # valid response tokens in (B·T)
    inv_freq = 1.0 / (rope_theta(cfg) ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    dtype = decoder.embed_tokens.weight.dtype

    def rope(pos: Tensor) -> tuple[Tensor, Tensor]:
        freqs = pos.float()[:, None] * inv_freq  # (N, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (N, 1, hd): broadcast over heads
        return emb.cos().to(dtype), emb.sin().to(dtype)

    p_cos, p_sin = rope(p_pos.reshape(-1)[p_sel])
    r_cos, r_sin = rope(r_pos.reshape(-1)[r_sel])
    causal_p = torch.ones(p, p, dtype=torch.bool, device=device).tril()
    eye_p = torch.eye(p, dtype=torch.bool, device=device)
    # prompt queries: causal and not padding; a padding query sees itself (no NaN; output unused)
    p_allow = ((causal_p[None] & p_mask[:, None, :]) | eye_p[None])[:, None]  # (U, 1, P, P)
    causal_r = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    r_allow = torch.cat([p_mask[inverse][:, None, :].expand(b, t, p), causal_r[None].expand(b, t, t)], -1)
    r_allow = r_allow[:, None]  # (B, 1, T, P+T)

    def spread(x: Tensor, sel: Tensor, n: int, s: int) -> Tensor:
        """(N, heads, hd) packed -> (n, heads, s, hd), zeros at padding."""
        out = x.new_zeros(n * s, x.shape[1], head_dim).index_copy(0, sel, x)
        return out.view(n, s, x.shape[1], head_dim).transpose(1, 2)

    def attend(q: Tensor, k: Tensor, v: Tensor, allow: Tensor, sel: Tensor) -> Tensor:
        """SDPA in the padded layout, then the valid queries' outputs packed: (N, heads·hd)."""
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allow, scale=scale, enable_gqa=True)
        return o.transpose(1, 2).reshape(-1, n_heads * head_dim)[sel]

    def qkv(attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, sel: Tensor, n: int, s: int
            ) -> tuple[Tensor, Tensor, Tensor]:
        q = attn.q_proj(x).view(-1, n_heads, head_dim)
        k = attn.k_proj(x).view(-1, n_kv, head_dim)
        v = attn.v_proj(x).view(-1, n_kv, head_dim)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        return spread(q, sel, n, s), spread(k, sel, n, s), spread(v, sel, n, s)

    def block(layer: nn.Module, h: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        """One decoder layer over the packed prompt states ``h`` and response states ``g``."""
        attn = layer.self_attn
        q, k, v = qkv(attn, layer.input_layernorm(h), p_cos, p_sin, p_sel, u, p)
        qr, kr, vr = qkv(attn, layer.input_layernorm(g), r_cos, r_sin, r_sel, b, t)
        h = h + attn.o_proj(attend(q, k, v, p_allow, p_sel))
        keys, values = torch.cat([k[inverse], kr], 2), torch.cat([v[inverse], vr], 2)
        g = g + attn.o_proj(attend(qr, keys, values, r_allow, r_sel))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        g = g + layer.mlp(layer.post_attention_layernorm(g))
        return h, g

    # HF's checkpointing wraps each layer's own forward, which this path does not call: the same
    # per-layer recompute is applied here, so that the setting holds on every training forward
    recompute = checkpointing(decoder)
    h = decoder.embed_tokens(p_ids.reshape(-1)[p_sel])  # (Np, H)
    g = decoder.embed_tokens(rows.response_ids.reshape(-1)[r_sel])  # (Nr, H)
    for layer in decoder.layers:
        h, g = checkpoint(block, layer, h, g, use_reentrant=False) if recompute else block(layer, h, g)
    # the state before response token (b, 0) is its prompt's last token's; before (b, t > 0), the
    # response's token t − 1, the previous packed row (row-major order, valid tokens are a prefix)
    last_prompt = (p_flat.long().cumsum(0) - 1).view(u, p)[:, -1]  # packed index of each prompt's last token
    n_r = len(r_sel)
    first = r_sel % t == 0 if t else r_sel.bool()
    source = torch.where(first, n_r + r_sel // max(t, 1), torch.arange(n_r, device=device) - 1)
    return decoder.norm(torch.cat([g, h[last_prompt][inverse]])[source])


def _unpack(packed: Tensor, mask: Tensor) -> Tensor:
    """Returns the (B, T) tensor with ``packed`` (N,) at the valid positions of ``mask`` and 0 elsewhere."""
    return packed.new_zeros(mask.shape).masked_scatter(mask, packed)


def policy_forward(model: nn.Module, rows: Rows, temperature: float = 1.0,
                   with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Returns (log-probs of the response tokens (B, T), entropy (B, T) or None); 0 at padding
    on the packed path, any finite value there on Hugging Face's.

    Logits are divided by ``temperature`` so that the ratio to the sampler's log-probs is exact.
    Only the response positions go through the LM head (a P-fold saving for long prompts), and on
    the packed path (:func:`packed_states`: Qwen2/Llama, not sharded) only their valid tokens. The
    entropy carries gradients only with ``entropy_grad`` (an entropy bonus); as a metric it is
    computed from detached logits, so the backward pass does not go through it.
    """
    groups = None if is_sharded(model) else _groups(model.model, rows)
    if groups is not None:
        mask = rows.response_mask
        logits = wide(model.lm_head(packed_states(model.model, rows, groups)))
        if temperature != 1.0:
            logits = logits / temperature
        tokens = rows.response_ids[mask]
        if with_entropy:
            logprobs, entropy = token_logprobs_and_entropy(logits, tokens, entropy_grad)
            return _unpack(logprobs, mask), _unpack(entropy, mask)
        return _unpack(token_logprobs(logits, tokens), mask), None
    if is_sharded(model):
        # FSDP2 gathers the root's parameters (embeddings, tied LM head) in the root's forward:
        # call it, keeping logits only for the positions before each response token
        ids, mask = rows.sequence()
        t = rows.response_ids.shape[1]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions,
                       logits_to_keep=t + 1).logits[:, :-1]
    else:
        ids, mask = rows.sequence()
        p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = model.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions).last_hidden_state
        logits = model.lm_head(hidden[:, p - 1:p - 1 + t])
    logits = wide(logits)
    if temperature != 1.0:
        logits = logits / temperature
    if with_entropy:
        return token_logprobs_and_entropy(logits, rows.response_ids, entropy_grad)
    return token_logprobs(logits, rows.response_ids), None


def value_forward(critic: nn.Module, rows: Rows) -> Tensor:
    """Returns V(s_t) for each response token, (B, T); 0 at padding on the packed path."""
    backbone = getattr(critic, "backbone", None)
    groups = (_groups(backbone, rows) if backbone is not None and hasattr(critic, "head") and not is_sharded(critic)
              else None)
    if groups is not None:
        values = wide(critic.head(packed_states(backbone, rows, groups)).squeeze(-1))
        return _unpack(values, rows.response_mask)
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
