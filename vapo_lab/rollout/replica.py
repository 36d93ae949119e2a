"""The built-in sampler on a sharded run: each rank samples with its own full copy of the policy.

Under ``trainer.strategy=fsdp`` the training policy is sharded over the ranks, but decoding with
a KV cache calls the model once per token, a different number of times on each rank, which
FSDP's per-call all-gathers cannot follow. So the built-in backend keeps what vLLM keeps: an
unsharded inference copy, refreshed from the shards after each update, one parameter gathered at
a time. It costs one model's weights per rank: fine for the CPU-sized models this backend is for;
on GPUs the vLLM backend samples instead.
"""

from __future__ import annotations

import torch
from torch import nn

from vapo_lab.distributed.fsdp import full_parameters


class Replica:
    """The sampler's own copy of the policy; ``push_weights`` copies a (sharded) policy into it."""

    # the copy's log-probs are the training policy's before the update (same weights, same
    # kernels as the single-process sampler): the trainer uses them as they are
    recompute_logprobs = False

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def push_weights(self, policy: nn.Module) -> None:
        """Copies ``policy``'s parameters into the copy; a collective on a sharded policy."""
        mine = dict(self.model.named_parameters())
        for name, tensor in full_parameters(policy):
            mine[name].copy_(tensor.to(mine[name].dtype))
