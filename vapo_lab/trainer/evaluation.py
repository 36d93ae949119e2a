"""The trainer's periodic held-out evaluation: avg@k and pass@k of the policy on the eval split.

It samples ``rollout.eval_samples`` responses per eval problem at the evaluation temperature and
top-p (on many ranks each rank its share of the problems), scores them with the training reward's
verdicts, and reduces them with :mod:`vapo_lab.eval.metrics`, the same functions ``vapo-lab eval``
reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from vapo_lab.distributed.world import World, single
from vapo_lab.eval.metrics import avg_at_k, pass_at_k_table
from vapo_lab.eval.strata import response_labels, stratum_metrics
from vapo_lab.rollout import Generate
from vapo_lab.rollout.prompts import encode_prompts
from vapo_lab.seeds import chunk_seed
from vapo_lab.trainer.scoring import RewardScorer

if TYPE_CHECKING:
    from vapo_lab.config.schema import RolloutConfig


@torch.no_grad()
def evaluate(
    generate: Generate,
    tokenizer: Any,
    task: Any,
    score: RewardScorer,
    rollout: RolloutConfig,
    chat_template: str,
    seed: int,
    world: World | None = None,
) -> dict[str, float]:
    """Returns held-out avg@k (mean per-sample accuracy), pass@k, mean length and truncated
    fraction on the eval split, k = ``rollout.eval_samples`` at the evaluation temperature and
    top-p; every rank of ``world`` samples its share of the problems (rank r with a generator
    seeded ``seeds.chunk_seed(seed, r)``: one process, ``seed`` itself) and gets the whole
    result."""
    world = world or single()
    k = rollout.eval_samples
    problems = list(task.eval)
    share = -(-len(problems) // world.size)
    mine = problems[world.rank * share : (world.rank + 1) * share]
    # every rank samples, one without problems too: a tensor-parallel engine's group samples in
    # lockstep, so a rank that skipped the call would leave its partners waiting
    gen = torch.Generator().manual_seed(chunk_seed(seed, world.rank))
    prompts = encode_prompts(tokenizer, mine, chat_template)
    s = generate(prompts, k, rollout.eval_temperature, rollout.eval_top_p, gen).cpu()
    per_problem: list[list[bool]] = []
    labels: list[Any] = []  # (stratum, mode) a response, for a task with strata (eval.strata)
    if mine:
        _, correct, texts = score(s, [p for p in mine for _ in range(k)])
        per_problem = correct.view(len(mine), k).tolist()
        labels = response_labels(task, mine, texts, k) or []
    lengths, truncated = s.lengths.tolist(), s.truncated.tolist()
    parts = world.gather((per_problem, lengths, truncated, labels))
    per_problem = [row for part in parts for row in part[0]]
    lengths = [n for part in parts for n in part[1]]
    truncated = [t for part in parts for t in part[2]]
    labels = [label for part in parts for label in part[3]]
    out = {
        f"eval/avg_at_{k}": avg_at_k(per_problem),
        f"eval/pass_at_{k}": pass_at_k_table(per_problem)[k],
        "eval/response_length": float(torch.tensor(lengths).float().mean()),
        "eval/truncated_frac": float(torch.tensor(truncated).float().mean()),
    }
    if labels:  # the task has strata: accuracy, length and mode by stratum (eval.strata)
        out.update(stratum_metrics(labels, [c for row in per_problem for c in row], lengths))
    return out
