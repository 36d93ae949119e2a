"""The trainer's periodic held-out evaluation: avg@k and pass@k of the policy on the eval split.

It samples ``rollout.eval_samples`` responses per eval problem at the evaluation temperature and
top-p, scores them with the training reward's verdicts, and reduces them with
:mod:`vapo_lab.eval.metrics`, the same functions ``vapo-lab eval`` reports.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from vapo_lab.eval.metrics import avg_at_k, pass_at_k_table
from vapo_lab.rollout import Generate
from vapo_lab.rollout.prompts import encode_prompts
from vapo_lab.trainer.scoring import RewardScorer


@torch.no_grad()
def evaluate(generate: Generate, tokenizer: Any, task: Any, score: RewardScorer, cfg: DictConfig,
             seed: int) -> dict[str, float]:
    """Returns held-out avg@k (mean per-sample accuracy), pass@k, mean length and truncated
    fraction on the eval split, sampled with a generator seeded with ``seed``."""
    k = int(cfg.rollout.eval_samples)
    problems = list(task.eval)
    gen = torch.Generator().manual_seed(seed)
    s = generate(encode_prompts(tokenizer, problems, cfg.model.chat_template), k,
                 float(cfg.rollout.eval_temperature), float(cfg.rollout.eval_top_p), gen).cpu()
    rep = [p for p in problems for _ in range(k)]
    _, correct, _ = score(s, rep)
    per_problem = correct.view(len(problems), k).tolist()
    return {f"eval/avg_at_{k}": avg_at_k(per_problem),
            f"eval/pass_at_{k}": pass_at_k_table(per_problem)[k],
            "eval/response_length": float(s.lengths.float().mean()),
            "eval/truncated_frac": float(s.truncated.float().mean())}
