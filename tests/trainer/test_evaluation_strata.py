"""The trainer's evaluation adds per-stratum metrics for a task with strata (task=arithfree), none
otherwise."""

from types import SimpleNamespace

import torch

from vapo_lab.config.schema import RolloutConfig
from vapo_lab.tasks import Problem
from vapo_lab.tasks.arithfree import ArithFreeTask, answer_words
from vapo_lab.trainer.evaluation import evaluate


def test_strata_metrics_by_hand():
    task = ArithFreeTask(0, 0, 0)
    short = Problem("s", "a", " ".join(answer_words(5, 2, 1)), {"n_digits": 1, "x": 5, "y": 2})
    long = Problem(
        "l", "b", " ".join(answer_words(12345, 1, 5)), {"n_digits": 5, "x": 12345, "y": 1}
    )
    task.eval = [short, long]
    texts = [
        task.trace(short, columns=0),
        task.trace(short),
        task.trace(long, columns=2),
        task.trace(long),
    ]
    correct = torch.tensor([True, True, False, True])
    rollout = RolloutConfig(eval_samples=2, eval_temperature=1.0, eval_top_p=1.0)
    lengths = torch.tensor([4, 6, 12, 20])

    def generate(prompts, n, temperature, top_p, generator):
        samples = SimpleNamespace(lengths=lengths, truncated=torch.zeros(4, dtype=torch.bool))
        samples.cpu = lambda: samples
        return samples

    tokenizer = lambda text, add_special_tokens=True: {"input_ids": [1, 2]}  # noqa: E731
    score = lambda s, p: (None, correct, texts)  # noqa: E731
    m = evaluate(generate, tokenizer, task, score, rollout, "none", seed=0)
    assert m["eval/avg_at_2"] == 0.75
    # short: both right (direct, full), lengths 4 and 6; long: partial wrong, full right, lengths
    # 12 and 20
    assert m["eval/acc_d01_03"] == 1.0 and m["eval/acc_d04_08"] == 0.5
    assert m["eval/length_d01_03"] == 5.0 and m["eval/length_d04_08"] == 16.0
    assert m["eval/full_d01_03"] == 0.5 and m["eval/full_d04_08"] == 0.5
    assert m["eval/mode_share_full"] == 0.5 and m["eval/mode_acc_partial"] == 0.0
