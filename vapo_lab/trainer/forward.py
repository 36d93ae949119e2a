"""Training-time forward passes over (prompt, response) rows: log-probs, entropy, values.

Rows are left-padded prompts (P) and right-padded responses (T); the logits at P−1+t predict
response token t, where the critic's value is V(s_t). Qwen2/Llama models run the packed forward
(valid tokens only, each prompt once); others Hugging Face's padded one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vapo_lab.algo.lm import head_logprobs_and_entropy
from vapo_lab.distributed.fsdp import as_forward, is_sharded
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
        return Rows(
            self.prompt_ids[index][:, width - p :],
            pm[:, width - p :],
            self.response_ids[index][:, :t],
            rm[:, :t],
        )

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
        return Rows(
            self.prompt_ids.to(device),
            self.prompt_mask.to(device),
            self.response_ids.to(device),
            self.response_mask.to(device),
        )

    def sequence(self) -> tuple[Tensor, Tensor]:
        """Returns (input_ids, attention_mask) of prompt ++ response, (B, P+T)."""
        return (
            torch.cat([self.prompt_ids, self.response_ids], 1),
            torch.cat([self.prompt_mask, self.response_mask], 1),
        )


def model_device(model: nn.Module) -> torch.device:
    """Returns the device ``model``'s parameters (a sharded model's local shards) are on."""
    return next(model.parameters()).device


def _groups(decoder: nn.Module, rows: Rows) -> tuple[Tensor, Tensor] | None:
    """``prompt_groups`` of ``rows``: the packed path's prompt grouping, or None for HF's padded
    forward."""
    return prompt_groups(decoder, rows.prompt_ids, rows.prompt_mask, rows.response_mask)


def _unpack(packed: Tensor, mask: Tensor) -> Tensor:
    """Returns the (B, T) tensor with ``packed`` (N,) at the valid positions of ``mask`` and 0
    elsewhere."""
    return packed.new_zeros(mask.shape).masked_scatter(mask, packed)


def policy_forward(
    model: nn.Module,
    rows: Rows,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Returns (log-probs of the response tokens (B, T), entropy (B, T) or None); 0 at padding
    on the packed path, any finite value there on Hugging Face's.

    Logits are divided by ``temperature`` so that the ratio to the sampler's log-probs is exact.
    Only the response positions go through the LM head (a P-fold saving for long prompts), and on
    the packed path (:func:`packed_states`: Qwen2/Llama, sharded or not) only their valid tokens.
    The entropy carries gradients only with ``entropy_grad`` (an entropy bonus); as a metric it is
    computed from detached logits, so the backward pass does not go through it. A sharded model's
    pass runs inside its FSDP2 hooks (``as_forward``), its own forward or not.
    """
    rows = rows.to(model_device(model))
    groups = _groups(model.model, rows)
    with autocast(model):
        return as_forward(
            model, _policy_pass, model, rows, groups, temperature, with_entropy, entropy_grad
        )


