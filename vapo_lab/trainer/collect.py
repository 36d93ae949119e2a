"""Rollout collection: a step's prompts in a seeded order, sampled, scored and kept as one batch.

With DAPO's dynamic sampling only groups with mixed rewards are kept and prompts are drawn again
until the step is full. On many ranks every rank draws the same prompts and samples its share,
and every decision is taken on global counts so that the ranks stop together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vapo_lab.algo import dynamic_sampling_keep
from vapo_lab.distributed.world import World, single
from vapo_lab.rollout import Generate
from vapo_lab.seeds import epoch_seed
from vapo_lab.trainer.forward import Rows
from vapo_lab.trainer.scoring import RewardScorer

if TYPE_CHECKING:
    from vapo_lab.config.schema import RolloutConfig


class DataStream:
    """Training problems in a seeded order, epoch after epoch; its position is checkpointed."""

    def __init__(self, problems: list[Any], seed: int) -> None:
        self.problems, self.seed = problems, seed
        self.epoch, self.index = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        g = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        return torch.randperm(len(self.problems), generator=g).tolist()

    def take(self, n: int) -> list[Any]:
        """Returns the next ``n`` problems."""
        out = []
        while len(out) < n:
            if self.index == len(self._order):
                self.epoch, self.index = self.epoch + 1, 0
                self._order = self._permutation()
            out.append(self.problems[self._order[self.index]])
            self.index += 1
        return out

    def state(self) -> dict[str, int]:
        """Returns the position to checkpoint."""
        return {"epoch": self.epoch, "index": self.index}

    def load(self, state: dict[str, int]) -> None:
        """Continues from a position that ``state()`` returned."""
        self.epoch, self.index = state["epoch"], state["index"]
        self._order = self._permutation()


@dataclass
class Batch:
    """One step's experience. B responses, T response tokens."""

    rows: Rows
    problems: list[Any]  # per row
    scores: Tensor  # (B,) verifier reward (plus overlong shaping)
    correct: Tensor  # (B,) bool
    lengths: Tensor  # (B,)
    truncated: Tensor  # (B,) bool
    old_logprobs: Tensor  # (B, T)
    values: Tensor | None = None  # (B, T)
    ref_logprobs: Tensor | None = None  # (B, T)
    advantages: Tensor | None = None  # (B, T)
    returns: Tensor | None = None  # (B, T) the critic's targets
    mc_returns: Tensor | None = None  # (B, T) realised Monte-Carlo returns G_t (diagnostics)
    lam_policy: Tensor | None = None  # (B,)
    # (B, T) the sampler's own log-probs where the policy's recomputed ones replaced them
    sampler_logprobs: Tensor | None = None


@dataclass
class Sampling:
    """How the trainer samples its policy: the generate function, prompt encoding and padding id.

    Attributes:
        generate: the rollout backend's sampler (builtin, or vLLM through ``engine``).
        encode: problems -> prompt token ids (chat template applied as configured).
        pad_id: the padding token of the rows.
        engine: the vLLM engine whose weights follow the policy after each update; None for builtin.
        recompute_logprobs: the built-in sampler computes in another dtype than the policy's
            (bfloat16 on a GPU over float32 masters): its log-probs are not the trainer's, so the
            policy's own pass gives PPO's old log-probs, as for vLLM.
    """

    generate: Generate
    encode: Callable[[list[Any]], list[list[int]]]
    pad_id: int
    engine: Any = None
    recompute_logprobs: bool = False


