"""The trainer's periodic held-out evaluation: avg@k and pass@k of the policy on the eval split.

It samples ``rollout.eval_samples`` responses per eval problem at the evaluation temperature and
top-p, scores them with the training reward's verdicts, and reduces them with
:mod:`vapo_lab.eval.metrics`, the same functions ``vapo-lab eval`` reports. On many ranks the
P x k (problem, sample) pairs are cut into one contiguous share a rank (:func:`eval_runs`), so that
every rank's engine samples even where there are fewer problems than ranks (30 AIME problems on
128 GPUs).
"""

from __future__ import annotations

import math
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

# (problem index, samples of it) a run of consecutive (problem, sample) pairs
Run = tuple[int, int]


def eval_runs(problems: int, k: int, ranks: int) -> list[list[Run]]:
    """Returns each rank's share of the ``problems`` x ``k`` (problem, sample) pairs as runs.

    The pairs, problem-major (problem 0's k samples, then problem 1's, ...), are cut into ``ranks``
    contiguous chunks of floor(P·k / ranks) pairs, the first P·k mod ranks one larger; a chunk is
    listed as (problem, count) runs in problem order, so rank after rank the runs spell out every
    pair once. Example: P = 3, k = 4 on 5 ranks: 12 pairs in chunks of 3, 3, 2, 2, 2:
    [[(0, 3)], [(0, 1), (1, 2)], [(1, 2)], [(2, 2)], [(2, 2)]].
    """
    total, start = problems * k, 0
    out: list[list[Run]] = []
    for rank in range(ranks):
        end = start + total // ranks + (1 if rank < total % ranks else 0)
        runs: list[Run] = []
        i = start
        while i < end:
            problem = i // k
            stop = min(end, (problem + 1) * k)
            runs.append((problem, stop - i))
            i = stop
        out.append(runs)
        start = end
    return out


def call_of(runs: list[Run], k: int) -> tuple[list[int], int]:
    """Returns (the problem of each prompt, samples a prompt) of the one ``generate`` call that
    samples ``runs``: n = the counts' greatest common divisor, each problem's prompt repeated
    count / n times, so the rows (prompt after prompt, n each) are the runs' pairs in order.

    Whole problems give (their problems, k): the call a share of whole problems always made. No
    runs give ([], k).
    """
    n = math.gcd(*(count for _, count in runs)) if runs else k
    return [problem for problem, count in runs for _ in range(count // n)], n


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
    top-p; every rank of ``world`` samples its share of the (problem, sample) pairs
    (:func:`eval_runs`; rank r with a generator seeded ``seeds.chunk_seed(seed, r)``: one process,
    ``seed`` itself, all of them in one call) and gets the whole result."""
    world = world or single()
    k = rollout.eval_samples
    problems = list(task.eval)
    runs = eval_runs(len(problems), k, world.size)[world.rank]
    # every rank samples, one without pairs too: a tensor-parallel engine's group samples in
    # lockstep, so a rank that skipped the call would leave its partners waiting
    gen = torch.Generator().manual_seed(chunk_seed(seed, world.rank))
    mine = [p for p, _ in runs]  # each problem once: its runs on a rank are consecutive
    encoded = dict(zip(mine, encode_prompts(tokenizer, [problems[p] for p in mine], chat_template)))
    prompted, n = call_of(runs, k)
    prompts = [encoded[p] for p in prompted]
    s = generate(prompts, n, rollout.eval_temperature, rollout.eval_top_p, gen).cpu()
    verdicts: list[bool] = []
    labels: list[Any] = []  # (stratum, mode) a response, for a task with strata (eval.strata)
    if runs:
        rows = [problems[p] for p, count in runs for _ in range(count)]
        _, correct, texts = score(s, rows)
        verdicts = correct.tolist()
        labels = response_labels(task, rows, texts, 1) or []
    lengths, truncated = s.lengths.tolist(), s.truncated.tolist()
    # rank after rank, the shares are the pairs in problem-major order: k verdicts a problem
    parts = world.gather((verdicts, lengths, truncated, labels))
    flat = [v for part in parts for v in part[0]]
    per_problem = [flat[i * k : (i + 1) * k] for i in range(len(problems))]
    lengths = [x for part in parts for x in part[1]]
    truncated = [t for part in parts for t in part[2]]
    labels = [label for part in parts for label in part[3]]
    out = {
        f"eval/avg_at_{k}": avg_at_k(per_problem),
        f"eval/pass_at_{k}": pass_at_k_table(per_problem)[k],
        "eval/response_length": float(torch.tensor(lengths).float().mean()),
        "eval/truncated_frac": float(torch.tensor(truncated).float().mean()),
    }
    if labels:  # the task has strata: accuracy, length and mode by stratum (eval.strata)
        out.update(stratum_metrics(labels, flat, lengths))
    return out
