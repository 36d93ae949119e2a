"""Training-time forward passes over (prompt, response) rows: log-probs, entropy, values.

Rows are the sampler's layout: prompts left-padded to P, responses right-padded to T. A
micro-batch is trimmed to its own longest prompt and response before the forward pass, so short
rows do not pay for the batch's longest. The logits at position P−1+t predict response token t;
the critic's value there is V(s_t), the value of the state before token t.

Qwen2/Llama models run the packed forward of :mod:`vapo_lab.models.packed` (only the valid
tokens, each distinct prompt once); other models, and sharded ones, run Hugging Face's padded one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vapo_lab.algo import token_logprobs, token_logprobs_and_entropy
from vapo_lab.distributed.fsdp import is_sharded
from vapo_lab.models.packed import packed_states, prompt_groups
from vapo_lab.models.precision import autocast
from vapo_lab.models.value import wide


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

    def to(self, device: torch.device) -> Rows:
        """Returns the rows on ``device`` (themselves where they already are)."""
        if self.prompt_ids.device == device:
            return self
        return Rows(self.prompt_ids.to(device), self.prompt_mask.to(device), self.response_ids.to(device),
                    self.response_mask.to(device))

    def sequence(self) -> tuple[Tensor, Tensor]:
        """Returns (input_ids, attention_mask) of prompt ++ response, (B, P+T)."""
        return (torch.cat([self.prompt_ids, self.response_ids], 1),
                torch.cat([self.prompt_mask, self.response_mask], 1))


def model_device(model: nn.Module) -> torch.device:
    """Returns the device ``model``'s parameters (a sharded model's local shards) are on."""
    return next(model.parameters()).device


def _groups(decoder: nn.Module, rows: Rows) -> tuple[Tensor, Tensor] | None:
    """``prompt_groups`` of ``rows``: the packed path's prompt grouping, or None for HF's padded forward."""
    return prompt_groups(decoder, rows.prompt_ids, rows.prompt_mask, rows.response_mask)


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
    rows = rows.to(model_device(model))
    with autocast(model):
        return _policy_forward(model, rows, temperature, with_entropy, entropy_grad)


def _policy_forward(model: nn.Module, rows: Rows, temperature: float, with_entropy: bool, entropy_grad: bool
                    ) -> tuple[Tensor, Tensor | None]:
    groups = None if is_sharded(model) else _groups(model.model, rows)
    if groups is not None:
        mask = rows.response_mask
        logits = wide(model.lm_head(packed_states(model.model, rows.response_ids, rows.response_mask, groups)))
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
    rows = rows.to(model_device(critic))
    with autocast(critic):
        return _value_forward(critic, rows)


def _value_forward(critic: nn.Module, rows: Rows) -> Tensor:
    backbone = getattr(critic, "backbone", None)
    groups = (_groups(backbone, rows) if backbone is not None and hasattr(critic, "head") and not is_sharded(critic)
              else None)
    if groups is not None:
        values = wide(critic.head(packed_states(backbone, rows.response_ids, rows.response_mask, groups)).squeeze(-1))
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
    """Returns the response log-probs of ``model`` for all rows, (B, T), on the rows' device, ``micro``
    rows at a time, after ``extra`` discarded passes on a dummy row (a sharded model's ranks make
    equal passes)."""
    t, device = rows.response_ids.shape[1], rows.prompt_ids.device
    for _ in range(extra):
        policy_forward(model, Rows.dummy(device), temperature)
    parts = [policy_forward(model, rows.take(i), temperature)[0].to(device)
             for i in torch.arange(len(rows.response_ids)).split(micro)]
    _reshard(model)
    if not parts:
        return torch.zeros(0, t, device=device)
    return torch.cat([torch.nn.functional.pad(p, (0, t - p.shape[1])) for p in parts])


@torch.no_grad()
def batched_values(critic: nn.Module, rows: Rows, micro: int, extra: int = 0) -> Tensor:
    """Returns V(s_t) for all rows, (B, T), on the rows' device, computed ``micro`` rows at a time
    (``extra``: as ``batched_logprobs``)."""
    width, device = rows.response_ids.shape[1], rows.prompt_ids.device
    for _ in range(extra):
        value_forward(critic, Rows.dummy(device))
    parts = [value_forward(critic, rows.take(idx)).to(device)
             for idx in torch.arange(len(rows.response_ids)).split(micro)]
    _reshard(critic)
    if not parts:
        return torch.zeros(0, width, device=device)
    return torch.cat([torch.nn.functional.pad(v, (0, width - v.shape[1])) for v in parts])