def _policy_pass(
    model: nn.Module,
    rows: Rows,
    groups: tuple[Tensor, Tensor] | None,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    mask = rows.response_mask
    if groups is not None:
        # (N, H): valid tokens only
        hidden = packed_states(model.model, rows.response_ids, mask, groups)
        tokens = rows.response_ids[mask]
    else:
        ids, seq_mask = rows.sequence()
        p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
        positions = (seq_mask.long().cumsum(-1) - 1).clamp(min=0)
        states = model.model(
            input_ids=ids, attention_mask=seq_mask.long(), position_ids=positions
        ).last_hidden_state
        # (B·T, H): every position
        hidden = states[:, p - 1 : p - 1 + t].reshape(-1, states.shape[-1])
        tokens = rows.response_ids.reshape(-1)
    logprobs, entropy = _head_logprobs(
        model, hidden, tokens, temperature, with_entropy, entropy_grad
    )
    if groups is not None:
        return _unpack(logprobs, mask), (_unpack(entropy, mask) if entropy is not None else None)
    # new tensors, not views: FSDP2 hooks the backward pass on a sharded model's outputs
    shape = rows.response_ids.shape
    return logprobs.view(shape).clone(), (
        entropy.view(shape).clone() if entropy is not None else None
    )


def _head_logprobs(
    model: nn.Module,
    hidden: Tensor,
    tokens: Tensor,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
) -> tuple[Tensor, Tensor | None]:
    """Returns (log π(y) (N,), entropy (N,) or None) of the LM head over the states ``hidden`` (N,
    H), a chunk of tokens at a time (``head_logprobs_and_entropy``): the (N, V) logits never
    exist."""
    head = model.lm_head
    return head_logprobs_and_entropy(
        hidden, head.weight, tokens, head.bias, temperature, with_entropy, entropy_grad
    )


def value_forward(critic: nn.Module, rows: Rows) -> Tensor:
    """Returns V(s_t) for each response token, (B, T); 0 at padding on the packed path."""
    rows = rows.to(model_device(critic))
    backbone = getattr(critic, "backbone", None)
    groups = _groups(backbone, rows) if backbone is not None and hasattr(critic, "head") else None
    with autocast(critic):
        if groups is None:
            ids, mask = rows.sequence()
            p, t = rows.prompt_ids.shape[1], rows.response_ids.shape[1]
            return critic(ids, mask.long())[:, p - 1 : p - 1 + t]
        return as_forward(critic, _packed_values, critic, rows, groups)


def _packed_values(critic: nn.Module, rows: Rows, groups: tuple[Tensor, Tensor]) -> Tensor:
    states = packed_states(critic.backbone, rows.response_ids, rows.response_mask, groups)
    return _unpack(wide(critic.head(states).squeeze(-1)), rows.response_mask)


def _reshard(model: nn.Module) -> None:
    """Frees a sharded model's gathered parameters after passes without a backward: FSDP2 keeps the
    root's gathered until its backward, and while gathered, ``parameters()`` are the whole
    temporary tensors, not the shards an optimiser or a checkpoint must see."""
    if is_sharded(model):
        model.reshard()


def row_tokens(rows: Rows) -> Tensor:
    """Returns each row's valid prompt and response tokens, (B,) long."""
    return rows.prompt_mask.sum(-1) + rows.response_mask.sum(-1)


def token_micro_batches(
    index: Tensor, rows: Rows, budget: int, by_length: bool = True
) -> list[Tensor]:
    """Returns the rows ``index`` of ``rows`` in micro-batches of at most ``budget`` tokens each,
    counted in the layout a pass runs a micro-batch in (``Rows.take``): rows x (longest prompt +
    longest response). One micro-batch where all fit; else the rows sorted by their own tokens
    (stable) and filled greedily in that order, so like lengths share a micro-batch and little is
    padding. A row longer than ``budget`` is a micro-batch alone. As verl's dynamic batch size
    (``ppo_max_token_len_per_gpu``): a micro-batch holds many short responses or one long one.
    ``by_length=False`` fills them in ``index``'s order (micro-batches that are optimiser steps)."""
    if len(index) == 0:
        return []
    p_len, r_len = rows.prompt_mask[index].sum(-1), rows.response_mask[index].sum(-1)
    if len(index) * int(p_len.max() + r_len.max()) <= budget:
        return [index]
    order = (
        torch.sort(p_len + r_len, stable=True).indices if by_length else torch.arange(len(index))
    )
    parts, start, longest_p, longest_r = [], 0, 0, 0
    for i, (p, r) in enumerate(zip(p_len[order].tolist(), r_len[order].tolist())):
        wide_p, wide_r = max(longest_p, p), max(longest_r, r)
        if i > start and (i - start + 1) * (wide_p + wide_r) > budget:
            parts.append(index[order[start:i]])
            start, wide_p, wide_r = i, p, r
        longest_p, longest_r = wide_p, wide_r
    parts.append(index[order[start:]])
    return parts


@torch.no_grad()
def batched_logprobs(
    model: nn.Module, rows: Rows, micros: list[Tensor], temperature: float, extra: int = 0
) -> Tensor:
    """Returns the response log-probs of ``model`` for all rows, (B, T), on the rows' device, one
    pass per micro-batch of ``micros`` (``token_micro_batches``), after ``extra`` discarded passes
    on a dummy row (a sharded model's ranks make equal passes)."""
    device = rows.prompt_ids.device
    parts = []
    for _ in range(extra):
        policy_forward(model, Rows.dummy(device), temperature)
    for idx in micros:
        parts.append(policy_forward(model, rows.take(idx), temperature)[0].to(device))
    _reshard(model)
    return _scatter(parts, micros, rows)


@torch.no_grad()
def batched_values(critic: nn.Module, rows: Rows, micros: list[Tensor], extra: int = 0) -> Tensor:
    """Returns V(s_t) for all rows, (B, T), on the rows' device, one pass per micro-batch of
    ``micros`` (``extra``: as ``batched_logprobs``)."""
    device = rows.prompt_ids.device
    parts = []
    for _ in range(extra):
        value_forward(critic, Rows.dummy(device))
    for idx in micros:
        parts.append(value_forward(critic, rows.take(idx)).to(device))
    _reshard(critic)
    return _scatter(parts, micros, rows)


def _scatter(parts: list[Tensor], micros: list[Tensor], rows: Rows) -> Tensor:
    """Returns the (B, T) tensor holding each micro-batch's (rows, its own T) ``parts`` at its rows,
    0 beyond."""
    dtype = parts[0].dtype if parts else torch.float32
    out = torch.zeros(rows.response_ids.shape, dtype=dtype, device=rows.prompt_ids.device)
    for idx, part in zip(micros, parts):
        out[idx, : part.shape[1]] = part
    return out
