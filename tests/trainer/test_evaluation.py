"""The trainer's periodic evaluation reports eval.metrics' avg@k and pass@k of its samples."""

from types import SimpleNamespace

import pytest
import torch

from vapo_lab.config.schema import RolloutConfig
from vapo_lab.seeds import chunk_seed
from vapo_lab.trainer.evaluation import call_of, eval_runs, evaluate


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


def test_the_pairs_are_cut_into_near_equal_runs_by_hand():
    # P = 3 problems x k = 4 samples = 12 (problem, sample) pairs on 5 ranks: 12 = 5 x 2 + 2, so
    # ranks 0 and 1 take 3 pairs, ranks 2-4 take 2. Pairs 0-3 are problem 0's, 4-7 problem 1's,
    # 8-11 problem 2's: rank 0 [0, 3) = 3 of problem 0; rank 1 [3, 6) = the last of problem 0
    # and 2 of problem 1; rank 2 [6, 8) = 2 of problem 1; ranks 3 and 4 [8, 10) and [10, 12) =
    # 2 of problem 2 each
    assert eval_runs(3, 4, 5) == [[(0, 3)], [(0, 1), (1, 2)], [(1, 2)], [(2, 2)], [(2, 2)]]
    # before, by problem: ceil(3 / 5) = 1 problem a rank, so ranks 3 and 4 had nothing
    # one rank: every problem whole, as one process always sampled
    assert eval_runs(3, 4, 1) == [[(0, 4), (1, 4), (2, 4)]]
    # more ranks than pairs: the last ranks' shares are empty (they still call generate)
    assert eval_runs(1, 2, 3) == [[(0, 1)], [(0, 1)], []]


@pytest.mark.parametrize(
    "p, k, ranks", [(30, 32, 128), (30, 32, 8), (7, 3, 4), (2, 5, 16), (0, 4, 2)]
)
def test_the_runs_spell_every_pair_once_in_order(p, k, ranks):
    shares = eval_runs(p, k, ranks)
    pairs = [(problem, i) for runs in shares for problem, count in runs for i in range(count)]
    # problem-major: each problem's k samples, problem after problem (the sample index is only
    # which of its k it is)
    assert [problem for problem, _ in pairs] == [i // k for i in range(p * k)]
    sizes = [sum(count for _, count in runs) for runs in shares]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == p * k
    assert all(0 < count <= k for runs in shares for _, count in runs)


def test_a_share_is_one_generate_call_by_hand():
    # n = the gcd of the counts; each problem's prompt repeated count / n times: rows prompt after
    # prompt, n each, are the runs' pairs in order
    assert call_of([(0, 4), (1, 4)], 4) == ([0, 1], 4)  # whole problems: today's call
    assert call_of([(0, 1), (1, 2)], 4) == ([0, 1, 1], 1)  # gcd(1, 2) = 1
    assert call_of([(3, 2), (4, 4), (5, 6)], 8) == ([3, 4, 4, 5, 5, 5], 2)  # gcd(2, 4, 6) = 2
    assert call_of([(2, 3)], 4) == ([2], 3)
    assert call_of([], 4) == ([], 4)  # no pairs: an empty call, n as before


def test_a_share_that_splits_problems_scores_each_row_against_its_problem():
    # one rank of two, P = 3, k = 2: 6 pairs, rank 1 takes pairs 3-5 = (1, 1), (2, 2): one call
    # of prompts [1, 2, 2] with n = 1; the scorer sees rows of problems [1, 2, 2]
    from vapo_lab.distributed.world import World

    class Half(World):
        def gather(self, obj):  # rank 0's share: pairs 0-2 = problem 0 x 2 (right), problem 1
            return [([True, True, False], [1, 1, 1], [False, False, False], []), obj]

    seen = {}

    def generate(prompts, n, temperature, top_p, generator):
        seen["call"] = ([p[0] for p in prompts], n)
        seen["state"] = generator.get_state()
        lengths = torch.tensor([2, 3, 4])
        samples = SimpleNamespace(lengths=lengths, truncated=lengths > 3)
        samples.cpu = lambda: samples
        return samples

    def score(samples, problems):
        seen["rows"] = [int(p.prompt) for p in problems]
        return None, torch.tensor([True, False, False]), None

    tokenizer = lambda text, add_special_tokens=True: {"input_ids": [int(text)]}  # noqa: E731
    rollout = RolloutConfig(eval_samples=2, eval_temperature=1.0, eval_top_p=1.0)
    task = SimpleNamespace(eval=[SimpleNamespace(prompt=str(i)) for i in range(3)])
    m = evaluate(generate, tokenizer, task, score, rollout, "none", 5, Half(rank=1, size=2))
    assert seen["call"] == ([1, 2, 2], 1) and seen["rows"] == [1, 2, 2]
    assert torch.equal(seen["state"], torch.Generator().manual_seed(chunk_seed(5, 1)).get_state())
    # rows: problem 0 [T, T], problem 1 [F, T], problem 2 [F, F]: avg@2 = (1 + 0.5 + 0) / 3 = 0.5,
    # pass@2 = 2/3; lengths 1, 1, 1, 2, 3, 4: mean 2; one of 6 truncated (length 4 > 3)
    assert m["eval/avg_at_2"] == 0.5 and m["eval/pass_at_2"] == pytest.approx(2 / 3, abs=1e-15)
    assert m["eval/response_length"] == 2.0
    assert m["eval/truncated_frac"] == pytest.approx(1 / 6, abs=1e-7)


# the embedded default's first 6 held-out problems x 4 samples at the evaluation's settings, one
# process, one thread, seed heldout_seed(0, 0): the figures of the evaluation before the pairs were
# spread (commit 6eae451, which split by problem), recorded by running it
def test_one_process_evaluates_as_before_the_spread(tmp_path, monkeypatch):
    from vapo_lab.config.compose import compose_config
    from vapo_lab.config.schema import typed
    from vapo_lab.seeds import heldout_seed
    from vapo_lab.trainer.setup import build_parts

    monkeypatch.chdir(tmp_path)  # caches: none built (the shipped base model), none left behind
    threads = torch.get_num_threads()
    try:
        config = typed(compose_config(overrides=["tracking=none", "trainer.threads=1"]).cfg)
        parts = build_parts(config, log=lambda text: None)
        # not task.n_eval, which keys the base model (the shipped one is n_eval 256's)
        parts.task.eval = list(parts.task.eval)[:6]
        calls, samples = [], []

        def generate(prompts, n, temperature, top_p, generator):
            calls.append((len(prompts), n))
            samples.append(parts.sampling.generate(prompts, n, temperature, top_p, generator))
            return samples[-1]

        m = evaluate(
            generate,
            parts.tokenizer,
            parts.task,
            parts.scorer,
            config.rollout,
            config.model.chat_template,
            heldout_seed(config.seed, 0),
        )
    finally:
        torch.set_num_threads(threads)
    # one call of every prompt, 4 samples each, from the same seed: the samples of before the
    # spread (pinned on this CPU before the change: avg@4 0.375, pass@4 0.5, length 42.33)
    assert calls == [(6, 4)]
    s = samples[0].cpu()
    _, correct, _ = parts.scorer(s, [p for p in parts.task.eval for _ in range(4)])
    per_problem = correct.view(6, 4).float()
    assert m["eval/avg_at_4"] == pytest.approx(per_problem.mean().item())
    assert m["eval/pass_at_4"] == pytest.approx(per_problem.amax(1).mean().item())
    assert m["eval/response_length"] == s.lengths.float().mean().item()
    assert m["eval/truncated_frac"] == s.truncated.float().mean().item()
