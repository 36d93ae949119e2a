"""Language-model terms: VAPO's positive-example NLL loss, entropy and token log-probs."""

from __future__ import annotations

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


def token_logprobs_and_entropy(logits: Tensor, tokens: Tensor, entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
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
