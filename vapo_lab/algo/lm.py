"""Language-model terms: VAPO's positive-example NLL loss, entropy and token log-probs."""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from vapo_lab.algo.masked import masked_mean, masked_sum


def positive_nll_loss(
    logprobs: Tensor,
    response_mask: Tensor,
    correct: Tensor,
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Negative log-likelihood of the tokens of correct responses (VAPO positive-example LM loss).

    VAPO's `positive_lm_loss` (self-imitation, after SIL) adds μ·L_NLL with μ = 0.1 (the trainer
    applies μ), L_NLL = −Σ_{b correct} Σ_t log π(y_{b,t})·m_{b,t} / N.

    Args:
        logprobs: log π(y_t) under the current policy, shape (B, T), with gradient.
        response_mask: (B, T) bool or float {0, 1} mask of valid tokens.
        correct: (B,) bool, True for responses the verifier graded correct.
        normalizer: optional N; default the number of valid tokens in correct responses. Pass the
            mini-batch's N to every micro-batch so the micro-batch losses sum to the unsplit loss.

    Returns:
        0-dim loss. With no correct tokens it is 0, still connected to `logprobs`' graph so that
        backward runs (and gives zero gradient).
    """
    positive = response_mask.bool() & correct.bool().unsqueeze(-1)  # valid tokens of correct rows
    total = -masked_sum(logprobs, positive)  # −Σ log π·m over correct responses
    if normalizer is None:
        count = positive.sum().to(logprobs.dtype)
    else:
        count = torch.as_tensor(normalizer, dtype=logprobs.dtype, device=logprobs.device)
    # Divide by 1 where N = 0 (then the sum is 0 too), so the value and gradient stay finite.
    safe_count = torch.where(count > 0, count, torch.ones_like(count))
    loss = total / safe_count  # L = −Σ log π·m / N
    # The zero branch still leaves the result in logprobs' graph (torch.where keeps grad_fn).
    return torch.where(count > 0, loss, torch.zeros_like(loss))


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution softmax(logits) at every position.

    Args:
        logits: z, shape (B, T, V).

    Returns:
        H = logsumexp(z) − Σ_v softmax(z)_v·z_v, shape (B, T). Both terms are computed on
        z − max(z) (H is shift-invariant), so large logits neither overflow nor cancel; logits of
        −inf (masked vocabulary) contribute 0 instead of 0·(−inf) = nan.
    """
    # Shifting by the (detached) max leaves H and its gradient unchanged but keeps both terms
    # O(log V): with logits near 1000 they would otherwise cancel to float32 noise.
    shifted = logits - logits.amax(dim=-1, keepdim=True).detach()
    probs = torch.softmax(shifted, dim=-1)
    # p = 0 where z = −inf; zero those z so that p·z is 0 and no nan reaches the gradient.
    finite = torch.where(probs > 0, shifted, torch.zeros_like(shifted))
    return torch.logsumexp(shifted, dim=-1) - (probs * finite).sum(dim=-1)  # H = lse(z) − Σ p·z


