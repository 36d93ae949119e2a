"""Training-time forward passes over (prompt, response) rows: log-probs, entropy, values.

Rows are the sampler's layout: prompts left-padded to P, responses right-padded to T. A
micro-batch is trimmed to its own longest prompt and response before the forward pass, so short
rows do not pay for the batch's longest. The logits at position P−1+t predict response token t;
the critic's value there is V(s_t), the value of the state before token t.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vapo_lab.algo import entropy_from_logits, token_logprobs


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

    def sequence(self) -> tuple[Tensor, Tensor]:
        """Returns (input_ids, attention_mask) of prompt ++ response, (B, P+T)."""
        return (torch.cat([self.prompt_ids, self.response_ids], 1),
                torch.cat([self.prompt_mask, self.response_mask], 1))


def policy_forward(model: nn.Module, rows: Rows, temperature: float = 1.0,
                   with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """Returns (log-probs of the response tokens (B, T), entropy (B, T) or None).

    Logits are divided by ``temperature`` so that the ratio to the sampler's log-probs is exact.
    Only the response positions go through the LM head (a P-fold saving for long prompts). The
    entropy carries gradients only with ``entropy_grad`` (an entropy bonus); as a metric it is
    computed from detached logits, so the backward pass does not go through it.
    """
    ids, mask = rows.sequence()
    p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    hidden = model.model(input_ids=ids, attention_mask=mask.long(), position_ids=positions).last_hidden_state
    logits = model.lm_head(hidden[:, p - 1:p - 1 + t]).float()
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = token_logprobs(logits, rows.response_ids)
    entropy = entropy_from_logits(logits if entropy_grad else logits.detach()) if with_entropy else None
    return logprobs, entropy


def value_forward(critic: nn.Module, rows: Rows) -> Tensor:
    """Returns V(s_t) for each response token, (B, T)."""
    ids, mask = rows.sequence()
    p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    return critic(ids, mask.long())[:, p - 1:p - 1 + t]
