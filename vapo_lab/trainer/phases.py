"""The phases every training loop runs: an RL step, value pretraining and the reward model's rounds.

Each loop is rollout (then the engine sleeps) -> model outputs -> targets -> updates -> (the engine
gets the policy's weights back), so what a step does about devices, engines and offload, the
critic's start does too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vapo_lab.distributed.offload import on_host
from vapo_lab.trainer.collect import Batch, DataStream, collect
from vapo_lab.trainer.forward import batched_logprobs, batched_values, token_micro_batches

if TYPE_CHECKING:
    from vapo_lab.config.schema import RolloutConfig, TrainerConfig
    from vapo_lab.trainer.setup import Parts


@dataclass
class Phases:
    """The phases over a run's parts.

    Attributes:
        trainer: ``offload_during_rollout`` and ``max_tokens_per_micro_batch``.
        temperature: the sampling temperature (log-probs recomputed at it).
    """

    parts: Parts
    trainer: TrainerConfig
    temperature: float

    def rollout(
        self,
        rollout: RolloutConfig,
        dynamic_sampling: bool,
        data: DataStream,
        generator: torch.Generator,
        policy: nn.Module | None,
        models: list[nn.Module | None],
        optimizers: list[torch.optim.Optimizer | None],
    ) -> tuple[Batch, dict[str, float]]:
        """Returns ``collect``'s batch and counters, sampled with ``models`` and ``optimizers`` (and
        ``policy``, unless it is what samples) in host memory under
        ``trainer.offload_during_rollout``; the engine sleeps as soon as it is done (the passes
        and updates after need its memory, not it), before that state comes back: the rollout
        never holds the engine's share and the state on the device at once."""
        p = self.parts
        with self._on_host(policy, models, optimizers):
            out = collect(rollout, dynamic_sampling, p.sampling, data, p.scorer, generator, p.world)
            self.sleep()
        return out

    def model_outputs(
        self,
        batch: Batch,
        policy: nn.Module | None = None,
        critic: nn.Module | None = None,
        ref: nn.Module | None = None,
    ) -> None:
        """Fills in ``batch`` what the models say of its rows: ``policy``'s log-probs where the
        engine's differ from the trainer's (vLLM), ``critic``'s values, ``ref``'s log-probs."""
        world, budget = self.parts.world, self.trainer.max_tokens_per_micro_batch
        micro = token_micro_batches(torch.arange(len(batch.problems)), batch.rows, budget)
        extra = int(world.max(len(micro))) - len(micro)  # a sharded model's ranks pass equally
        sampling = self.parts.sampling
        engine = sampling.engine
        recompute = sampling.recompute_logprobs or (
            engine is not None and getattr(engine, "recompute_logprobs", True)
        )
        if policy is not None and recompute:
            batch.sampler_logprobs = batch.old_logprobs  # kept to measure the two engines' gap
            batch.old_logprobs = batched_logprobs(
                policy, batch.rows, micro, self.temperature, extra
            )
        if critic is not None:
            batch.values = batched_values(critic, batch.rows, micro, extra)
        if ref is not None:
            batch.ref_logprobs = batched_logprobs(ref, batch.rows, micro, self.temperature, extra)

    def sleep(self) -> None:
        """Frees the engine's device memory for the updates (vLLM; others have none to free)."""
        engine = self.parts.sampling.engine
        if hasattr(engine, "sleep"):
            engine.sleep()

    def push(self, policy: nn.Module) -> None:
        """Gives the engine ``policy``'s current weights (waking it), where it keeps its own."""
        engine = self.parts.sampling.engine
        if engine is not None:
            engine.push_weights(policy)

    def _on_host(
        self,
        policy: nn.Module | None,
        models: list[nn.Module | None],
        optimizers: list[torch.optim.Optimizer | None],
    ) -> contextlib.AbstractContextManager[Any]:
        """The context a rollout runs in (``trainer.offload_during_rollout``)."""
        if not self.trainer.offload_during_rollout:
            return contextlib.nullcontext()
        # the built-in sampler of one process generates with the policy itself: on an accelerator
        # it stays there; on CPU the host is the device, so it moves too
        p = self.parts
        samples_with_policy = p.sampling.engine is None and p.device.type != "cpu"
        return on_host([None if samples_with_policy else policy, *models], optimizers)