def masked_entropy(logits: Tensor, response_mask: Tensor) -> Tensor:
    """Mean next-token entropy over valid tokens (VAPO Figure 2c, generation entropy).

    Args:
        logits: z, shape (B, T, V).
        response_mask: (B, T) bool or float {0, 1} mask of valid tokens.

    Returns:
        0-dim tensor; 0 if no token is valid.
    """
    return masked_mean(entropy_from_logits(logits), response_mask)


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-probability of each given token under softmax(logits).

    Args:
        logits: z, shape (B, T, V).
        tokens: token ids y, shape (B, T), long.

    Returns:
        log π(y_t) = z_{y_t} − logsumexp(z), shape (B, T).
    """
    # Gather then subtract, instead of a full log_softmax: no second (B, T, V) tensor.
    chosen = torch.gather(logits, -1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)  # log π(y) = z_y − lse(z)


def token_logprobs_and_entropy(
    logits: Tensor, tokens: Tensor, entropy_grad: bool = False
) -> tuple[Tensor, Tensor]:
    """Returns (log π(y_t), entropy H_t), each (B, T), from one log-softmax over the vocabulary.

    The same values as ``token_logprobs`` and ``entropy_from_logits`` (to float rounding) in about
    half the passes over the (B, T, V) logits, which dominate a small model's training step: H is
    −Σ_v p_v·log p_v with log p = log_softmax(z), computed without gradient unless
    ``entropy_grad`` (then through ``entropy_from_logits``). Positions with −inf logits, where
    p·log p is 0·(−inf), are recomputed with ``entropy_from_logits``, which handles them.

    Args:
        logits: z, shape (B, T, V).
        tokens: token ids y, shape (B, T), long.
        entropy_grad: whether H carries gradients (an entropy bonus in the loss).
    """
    logp = torch.log_softmax(logits, dim=-1)
    chosen = torch.gather(logp, -1, tokens.long().unsqueeze(-1)).squeeze(-1)  # log π(y)
    if entropy_grad:
        return chosen, entropy_from_logits(logits)
    with torch.no_grad():
        lq = logp.detach()
        entropy = -(lq.exp() * lq).sum(dim=-1)  # H = −Σ p·log p
        bad = torch.isnan(entropy)
        if bad.any():  # −inf logits: 0·(−inf)
            entropy[bad] = entropy_from_logits(logits.detach()[bad])
    return chosen, entropy


# The (chunk, V) float32 logits of one chunk take at most this many bytes: 256 MiB is 441 tokens
# at Qwen2's V = 152,064, small beside a GPU's memory and still a GEMM of hundreds of rows.
CHUNK_LOGIT_BYTES = 1 << 28


def default_chunk_tokens(vocab: int) -> int:
    """Returns how many tokens ``head_logprobs_and_entropy`` takes at once by default.

    c = max(1, ⌊2^28 / (4·V)⌋): one chunk's float32 logits, 4·c·V bytes, stay within 256 MiB
    (``CHUNK_LOGIT_BYTES``); the pass holds two such buffers at its peak.
    """
    return max(1, CHUNK_LOGIT_BYTES // (4 * max(vocab, 1)))  # 4·c·V ≤ 2^28


def weight_block_rows(chunk: int, vocab: int, hidden: int, compute_bytes: int) -> int:
    """Returns how many rows of ∂L/∂W the chunked backward adds at once when it computes in a dtype
    narrower than float32: r = max(1, ⌊4·c·V / ((p + 4)·h)⌋), so that the block's product in the
    compute dtype and its float32 copy, (p + 4)·r·h bytes, take no more than one chunk's float32
    logits, 4·c·V."""
    # (p + 4)·r·h ≤ 4·c·V
    return max(1, (4 * chunk * vocab) // ((compute_bytes + 4) * max(hidden, 1)))


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """Returns the dtype nn.Linear would compute hidden @ Wᵀ in: the autocast dtype of hidden's
    device where autocast is on (it leaves float64 alone), else the promoted dtype of the two."""
    device = hidden.device.type
    if _autocast_on(device) and torch.float64 not in (hidden.dtype, weight.dtype):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _autocast_on(device: str) -> bool:
    """Returns whether autocast is on for ``device`` (never for a device type autocast does not
    know: "meta", where shapes alone are computed)."""
    try:
        return torch.is_autocast_enabled(device)
    except RuntimeError:
        return False


def _no_autocast(device: str) -> contextlib.AbstractContextManager[None]:
    """Returns a context with autocast off for ``device`` (nothing to turn off on a type it does not
    know)."""
    try:
        return torch.autocast(device, enabled=False)
    except RuntimeError:
        return contextlib.nullcontext()


def _chunk_logits(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, temperature: float
) -> Tensor:
    """Returns one chunk's logits z = (h·Wᵀ + b) / τ, (c, V), at least float32.

    ``hidden``, ``weight`` and ``bias`` are already in the compute dtype: the matmul is nn.Linear's
    (the same F.linear autocast would run), its result widened as the trainer widens logits.
    """
    z = torch.nn.functional.linear(hidden, weight, bias)  # z = h·Wᵀ + b
    if z.element_size() < 4:  # bf16/fp16 logits, widened to float32 (float64 stays float64)
        z = z.float()
    if temperature != 1.0:
        z.div_(temperature)  # z / τ, in place: no second (c, V) buffer
    return z


class _HeadLogprobs(torch.autograd.Function):
    """log π(y) and H from the LM head, chunk by chunk; see ``head_logprobs_and_entropy``.

    Saves hidden, W, b, y and the per-token lse (and H); backward recomputes each chunk's logits.
    The matmuls run in ``dtype`` with autocast off on explicitly cast inputs: what
    ``torch.amp.custom_fwd(cast_inputs=dtype)`` / ``custom_bwd`` do, with the device type taken from
    the input rather than fixed when the class is defined.
    """

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, tokens, temperature, with_entropy, entropy_grad, chunk, dtype
    ):
        device = hidden.device.type
        n, vocab = hidden.shape[0], weight.shape[0]
        # the widened logits' dtype
        out = torch.float64 if dtype == torch.float64 else torch.float32
        logprobs = hidden.new_empty(n, dtype=out)
        lse = hidden.new_empty(n, dtype=out)
        entropy = hidden.new_empty(n, dtype=out) if with_entropy else None
        with _no_autocast(device):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            for start in range(0, n, chunk):
                rows = slice(start, min(start + chunk, n))
                z = _chunk_logits(hidden[rows].to(dtype), w, b, temperature)
                top = z.amax(dim=-1, keepdim=True)
                z.sub_(top)  # z − max(z): exp cannot overflow
                chosen = z.gather(-1, tokens[rows].unsqueeze(-1))  # z_y − max
                # without H, exp in place: one (c, V) buffer; with it, z − max is still needed
                e = torch.exp(z) if with_entropy else z.exp_()
                total = e.sum(dim=-1, keepdim=True)
                log_sum = torch.log(total)
                # log_softmax's order: (z_y − max) − log Σ exp(z − max)
                logprobs[rows] = (chosen - log_sum).squeeze(-1)  # log π(y) = z_y − lse(z)
                lse[rows] = (top + log_sum).squeeze(-1)  # lse(z) = max + log Σ exp(z − max)
                if with_entropy:
                    z.sub_(log_sum)  # log p
                    e.div_(total)  # p = softmax(z)
                    entropy[rows] = -e.mul_(z).sum(dim=-1)  # H = −Σ p·log p = lse(z) − Σ p·z
                del z, e
        saved = [hidden, weight, tokens, lse]
        if bias is not None:
            saved.append(bias)
        if with_entropy and entropy_grad:
            saved.append(entropy)
        ctx.save_for_backward(*saved)
        ctx.has_bias, ctx.entropy_grad = bias is not None, with_entropy and entropy_grad
        ctx.temperature, ctx.chunk, ctx.dtype, ctx.vocab = temperature, chunk, dtype, vocab
        if with_entropy and not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, tokens, lse, *rest = ctx.saved_tensors
        bias = rest.pop(0) if ctx.has_bias else None
        entropy = rest.pop(0) if ctx.entropy_grad else None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        tau, dtype, n = ctx.temperature, ctx.dtype, hidden.shape[0]
        # W and b gradients accumulate here
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        grad_hidden = torch.zeros_like(hidden) if need_h else None
        grad_weight = torch.zeros_like(weight, dtype=acc) if need_w else None
        grad_bias = torch.zeros(ctx.vocab, dtype=acc, device=hidden.device) if need_b else None
        with _no_autocast(hidden.device.type):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            for start in range(0, n, ctx.chunk):
                rows = slice(start, min(start + ctx.chunk, n))
                h = hidden[rows].to(dtype)
                z = _chunk_logits(h, w, b, tau)
                z.sub_(lse[rows].unsqueeze(-1))  # log p = z − lse(z)
                g_lp = grad_logprobs[rows].unsqueeze(-1)
                if entropy is not None:
                    p = torch.exp(z)
                    # ∂H/∂z = −p ⊙ (log p + H): fold with ∂log π(y)/∂z = onehot(y) − p into
                    # ∂L/∂z = g_lp·onehot(y) − p ⊙ (g_lp + g_H·(log p + H))
                    z.add_(entropy[rows].unsqueeze(-1)).mul_(grad_entropy[rows].unsqueeze(-1)).add_(
                        g_lp
                    )
                    grad_z = z.mul_(p).neg_()
                    del p
                else:
                    grad_z = z.exp_().mul_(g_lp).neg_()  # −g_lp·p, in place: one (c, V) buffer
                del z
                grad_z.scatter_add_(-1, tokens[rows].unsqueeze(-1), g_lp)  # + g_lp·onehot(y)
                if tau != 1.0:
                    grad_z.div_(tau)  # z = (h·Wᵀ + b) / τ: ∂L/∂(h·Wᵀ + b) = ∂L/∂z / τ
                g = grad_z.to(dtype)
                del grad_z
                if need_h:
                    grad_hidden[rows] = g @ w  # ∂L/∂h = ∂L/∂z · W
                if need_w and g.dtype == acc:
                    grad_weight.addmm_(g.t(), h)  # ∂L/∂W = Σ_chunks ∂L/∂zᵀ · h
                elif need_w:
                    # The same, each chunk's share computed in the compute dtype and summed in
                    # float32, a block of vocabulary rows at a time: on CPU a mixed-dtype add_
                    # copies its whole operand to float32 first, (V, h) of it at once.
                    block = weight_block_rows(
                        min(ctx.chunk, n), ctx.vocab, hidden.shape[1], g.element_size()
                    )
                    for v0 in range(0, ctx.vocab, block):
                        # ∂L/∂W_v += ∂L/∂z_vᵀ · h
                        grad_weight[v0 : v0 + block].add_(g[:, v0 : v0 + block].t() @ h)
                if need_b:
                    # ∂L/∂b = Σ_tokens ∂L/∂z, summed in float32
                    grad_bias.add_(g.sum(dim=0, dtype=acc))
                del g  # before the next chunk's logits are recomputed
        if need_w:
            grad_weight = grad_weight.to(weight.dtype)
        if need_b:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None


def head_logprobs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    tokens: Tensor,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = True,
    entropy_grad: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Returns (log π(y) (N,), entropy H (N,) or None) from the LM head, never holding the (N, V)
    logits.

    z = (h·Wᵀ + b) / τ, log π(y) = z_y − lse(z), H = lse(z) − Σ_v p_v·z_v with p = softmax(z): the
    values of ``token_logprobs_and_entropy(wide(lm_head(hidden)) / τ, tokens)`` (to float
    rounding), computed ``chunk_tokens`` tokens at a time. Only hidden, W, b, y, lse(z) (and H) are
    kept for backward, which recomputes each chunk's logits:

        ∂log π(y)/∂z = onehot(y) − p,   ∂H/∂z = −p ⊙ (log p + H),
        ∂L/∂h = (∂L/∂z · W) / τ,        ∂L/∂W = Σ_chunks (∂L/∂z)ᵀ · h / τ  (summed in float32).

    Peak memory is two (chunk, V) float32 buffers (plus, under autocast, W in the compute dtype)
    instead of about four (N, V) ones. The matmul runs as nn.Linear would: in the autocast dtype of
    hidden's device where autocast is on, its logits widened to float32; lse is max-shifted, so
    large logits give no inf or nan. Logits of −inf (vocabulary masking) are not supported.

    Args:
        hidden: final hidden states h, (N, H), any float dtype.
        weight: the LM head's W, (V, H) (float32 master weights under autocast).
        tokens: token ids y, (N,), long.
        bias: the head's b, (V,), or None (Qwen2 and Llama have none).
        temperature: τ > 0, the sampler's temperature.
        with_entropy: whether to compute H (else None is returned for it).
        entropy_grad: whether H carries gradients (an entropy bonus); otherwise H is detached.
        chunk_tokens: tokens per chunk; default ``default_chunk_tokens(V)`` (256 MiB of logits).

    Returns:
        (log π(y), H or None), each (N,), float32 (float64 for float64 inputs); empty for N = 0.
    """
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(
            f"chunk_tokens={chunk_tokens!r} is below 1; pass a positive count, or None for "
            f"default_chunk_tokens(V)."
        )
    if temperature <= 0:
        raise ValueError(f"temperature={temperature!r} is not positive; logits are divided by it.")
    chunk = chunk_tokens or default_chunk_tokens(weight.shape[0])
    dtype = _compute_dtype(hidden, weight)
    return _HeadLogprobs.apply(
        hidden,
        weight,
        bias,
        tokens.long(),
        float(temperature),
        with_entropy,
        entropy_grad,
        chunk,
        dtype,
    )
