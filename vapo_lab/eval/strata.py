"""Held-out accuracy by stratum: pure functions over per-response labels, for tasks that define
strata.

A task with a ``stratum(problem) -> str`` method (``task=arithfree``: the digit-count range) gets
its held-out evaluation split by stratum; one that also has ``classify(text, problem) -> (mode, _)``
gets the share of each response mode (direct / partial / full) and the accuracy of each. The
trainer's evaluation (:mod:`vapo_lab.trainer.evaluation`) logs what :func:`stratum_metrics` returns
beside avg@k, so a run's history shows which problems improve and whether the policy's length choice
moves:

* ``eval/acc_<stratum>``: mean per-sample accuracy of the stratum's responses (x1, like avg@k);
* ``eval/length_<stratum>``: their mean length in tokens;
* ``eval/full_<stratum>``: the share of them that work every column (``classify`` == "full");
* ``eval/mode_share_<mode>`` and ``eval/mode_acc_<mode>``: over all responses, each mode's share and
  accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

# (stratum, mode) of one response; mode is None when the task does not classify responses
Label = tuple[str, "str | None"]


def response_labels(
    task: Any, problems: Sequence[Any], texts: Sequence[str], k: int
) -> list[Label] | None:
    """Returns the (stratum, mode) of each of the ``k`` responses per problem (row-major, as
    sampled), or None when ``task`` has no ``stratum`` method."""
    if not hasattr(task, "stratum"):
        return None
    classify = getattr(task, "classify", None)
    labels: list[Label] = []
    for i, text in enumerate(texts):
        problem = problems[i // k]
        labels.append((task.stratum(problem), classify(text, problem)[0] if classify else None))
    return labels


def accuracy_by_stratum(correct: Sequence[bool], strata: Sequence[str]) -> dict[str, float]:
    """Returns {stratum: fraction of its responses that are correct}, for the strata that occur.

    Example: correct [1, 0, 1, 1], strata [a, a, b, b] -> {a: 0.5, b: 1.0}.
    """
    if len(correct) != len(strata):
        raise ValueError(
            f"{len(correct)} verdicts but {len(strata)} strata: give one stratum per response"
        )
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for ok, s in zip(correct, strata):
        hits[s][0] += int(bool(ok))
        hits[s][1] += 1
    return {s: h[0] / h[1] for s, h in sorted(hits.items())}


def stratum_metrics(
    labels: Sequence[Label], correct: Sequence[bool], lengths: Sequence[int], prefix: str = "eval/"
) -> dict[str, float]:
    """Returns the per-stratum and per-mode metrics of the module docstring from per-response
    ``labels``, verdicts and lengths (all in the same order)."""
    if not (len(labels) == len(correct) == len(lengths)):
        raise ValueError("labels, correct and lengths must have one entry per response")
    out: dict[str, float] = {}
    strata = [s for s, _ in labels]
    for s, acc in accuracy_by_stratum(correct, strata).items():
        out[f"{prefix}acc_{s}"] = acc
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(strata):
        groups[s].append(i)
    modes = [m for _, m in labels]
    for s, idx in sorted(groups.items()):
        out[f"{prefix}length_{s}"] = sum(lengths[i] for i in idx) / len(idx)
        if modes[idx[0]] is not None:
            out[f"{prefix}full_{s}"] = sum(modes[i] == "full" for i in idx) / len(idx)
    if labels and modes[0] is not None:
        for mode in sorted(set(modes)):
            idx = [i for i, m in enumerate(modes) if m == mode]
            out[f"{prefix}mode_share_{mode}"] = len(idx) / len(modes)
            out[f"{prefix}mode_acc_{mode}"] = sum(bool(correct[i]) for i in idx) / len(idx)
    return out
