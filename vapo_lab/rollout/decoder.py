"""Incremental decoders with a KV cache for the built-in sampler: ``prefill``, ``step``, ``select``
and ``repeat``.

``FastDecoder`` runs the Qwen2/Llama forward itself over the HF weights with a static cache and
few, larger ops per token (transformers' generic mask and cache bookkeeping dominate a small
model's step on CPU); ``HFDecoder`` uses any causal LM's own forward. Both give a full pass's
logits (tests/rollout/test_sampler.py). The fast decoder can compute in another dtype than the
model's (bfloat16 on a GPU: a replica of the weights and a bfloat16 cache, where the policy holds
float32 masters) and attends with SDPA on a GPU (matmul + softmax on CPU, where SDPA's kernels
were 10x slower on this cache).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from vapo_lab.models.rope import rope_theta, rotate_half


def supports_fast_path(model: nn.Module) -> bool:
    """Returns True for Qwen2/Llama-style models with default RoPE and no sliding window."""
    hf = model.config
    return (
        getattr(hf, "model_type", "") in ("qwen2", "llama")
        and rope_theta(hf) is not None
        and not getattr(hf, "use_sliding_window", False)
        and hasattr(model, "model")
        and hasattr(model.model, "layers")
    )


ATTENTION = ("matmul", "sdpa")


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """HF's Qwen2/Llama RMSNorm: normalised in float32, scaled in ``x``'s dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class FastDecoder:
    """Qwen2/Llama forward with a static KV cache of shape (layers, B, kv_heads, max_len,
    head_dim), in ``dtype`` (default: the model's) and with ``attention`` (default: SDPA on a GPU,
    matmul on CPU)."""

    def __init__(
        self,
        model: nn.Module,
        batch: int,
        max_len: int,
        dtype: torch.dtype | None = None,
        attention: str | None = None,
        graphs: bool = False,
        static: bool = False,
    ) -> None:
        hf = model.config
        self.model = model
        self.layers = model.model.layers
        self.n_heads = hf.num_attention_heads
        self.n_kv = getattr(hf, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // self.n_heads
        param = next(model.parameters())
        device = param.device
        dtype = dtype or param.dtype
        self.attention = attention or ("sdpa" if device.type != "cpu" else "matmul")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention={self.attention!r}: choose one of {ATTENTION}")
        inv_freq = 1.0 / (
            rope_theta(hf)
            ** (
                torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32)
                / self.head_dim
            )
        )
        freqs = torch.outer(torch.arange(max_len, device=device, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)
        # per layer: the q/k/v projections as one matmul, the MLP's gate and up projections as
        # another (copies of the weights, made once per decoder, i.e. per rollout: they are the
        # policy's current ones), and every other weight, in ``dtype`` (views in the model's own)
        self.fused = [self._fuse(layer, dtype) for layer in self.layers]
        self.weights = [self._rest(layer, dtype) for layer in self.layers]
        self.embed = model.model.embed_tokens.weight.to(dtype)
        self.norm = (model.model.norm.weight.to(dtype), _eps(model.model.norm))
        self.head = _cast(model.lm_head, dtype)
        shape = (len(self.layers), batch, self.n_kv, max_len, self.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.key_ok = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
        self.length = 0
        self.max_len = max_len
        self.device = device
        # the decode step over the whole cache (fixed shapes), replayed as a CUDA graph on a GPU
        self.graphs = graphs and device.type == "cuda"
        self.static = static or self.graphs
        self._t = torch.zeros(1, dtype=torch.long, device=device)  # the step's cache slot
        self._graph: Any = None  # the captured step of the current batch; None: capture anew
        # the last graph dropped, kept until the next capture takes over its memory pool (a pool
        # left with no graph is freed, not reused)
        self._pool_graph: Any = None
        self._stream: Any = None  # the side stream of warm-ups and captures, on ``device``
        self.graph_error: str | None = None  # why capture failed (then the step runs eagerly)

    @staticmethod
    def _rest(layer: nn.Module, dtype: torch.dtype) -> dict[str, Any]:
        """Returns a layer's norms (weight, eps) and its o/down projections (weight, bias)."""
        return {
            "ln1": (layer.input_layernorm.weight.to(dtype), _eps(layer.input_layernorm)),
            "ln2": (
                layer.post_attention_layernorm.weight.to(dtype),
                _eps(layer.post_attention_layernorm),
            ),
            "o": _cast(layer.self_attn.o_proj, dtype),
            "down": _cast(layer.mlp.down_proj, dtype),
        }

    @staticmethod
    def _fuse(
        layer: nn.Module, dtype: torch.dtype
    ) -> tuple[tuple[Tensor, Tensor | None], tuple[Tensor, Tensor | None]]:
        """Returns ((q/k/v weight, bias), (gate/up weight, bias)), each concatenated on the output
        dim; a bias is None when none of its projections has one (Llama's ``mlp_bias`` gives gate/up
        theirs)."""

        def cat(*linears: nn.Module) -> tuple[Tensor, Tensor | None]:
            weight = torch.cat([m.weight for m in linears]).to(dtype)
            if all(m.bias is None for m in linears):
                return weight, None
            return weight, torch.cat(
                [
                    m.bias if m.bias is not None else m.weight.new_zeros(m.out_features)
                    for m in linears
                ]
            ).to(dtype)

        attn, mlp = layer.self_attn, layer.mlp
        return cat(attn.q_proj, attn.k_proj, attn.v_proj), cat(mlp.gate_proj, mlp.up_proj)

    def prefill(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Returns the logits (B, V) after the left-padded prompts (B, P)."""
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        self.key_ok[:, : input_ids.shape[1]] = attention_mask.bool()
        self._next_pos = positions[:, -1] + 1
        logits = self._forward(input_ids, positions)
        self._t.fill_(self.length)
        return logits

    def step(self, tokens: Tensor) -> Tensor:
        """Returns the logits (B, V) after appending one token (B,) per row. With ``graphs`` the
        returned tensor is the graph's output: overwritten by the next step."""
        if self.length + 1 > self.max_len:
            raise ValueError(f"decoder cache of {self.max_len} tokens is full")
        if self.static:
            logits = self._replay(tokens) if self.graphs else self._static_step(tokens)
            self.length += 1
            return logits
        self.key_ok[:, self.length] = True
        positions = self._next_pos[:, None]
        self._next_pos = self._next_pos + 1
        return self._forward(tokens[:, None], positions)

    def select(self, rows: Tensor) -> None:
        """Keeps only ``rows`` (indices into the current batch)."""
        self.k = self.k[:, rows]
        self.v = self.v[:, rows]
        self.key_ok = self.key_ok[rows]
        self._next_pos = self._next_pos[rows]
        self._drop_graph()

    def repeat(self, n: int) -> None:
        """Repeats every row n times in place (after prefill: one prompt -> n samples)."""
        self.k = self.k.repeat_interleave(n, dim=1)
        self.v = self.v.repeat_interleave(n, dim=1)
        self.key_ok = self.key_ok.repeat_interleave(n, dim=0)
        self._next_pos = self._next_pos.repeat_interleave(n, dim=0)
        self._drop_graph()

    def _drop_graph(self) -> None:
        """New tensors, another batch size: the next step captures anew, into the dropped graph's
        memory pool."""
        if self._graph is not None:
            self._pool_graph = self._graph
        self._graph = None

    def _static_step(self, tokens: Tensor) -> Tensor:
        """The decode step with fixed shapes and no host value: the token goes to cache slot
        ``_t`` (a device tensor) and attends over the whole cache, slots not yet written masked
        off; ``_t`` and the positions advance in place. A CUDA graph's body (``_replay``)."""
        self.key_ok.index_fill_(1, self._t, True)
        positions = self._next_pos[:, None]
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (B, 1, 1, hd)
        mask = self.key_ok[:, None, None, :]

        def write(i: int, k: Tensor, v: Tensor) -> None:
            self.k[i].index_copy_(2, self._t, k)
            self.v[i].index_copy_(2, self._t, v)

        logits = self._layers(tokens[:, None], cos, sin, mask, write, self.max_len)
        self._next_pos.add_(1)
        self._t.add_(1)
        return logits

    def _replay(self, tokens: Tensor) -> Tensor:
        """Runs ``_static_step`` as a CUDA graph captured for the current batch (captured at the
        first step after prefill and after each compaction, see ``_capture``). A capture that
        fails, or records nothing, is said once (``graph_error``) and the steps run eagerly."""
        if self._graph is None:
            try:
                return self._capture(tokens)
            except Exception as e:  # noqa: BLE001 - eager steps give the same tokens, slower
                self.graph_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                self.graphs = False
                import warnings

                warnings.warn(
                    f"CUDA graph capture of the decode step failed ({self.graph_error}): decoding "
                    "eagerly (rollout.cuda_graphs=false skips the attempt)",
                    stacklevel=2,
                )
                return self._static_step(tokens)
        with torch.cuda.device(self.device):
            self._tokens.copy_(tokens)
            self._graph.replay()
        return self._logits

    def _capture(self, tokens: Tensor) -> Tensor:
        """Captures ``_static_step`` on the model's device and runs this step through the graph;
        returns its logits.

        On ``device``'s own side stream (a stream of another device would record nothing: the
        kernels go to the current stream of their tensors' device): a warm-up step (lazy
        initialisations such as cuBLAS workspaces), its state put back, then the capture, which
        runs nothing, into the memory pool of the graph it replaces. Not ``torch.cuda.graph``,
        whose entry synchronises the device and empties the allocator's whole cache at every
        recapture. The first replay is checked against a poisoned output, one read a capture.

        Raises:
            RuntimeError: the graph recorded nothing (its first replay left the output as it was);
                the decoder's state is then as before the step, as after any failure here.
        """
        state = (self._t.clone(), self._next_pos.clone(), self.key_ok.clone())
        self._tokens = tokens.clone()
        try:
            with torch.cuda.device(self.device):
                graph = self._record(state)
                self._logits.fill_(float("nan"))
                graph.replay()
                if bool(self._logits.isnan().all()):
                    raise RuntimeError(
                        f"the CUDA graph captured on {self.device} recorded nothing: its first "
                        "replay left its output unwritten"
                    )
        except BaseException:
            _put_back(state, (self._t, self._next_pos, self.key_ok))
            raise
        self._graph, self._pool_graph = graph, None
        return self._logits

    def _record(self, state: tuple[Tensor, ...]) -> Any:
        """Returns the graph of ``_static_step`` on ``_tokens``, captured on the side stream of
        the current device (the model's: ``_capture``); sets ``_logits``, its output."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self.device)
        side, main = self._stream, torch.cuda.current_stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            self._static_step(self._tokens)
            # the warm-up's cache slot is written again by the real step
            _put_back(state, (self._t, self._next_pos, self.key_ok))
            graph = torch.cuda.CUDAGraph()
            pool = self._pool_graph.pool() if self._pool_graph is not None else None
            graph.capture_begin(pool=pool)
            try:
                self._logits = self._static_step(self._tokens)
            finally:
                graph.capture_end()
        main.wait_stream(side)
        return graph

    def _forward(self, ids: Tensor, positions: Tensor) -> Tensor:
        bsz, s = ids.shape
        t0, t1 = self.length, self.length + s
        if t1 > self.max_len:
            raise ValueError(f"decoder cache of {self.max_len} tokens is full")
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (B, 1, S, hd)
        keys_ok = self.key_ok[:, :t1]
        if s == 1:
            mask = keys_ok[:, None, None, :]
        else:  # causal within the prompt block, padding keys masked
            causal = torch.ones(s, t1, dtype=torch.bool, device=ids.device).tril(t0)
            mask = keys_ok[:, None, None, :] & causal[None, None]
            # a fully padded query row would give NaN; let it see itself (its output is unused)
            mask = mask | torch.eye(s, t1, dtype=torch.bool, device=ids.device)[None, None]

        def write(i: int, k: Tensor, v: Tensor) -> None:
            self.k[i, :, :, t0:t1] = k
            self.v[i, :, :, t0:t1] = v

        logits = self._layers(ids, cos, sin, mask, write, t1)
        self.length = t1
        return logits

    def _layers(
        self,
        ids: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor,
        write: Any,
        t1: int,
    ) -> Tensor:
        """Returns the last position's logits of the block ``ids`` (B, S): every layer, the block's
        keys and values stored by ``write(layer, k, v)``, attention over the cache's first ``t1``
        slots under ``mask`` (B, 1, S or 1, t1)."""
        bsz, s = ids.shape
        group, scale = self.n_heads // self.n_kv, self.head_dim**-0.5
        # (B, 1, 1, S, t1): broadcast over KV heads and the group; built once for every layer
        masked = ~mask[:, :, None]
        nq, nk = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        h = torch.nn.functional.embedding(ids, self.embed)
        for i, layer in enumerate(self.layers):
            (qkv_w, qkv_b), (gate_up_w, gate_up_b) = self.fused[i]
            w = self.weights[i]
            x = rms_norm(h, *w["ln1"])
            qkv = torch.nn.functional.linear(x, qkv_w, qkv_b)  # (B, S, (heads + 2 kv) · hd)
            # RoPE over q and k in one pass: (B, heads + kv, S, hd)
            qk = (
                qkv[..., : nq + nk]
                .view(bsz, s, self.n_heads + self.n_kv, self.head_dim)
                .transpose(1, 2)
            )
            qk = qk * cos + rotate_half(qk) * sin
            q, k = qk[:, : self.n_heads], qk[:, self.n_heads :]
            v = qkv[..., nq + nk :].view(bsz, s, self.n_kv, self.head_dim).transpose(1, 2)
            write(i, k, v)
            if self.attention == "sdpa":  # a GPU's fused kernel, the query heads grouped over kv
                o = grouped_sdpa(q, self.k[i, :, :, :t1], self.v[i, :, :, :t1], mask, scale)
            else:
                # grouped-query attention as two batched matmuls: the query heads of one KV head
                # are stacked, so the cache is read once and never repeated (SDPA's CPU kernels
                # were 10x slower here on a strided cache with a boolean mask)
                qg = q.reshape(bsz, self.n_kv, group * s, self.head_dim)
                scores = qg @ self.k[i, :, :, :t1].transpose(-1, -2) * scale  # (B, kv, g·S, t1)
                scores = scores.view(bsz, self.n_kv, group, s, t1)
                scores = scores.masked_fill(masked, float("-inf"))
                probs = scores.softmax(-1).view(bsz, self.n_kv, group * s, t1)
                o = (probs @ self.v[i, :, :, :t1]).view(bsz, self.n_heads, s, self.head_dim)
            h = h + torch.nn.functional.linear(o.transpose(1, 2).reshape(bsz, s, -1), *w["o"])
            x = rms_norm(h, *w["ln2"])
            gate, up = torch.nn.functional.linear(x, gate_up_w, gate_up_b).chunk(2, dim=-1)
            h = h + torch.nn.functional.linear(layer.mlp.act_fn(gate) * up, *w["down"])
        h = rms_norm(h[:, -1], *self.norm)
        return torch.nn.functional.linear(h, *self.head)


def grouped_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Returns grouped-query attention (B, heads, S, d) of ``q`` (B, heads, S, d) over ``k`` and
    ``v`` (B, kv, T, d) under the boolean ``mask`` (B, 1, S or 1, T), through SDPA with each KV
    head's query heads folded into the query length, (B, kv, g·S, d), as the matmul path does.

    Not SDPA's ``enable_gqa``: with a mask only its math kernel takes it (the memory-efficient one,
    the fused kernel for a mask, has no GQA), which repeats the keys and values g times in float32:
    the whole cache, every layer and step.
    """
    bsz, heads, s, d = q.shape
    kv = k.shape[1]
    group = heads // kv
    if mask.shape[-2] > 1:  # a mask row per query position, the same for each head of a group
        mask = (
            mask[:, :, None]
            .expand(-1, -1, group, -1, -1)
            .reshape(bsz, -1, group * s, mask.shape[-1])
        )
    o = torch.nn.functional.scaled_dot_product_attention(
        q.reshape(bsz, kv, group * s, d), k, v, attn_mask=mask, scale=scale
    )
    return o.reshape(bsz, heads, s, d)


def cache_keyword(model: nn.Module) -> str:
    """Returns the keyword by which ``model``'s forward takes its KV cache: ``cache`` in recent
    transformers (5.24 has it and deprecates ``past_key_values``, to be removed in 5.40),
    ``past_key_values`` in older ones."""
    return (
        "cache"
        if "cache" in inspect.signature(type(model).forward).parameters
        else "past_key_values"
    )


class HFDecoder:
    """Any HF causal LM through its own forward and a DynamicCache (the general, slower path)."""

    def __init__(self, model: nn.Module, batch: int, max_len: int) -> None:
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache()
        self.mask: Tensor | None = None
        self.max_len = max_len
        self.cache_kw = cache_keyword(model)

    def prefill(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Returns the logits (B, V) after the left-padded prompts (B, P)."""
        self.mask = attention_mask.long()
        positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        self._next_pos = positions[:, -1] + 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=positions,
            use_cache=True,
            **{self.cache_kw: self.cache},
        )
        return out.logits[:, -1]

    def step(self, tokens: Tensor) -> Tensor:
        """Returns the logits (B, V) after appending one token (B,) per row."""
        assert self.mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self._next_pos[:, None],
            use_cache=True,
            **{self.cache_kw: self.cache},
        )
        self._next_pos = self._next_pos + 1
        return out.logits[:, -1]

    def select(self, rows: Tensor) -> None:
        """Keeps only ``rows`` (indices into the current batch)."""
        assert self.mask is not None
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self._next_pos = self._next_pos[rows]

    def repeat(self, n: int) -> None:
        """Repeats every row n times in place (after prefill: one prompt -> n samples)."""
        assert self.mask is not None
        self.cache.batch_repeat_interleave(n)
        self.mask = self.mask.repeat_interleave(n, dim=0)
        self._next_pos = self._next_pos.repeat_interleave(n, dim=0)


def make_decoder(
    model: nn.Module,
    batch: int,
    max_len: int,
    fast: bool = True,
    dtype: torch.dtype | None = None,
    graphs: bool = False,
) -> FastDecoder | HFDecoder:
    """Returns the fast decoder in ``dtype`` when the model supports it (and ``fast``; its decode
    step a CUDA graph with ``graphs`` on a GPU), else HF's (in the model's own dtype)."""
    if fast and supports_fast_path(model):
        return FastDecoder(model, batch, max_len, dtype=dtype, graphs=graphs)
    return HFDecoder(model, batch, max_len)


def _put_back(saved: tuple[Tensor, ...], into: tuple[Tensor, ...]) -> None:
    """Copies each saved tensor back into its live one, in place (a graph keeps their addresses)."""
    for now, before in zip(into, saved, strict=True):
        now.copy_(before)


def _eps(norm: nn.Module) -> float:
    """An RMSNorm module's epsilon (``variance_epsilon`` in transformers' Qwen2 and Llama)."""
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def _cast(linear: nn.Module, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """A linear layer's (weight, bias) in ``dtype`` (the same tensors where it already is)."""
    bias = linear.bias.to(dtype) if linear.bias is not None else None
    return linear.weight.to(dtype), bias
