"""The pre-training recipe of ``task=arithfree``'s base policy: noisy traces of every length.

The base is the same tiny model (:mod:`vapo_lab.models.tiny`) as the embedded default's, trained by
the same loop (:func:`vapo_lab.basemodel.recipe.pretrain`) on another mixture of traces
(:mod:`vapo_lab.tasks.arithfree`): each trace works a random number of columns
(:class:`~vapo_lab.tasks.arithfree.LengthChoice`: answer at once with ``direct_rate``, else stop
after each column with ``stop_rate``) and guesses the rest, and its worked columns carry
``arith``'s systematic bug (forget the carry in, in the ``bug_sums`` family, with ``bug_rate``) and
random slips. So the base prefers short answers, which are wrong on most problems of more than a
few digits, and its long answers carry a bug that RL has to unlearn: its held-out accuracy at
temperature 1 starts low (the target is 5-20%), and the two things RL can gain are *length* (work
more columns) and *correctness* of the worked columns.

Only the options of :data:`FREE_DEFAULTS` that differ from the embedded default's
(:data:`vapo_lab.basemodel.recipe.DEFAULTS`) are new; the cache key is the hash of the whole
config, which for this task carries ``task: arithfree``, so no entry of the default is touched.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import torch

from vapo_lab.basemodel.recipe import DEFAULTS, sample_modes
from vapo_lab.tasks import Problem
from vapo_lab.tasks.arith import TraceNoise
from vapo_lab.tasks.arithfree import MODES, ArithFreeTask, LengthChoice

TASK_NAME = "arithfree"

FREE_DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in DEFAULTS.items() if k != "readout"},  # the read-out is always labelled here
    "task": TASK_NAME,
    # the task: conf/task/arithfree.yaml's generator settings, so RL sees these very splits
    "max_digits": 32,
    "length_exponent": 0.0,
    # the length mixture (tasks.arithfree.LengthChoice): see docs/cpu-task-design.md for the
    # measurements
    "direct_rate": 0.3,
    "stop_rate": 0.06,
    # the worked columns' noise (tasks.arith.TraceNoise): forget the carry in when x + y is 9 or 10
    "bug_rate": 0.8,
    "bug_sums": [9, 10],
    "slip_rate": 0.02,
    "steps": 6000,
    "eval_samples": 4,
}


def make_task(config: dict[str, Any]) -> ArithFreeTask:
    """Returns the task the base is pre-trained on (the RL run's splits for the same settings)."""
    return ArithFreeTask(
        config["task_seed"],
        config["n_train"],
        config["n_eval"],
        min_digits=config["min_digits"],
        max_digits=config["max_digits"],
        length_exponent=config["length_exponent"],
    )


class PretrainView:
    """The task as :func:`~vapo_lab.basemodel.recipe.pretrain` sees it: ``trace(problem, rng,
    noise)`` draws the number of worked columns from ``choice`` first (same rng), then writes that
    trace."""

    def __init__(self, task: ArithFreeTask, choice: LengthChoice) -> None:
        self.task, self.choice, self.train = task, choice, task.train

    def trace(self, problem: Problem, rng: random.Random, noise: TraceNoise) -> str:
        return self.task.trace(problem, rng, noise, self.choice.draw(problem.meta["n_digits"], rng))


def length_choice(config: dict[str, Any]) -> LengthChoice:
    """Returns the config's :class:`LengthChoice`."""
    return LengthChoice(direct_rate=config["direct_rate"], stop_rate=config["stop_rate"])


def summarize(
    task: ArithFreeTask, problems: list[Problem], texts: list[list[str]], lengths: list[list[int]]
) -> dict[str, Any]:
    """Returns accuracy, mode shares, accuracy per mode and mean length, overall and by stratum.

    Args:
        texts: per problem, its sampled responses' texts.
        lengths: per problem, the responses' lengths in tokens (same shape as ``texts``).

    Returns:
        {"all": row, stratum: row, ...}; a row holds "acc", "length" (mean tokens), "n" (responses)
        and per mode m of :data:`MODES`: "share_m", and "acc_m" where the mode occurs.
    """
    groups: dict[str, list[tuple[bool, str, int]]] = defaultdict(list)
    for problem, row_texts, row_lengths in zip(problems, texts, lengths):
        for text, length in zip(row_texts, row_lengths):
            item = (task.verify(text, problem), task.classify(text, problem)[0], length)
            groups["all"].append(item)
            groups[task.stratum(problem)].append(item)
    out: dict[str, Any] = {}
    for key in ["all"] + sorted(k for k in groups if k != "all"):
        items = groups[key]
        row: dict[str, float] = {
            "n": len(items),
            "acc": round(sum(i[0] for i in items) / len(items), 4),
            "length": round(sum(i[2] for i in items) / len(items), 2),
        }
        for mode in MODES:
            of_mode = [i for i in items if i[1] == mode]
            row[f"share_{mode}"] = round(len(of_mode) / len(items), 4)
            if of_mode:
                row[f"acc_{mode}"] = round(sum(i[0] for i in of_mode) / len(of_mode), 4)
        out[key] = row
    return out


@torch.no_grad()
def measure(
    model,
    tokenizer,
    task: ArithFreeTask,
    problems: list[Problem],
    samples: int,
    seed: int,
    bar: Any = None,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Returns the base's held-out accuracy ("greedy", "t1": {"all", stratum: accuracy}) and, for
    temperature 1, :func:`summarize`'s table under "t1_modes".

    Sampling is plain temperature 1 (no top-p) with ``model.generate``, as the default's
    :func:`~vapo_lab.basemodel.recipe.measure_accuracy`.
    """
    texts: dict[str, list[list[str]]] = {
        "greedy": [[] for _ in problems],
        "t1": [[] for _ in problems],
    }
    lengths: dict[str, list[list[int]]] = {
        "greedy": [[] for _ in problems],
        "t1": [[] for _ in problems],
    }
    for mode, _, index, new in sample_modes(
        model, tokenizer, problems, samples, seed, bar, batch_size
    ):
        decoded = tokenizer.batch_decode(new, skip_special_tokens=True)
        done = (new == tokenizer.eos_token_id).int()
        # tokens up to and including the first eos (all of them when none)
        first = torch.where(
            done.any(1), done.argmax(1) + 1, torch.full_like(done[:, 0], new.shape[1])
        )
        for i, text, n in zip(index, decoded, first.tolist()):
            texts[mode][i].append(text)
            lengths[mode][i].append(int(n))
    result: dict[str, Any] = {}
    for mode in ("greedy", "t1"):
        table = summarize(task, problems, texts[mode], lengths[mode])
        result[mode] = {k: row["acc"] for k, row in table.items()}
        result[f"{mode}_modes"] = table
    return result
