"""The packed training forward of Qwen2/Llama transformers: token-wise ops on valid tokens only,
attention alone in the padded layout, each distinct prompt computed once.

Rows are (prompt, response) pairs, prompts left-padded and responses right-padded. Where prompts
repeat (group sampling), each distinct prompt runs once and its responses attend to its keys and
values: the same maths, and gradients, as a pass over each prompt ++ response.
``vapo_lab.trainer.forward`` chooses this path or Hugging Face's padded one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from vapo_lab.distributed.fsdp import as_forward
from vapo_lab.models.rope import rope_theta, rotate_half


def shares_prompts(decoder: nn.Module) -> bool:
    """Returns True when ``packed_states`` can run the transformer ``decoder`` (a Qwen2/Llama
    ``*Model`` with default RoPE, no sliding window and no attention dropout)."""
    cfg = getattr(decoder, "config", None)
    return (
        cfg is not None
        and getattr(cfg, "model_type", "") in ("qwen2", "llama")
        and rope_theta(cfg) is not None
        and not getattr(cfg, "use_sliding_window", False)
        and not getattr(cfg, "attention_dropout", 0.0)
        and all(hasattr(decoder, a) for a in ("embed_tokens", "layers", "norm"))
    )


def enable_checkpointing(model: nn.Module) -> None:
    """Turns on Hugging Face's gradient checkpointing of ``model`` (a causal LM or a bare
    transformer): active while the model is in training mode, i.e. during updates, not sampling.
    Non-reentrant, as ``packed_states`` checkpoints, so inputs need not require grad."""
    # transformers 5 renames it activation_checkpointing_enable (the old name warns)
    enable = (
        getattr(model, "activation_checkpointing_enable", None)
        or model.gradient_checkpointing_enable
    )
    enable({"use_reentrant": False})


def checkpointing(decoder: nn.Module) -> bool:
    """Returns True when ``decoder``'s forward should recompute its layers in the backward pass:
    HF's checkpointing is on, the model is training and gradients are being recorded."""
    return (
        bool(getattr(decoder, "gradient_checkpointing", False))
        and decoder.training
        and torch.is_grad_enabled()
    )


# share prompts only when each is repeated >= this many times on average; below that each row keeps
# its own copy of its prompt (torch.unique would find little to share)
MIN_ROWS_PER_PROMPT = 2
# Without repeated prompts, rows whose valid tokens fill at least this share of the padded layout
# take HF's padded forward: its single attention beats the packed path's split one when there is
# little padding to skip (docs/benchmarks.md, packed training passes).
PACK_BELOW_SHARE = 0.9


def prompt_groups(
    decoder: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, response_mask: Tensor
) -> tuple[Tensor, Tensor] | None:
    """Returns the prompt grouping ``packed_states`` runs ``decoder`` with: (distinct prompts as
    [ids ++ mask] rows, each row's index into them), or None for HF's padded forward.

    None where ``packed_states`` cannot run ``decoder`` (not a Qwen2/Llama transformer), and where
    prompts do not repeat and there is little padding (``PACK_BELOW_SHARE``). The distinct prompts
    (``torch.unique``: sorted, so the order is deterministic) where they repeat enough to save
    work, else one prompt per row, in row order.
    """
    if not shares_prompts(decoder):
        return None
    key = torch.cat([prompt_ids, prompt_mask.long()], 1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    if len(uniq) * MIN_ROWS_PER_PROMPT <= len(key):
        return uniq, inverse
    valid = int(prompt_mask.sum()) + int(response_mask.sum())
    if valid >= PACK_BELOW_SHARE * (prompt_ids.numel() + response_mask.numel()):
        return None
    return key, torch.arange(len(key), device=key.device)


def packed_states(
    decoder: nn.Module, response_ids: Tensor, response_mask: Tensor, groups: tuple[Tensor, Tensor]
) -> Tensor:
    """Returns the final hidden states that predict the response tokens, packed: (N, H) for the N
    valid response tokens in row-major order (those of ``response_mask``).

    ``decoder`` is a Qwen2/Llama transformer (``Qwen2Model``: embed_tokens, layers, norm);
    ``groups`` = (distinct prompts as [ids ++ mask] rows, each row's index into them), from
    ``prompt_groups``. Every token-wise op (embedding, norms, q/k/v/o projections, MLP) runs on the
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
    scale = head_dim**-0.5
    b, t = response_ids.shape
    uniq, inverse = groups
    p = uniq.shape[1] // 2  # [ids ++ mask]
    device = response_ids.device
    u = len(uniq)
    p_ids, p_mask = uniq[:, :p], uniq[:, p:].bool()
    p_pos = (p_mask.long().cumsum(-1) - 1).clamp(min=0)  # (U, P), as HF's cumsum positions
    r_pos = p_pos[inverse, -1:] + 1 + torch.arange(t, device=device)  # (B, T)
    p_flat = p_mask.reshape(-1)
    p_sel = p_flat.nonzero().squeeze(1)  # valid prompt tokens in the (U·P) layout
    r_sel = response_mask.reshape(-1).nonzero().squeeze(1)  # valid response tokens in (B·T)
    inv_freq = 1.0 / (
        rope_theta(cfg)
        ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
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
    r_allow = torch.cat(
        [p_mask[inverse][:, None, :].expand(b, t, p), causal_r[None].expand(b, t, t)], -1
    )
    r_allow = r_allow[:, None]  # (B, 1, T, P+T)

    def spread(x: Tensor, sel: Tensor, n: int, s: int) -> Tensor:
        """(N, heads, hd) packed -> (n, heads, s, hd), zeros at padding."""
        out = x.new_zeros(n * s, x.shape[1], head_dim).index_copy(0, sel, x)
        return out.view(n, s, x.shape[1], head_dim).transpose(1, 2)

    def attend(q: Tensor, k: Tensor, v: Tensor, allow: Tensor, sel: Tensor) -> Tensor:
        """SDPA in the padded layout, then the valid queries' outputs packed: (N, heads·hd)."""
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=allow, scale=scale, enable_gqa=True
        )
        return o.transpose(1, 2).reshape(-1, n_heads * head_dim)[sel]

    def qkv(
        attn: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, sel: Tensor, n: int, s: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        q = attn.q_proj(x).view(-1, n_heads, head_dim)
        k = attn.k_proj(x).view(-1, n_kv, head_dim)
        v = attn.v_proj(x).view(-1, n_kv, head_dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
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
    g = decoder.embed_tokens(response_ids.reshape(-1)[r_sel])  # (Nr, H)
    for layer in decoder.layers:
        # as_forward: a sharded layer's parameters are gathered (gradients reduced) around it
        h, g = (
            checkpoint(as_forward, layer, block, layer, h, g, use_reentrant=False)
            if recompute
            else as_forward(layer, block, layer, h, g)
        )
    # the state before response token (b, 0) is its prompt's last token's; before (b, t > 0), the
    # response's token t − 1, the previous packed row (row-major order, valid tokens are a prefix)
    # packed index of each prompt's last token
    last_prompt = (p_flat.long().cumsum(0) - 1).view(u, p)[:, -1]
    n_r = len(r_sel)
    first = r_sel % t == 0 if t else r_sel.bool()
    source = torch.where(first, n_r + r_sel // max(t, 1), torch.arange(n_r, device=device) - 1)
    return decoder.norm(torch.cat([g, h[last_prompt][inverse]])[source])