def collect(
    rollout: RolloutConfig,
    dynamic_sampling: bool,
    sampling: Sampling,
    data: DataStream,
    score: RewardScorer,
    generator: torch.Generator,
    world: World | None = None,
) -> tuple[Batch, dict[str, float]]:
    """Returns one step's scored experience and its ``rollout/*`` counters: ``responses_per_step``
    responses, ``n_samples`` a prompt from ``data`` (with ``dynamic_sampling``, DAPO's: only groups
    with mixed rewards); ``generator`` is the rollout RNG, ``world`` the ranks that share the step
    (this rank's part of the batch is returned)."""
    world = world or single()
    n = rollout.n_samples
    want = rollout.responses_per_step // n
    kept_rows: list[Rows] = []
    kept: list[tuple[Any, ...]] = []
    have, rounds, generated = 0, 0, 0
    info: dict[str, float] = {}
    while True:
        need = want if rounds == 0 else want - have
        share = -(-need // world.size)  # whole equal shares: every rank draws the same prompts
        problems = data.take(share * world.size)[world.rank * share : (world.rank + 1) * share]
        prompts = sampling.encode(problems)
        # the batch lives in host memory
        s = sampling.generate(prompts, n, rollout.temperature, rollout.top_p, generator).cpu()
        rep = [p for p in problems for _ in range(n)]
        scores, correct, _ = score(s, rep)
        generated += len(rep)
        if rounds == 0:
            info["rollout/accuracy_all"] = world.mean(correct.float())
        keep = torch.ones(len(rep), dtype=torch.bool)
        if dynamic_sampling:
            keep = dynamic_sampling_keep(scores, n)
        idx = keep.nonzero().squeeze(-1)
        kept_rows.append(
            Rows(s.prompt_ids, s.prompt_mask, s.response_ids, s.response_mask).take(idx)
        )
        kept.append(
            (
                [rep[i] for i in idx.tolist()],
                scores[idx],
                correct[idx],
                s.lengths[idx],
                s.truncated[idx],
                s.logprobs[idx],
            )
        )
        have += int(world.sum(len(idx) // n))
        rounds += 1
        if have >= want or rounds > rollout.max_resample_rounds or not dynamic_sampling:
            break
    rows = _cat_rows(kept_rows, sampling.pad_id)
    t = rows.response_ids.shape[1]
    batch = Batch(
        rows=rows,
        problems=[p for k in kept for p in k[0]],
        scores=torch.cat([k[1] for k in kept]),
        correct=torch.cat([k[2] for k in kept]),
        lengths=torch.cat([k[3] for k in kept]),
        truncated=torch.cat([k[4] for k in kept]),
        old_logprobs=torch.cat(
            [torch.nn.functional.pad(k[5], (0, t - k[5].shape[1])) for k in kept]
        ),
    )
    # keep whole groups, at most the step's size: the first want·n rows in rank order
    before = sum(world.gather(len(batch.problems))[: world.rank]) if world.size > 1 else 0
    quota = max(0, min(len(batch.problems), want * n - before))
    if len(batch.problems) > quota:
        batch = _slice_batch(batch, quota)
    info["rollout/generated"] = float(world.sum(generated))
    info["rollout/resample_rounds"] = float(rounds)
    return batch, info


def _cat_rows(parts: list[Rows], pad_id: int) -> Rows:
    """Returns the rows of ``parts`` in one layout: prompts left-padded, responses right-padded to
    the widest part."""
    if len(parts) == 1:
        return parts[0]
    p = max(r.prompt_ids.shape[1] for r in parts)
    t = max(r.response_ids.shape[1] for r in parts)
    F = torch.nn.functional
    return Rows(
        torch.cat(
            [F.pad(r.prompt_ids, (p - r.prompt_ids.shape[1], 0), value=pad_id) for r in parts]
        ),
        torch.cat([F.pad(r.prompt_mask, (p - r.prompt_mask.shape[1], 0)) for r in parts]),
        torch.cat(
            [F.pad(r.response_ids, (0, t - r.response_ids.shape[1]), value=pad_id) for r in parts]
        ),
        torch.cat([F.pad(r.response_mask, (0, t - r.response_mask.shape[1])) for r in parts]),
    )


def _slice_batch(batch: Batch, n: int) -> Batch:
    """Returns the first ``n`` rows of a freshly collected ``batch``."""
    idx = torch.arange(n)
    return Batch(
        rows=batch.rows.take(idx),
        problems=batch.problems[:n],
        scores=batch.scores[:n],
        correct=batch.correct[:n],
        lengths=batch.lengths[:n],
        truncated=batch.truncated[:n],
        old_logprobs=batch.old_logprobs[:n, : int(batch.rows.take(idx).response_ids.shape[1])],
    )
