"""The training reward: each response's score from the task's verifier and the reward config.

Not to be confused with :mod:`vapo_lab.grading`, the answer grader that a task's ``verify`` may
call: this module turns verdicts into rewards (correct / wrong values, DAPO's overlong shaping).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from vapo_lab.algo import overlong_penalty
from vapo_lab.rollout.sampler import Samples

if TYPE_CHECKING:
    from vapo_lab.config.schema import RewardConfig


@dataclass
class RewardScorer:
    """Turns samples into scores with the task's verifier and the ``reward`` section.

    A truncated response counts as wrong whatever its text: its answer was never finished.
    """

    task: Any
    tokenizer: Any
    reward: RewardConfig

    def __call__(self, samples: Samples, problems: list[Any]) -> tuple[Tensor, Tensor, list[str]]:
        """Returns (scores (B,) float, correct (B,) bool, decoded response texts) of ``samples``,
        row i answering ``problems[i]``."""
        texts = [
            self.tokenizer.decode(ids[:n].tolist(), skip_special_tokens=True)
            for ids, n in zip(samples.response_ids, samples.lengths.tolist())
        ]
        correct = torch.tensor(
            [
                bool(self.task.verify(t, p)) and not trunc
                for t, p, trunc in zip(texts, problems, samples.truncated.tolist())
            ]
        )
        r = self.reward
        scores = torch.where(correct, torch.tensor(r.correct), torch.tensor(r.wrong))
        if r.overlong.enabled:
            o = r.overlong
            scores = scores + overlong_penalty(samples.lengths, o.l_max, o.l_cache, o.penalty)
        return scores.float(), correct, texts
