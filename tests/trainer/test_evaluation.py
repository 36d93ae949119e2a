"""The trainer's periodic evaluation reports eval.metrics' avg@k and pass@k of its samples."""

from types import SimpleNamespace

import pytest
import torch

from vapo_lab.config.schema import RolloutConfig
from vapo_lab.trainer.evaluation import evaluate


def _evaluate(correct):
    """Runs ``evaluate`` over P problems x k samples whose verdicts are ``correct`` (P, k)."""
    p, k = correct.shape
    rollout = RolloutConfig(eval_samples=k, eval_temperature=1.0, eval_top_p=1.0)
    lengths = torch.arange(p * k) % 7 + 1

    def generate(prompts, n, temperature, top_p, generator):
        assert (len(prompts), n) == (p, k)
        samples = SimpleNamespace(lengths=lengths, truncated=lengths == 7)
        samples.cpu = lambda: samples  # already in host memory, as Samples.cpu() leaves them
        return samples

    def score(samples, problems):
        assert len(problems) == p * k
        return None, correct.reshape(-1), None

    tokenizer = lambda text, add_special_tokens=True: {"input_ids": [1, 2]}  # noqa: E731
    return evaluate(
        generate,
        tokenizer,
        SimpleNamespace(eval=[SimpleNamespace(prompt=str(i)) for i in range(p)]),
        score,
        rollout,
        "none",
        seed=0,
    )


def test_avg_and_pass_at_k_by_hand():
    # 3 problems x 2 samples: 2/2, 1/2, 0/2 correct -> avg@2 = (1 + 0.5 + 0)/3 = 0.5, pass@2 = 2/3
    m = _evaluate(torch.tensor([[True, True], [False, True], [False, False]]))
    assert m["eval/avg_at_2"] == 0.5 and m["eval/pass_at_2"] == pytest.approx(2 / 3, abs=1e-15)
    assert m["eval/response_length"] == pytest.approx(sum(i % 7 + 1 for i in range(6)) / 6)
    assert m["eval/truncated_frac"] == 0.0


@pytest.mark.parametrize("p, k", [(256, 4), (16, 2), (7, 3), (300, 4), (100, 32)])
def test_the_figures_agree_with_float32_means_of_the_verdicts(p, k):
    # float32 means of the (P, k) verdicts give the same figures up to float32 rounding, and
    # exactly the same where P and k are powers of two (the embedded default: 256 problems x 4)
    correct = torch.rand(p, k, generator=torch.Generator().manual_seed(p * k)) < 0.3
    m = _evaluate(correct)
    per_problem = correct.float()
    avg32 = float(per_problem.mean())
    pass32 = float((per_problem.sum(-1) > 0).float().mean())
    assert m[f"eval/avg_at_{k}"] == pytest.approx(avg32, abs=1e-7, rel=0)
    assert m[f"eval/pass_at_{k}"] == pytest.approx(pass32, abs=1e-7, rel=0)
    if (p * k) & (p * k - 1) == 0 and p & (p - 1) == 0:
        assert (m[f"eval/avg_at_{k}"], m[f"eval/pass_at_{k}"]) == (avg32, pass32)
