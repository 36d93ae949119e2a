"""Tests for vapo_lab.tasks.arith: generation, splits, response lengths, verifier, noisy traces."""

import random

import pytest

from vapo_lab.errors import ConfigError
from vapo_lab.models.tokenizer import build_tokenizer
from vapo_lab.tasks import Problem, build_task, last_boxed, register_task
from vapo_lab.tasks.arith import ArithTask, TraceNoise, is_bug_step


@pytest.fixture(scope="module")
def task():
    return ArithTask(seed=0, n_train=400, n_eval=100)


def test_same_seed_same_problems_other_seed_other_problems():
    a, b = ArithTask(3, 50, 20), ArithTask(3, 50, 20)
    assert a.train == b.train and a.eval == b.eval
    assert [p.prompt for p in ArithTask(4, 50, 20).train] != [p.prompt for p in a.train]


def test_eval_split_does_not_depend_on_train_size():
    assert ArithTask(0, 10, 30).eval == ArithTask(0, 500, 30).eval


def test_splits_are_disjoint_even_when_small_problems_run_out():
    # 1..2 digits: 55 + 4095 unordered pairs; x + y and y + x count as the same problem, so
    # the 1-digit problems run out and the generator must redraw
    task = ArithTask(0, n_train=2000, n_eval=500, min_digits=1, max_digits=2)

    def keys(ps):
        return {(min(p.meta["x"], p.meta["y"]), max(p.meta["x"], p.meta["y"])) for p in ps}

    assert len(keys(task.train)) == 2000 and len(keys(task.eval)) == 500
    assert not keys(task.train) & keys(task.eval)
    assert len({p.id for p in task.train + task.eval}) == 2500


def test_prompt_and_answer_by_hand():
    # 457 + 186 = 643, columns counted from the left (1 = hundreds, 3 = units). Units: 7 + 6 = 13
    # -> z3 = 3, carry 1 into column 2; tens: 5 + 8 + 1 = 14 -> z2 = 4, carry 1 into column 1;
    # hundreds: 4 + 1 + 1 = 6 -> z1 = 6, carry 0 out of the top (c0). Answer: z1 z2 z3 = 643.
    task = ArithTask(0, 0, 0)
    problem = Problem(
        "p", "x1_4 x2_5 x3_7 + y1_1 y2_8 y3_6 =", "643", {"n_digits": 3, "x": 457, "y": 186}
    )
    assert task.trace(problem) == " c3_0 z3_3 c2_1 z2_4 c1_1 z1_6 c0_0 \\boxed{643}"
    generated = ArithTask(0, 50, 0).train[0]
    x, y, n = generated.meta["x"], generated.meta["y"], generated.meta["n_digits"]
    assert generated.answer == str(x + y)
    assert generated.prompt.split()[0] == f"x1_{str(x).zfill(n)[0]}"
    assert generated.prompt.split()[n - 1] == f"x{n}_{x % 10}"
    assert len(generated.prompt.split()) == 2 * n + 2


def test_final_carry_is_the_leading_answer_digit():
    # 95 + 17 = 112: units 5 + 7 = 12 -> z2 2, c1 1; tens 9 + 1 + 1 = 11 -> z1 1, c0 1
    # -> "1" "1" "2"
    problem = Problem("p", "", "112", {"n_digits": 2, "x": 95, "y": 17})
    assert ArithTask(0, 0, 0).trace(problem) == " c2_0 z2_2 c1_1 z1_1 c0_1 \\boxed{112}"


def test_response_lengths_span_under_10_to_over_100_tokens(task):
    tokenizer = build_tokenizer(task.vocabulary())
    problems = task.train + task.eval
    lengths = [len(tokenizer(task.trace(p)).input_ids) + 1 for p in problems]  # + eos
    assert min(lengths) < 10 and max(lengths) > 100
    assert max(lengths) >= 8 * min(lengths)
    # 3n + 4 or 3n + 5 tokens with eos: c{n}_0, per column z and c, \boxed{, digits, }, eos
    for p, length in zip(problems, lengths):
        assert length - 3 * p.meta["n_digits"] in (4, 5)


def test_length_distribution_has_a_long_tail():
    # P(n) ∝ n^-0.75 over 1..40 gives P(1) = 0.15, P(2..5) = 0.25, P(n > 20) = 0.24. Only 55
    # one-digit problems exist, so after 55 the draws come from n >= 2, renormalised by 0.85:
    # of 3000, 55 have 1 digit, P(2..5) = 0.25/0.85 = 0.29, P(n > 20) = 0.24/0.85 = 0.28.
    n = [p.meta["n_digits"] for p in ArithTask(0, 3000, 0).train]
    assert min(n) == 1 and max(n) == 40
    assert sum(k == 1 for k in n) == 55
    assert 0.26 < sum(2 <= k <= 5 for k in n) / len(n) < 0.32
    assert 0.25 < sum(k > 20 for k in n) / len(n) < 0.31
    uniform = [p.meta["n_digits"] for p in ArithTask(0, 3000, 0, length_exponent=0).train]
    assert 0.47 < sum(k > 20 for k in uniform) / len(uniform) < 0.53


def test_noise_free_trace_always_verifies(task):
    for p in task.train + task.eval:
        assert task.verify(task.trace(p), p)


def test_verifier_on_hand_made_responses():
    task = ArithTask(0, 0, 0)
    p = Problem("p", "", "643", {})
    assert task.verify(" z0_3 c1_1 \\boxed{643}", p)
    assert task.verify("\\boxed{ 643 }", p)  # surrounding spaces are not part of the answer
    assert not task.verify("\\boxed{642}", p)
    assert not task.verify("643", p)  # no boxed answer
    assert not task.verify("\\boxed{643", p)  # unclosed: a truncated response
    assert not task.verify("", p)
    assert task.verify("\\boxed{1} then \\boxed{643}", p)  # the last boxed wins
    assert not task.verify("\\boxed{643} then \\boxed{1}", p)
    assert not task.verify("\\boxed{0643}", p)


def test_last_boxed_balances_braces():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{}") == ""
    assert last_boxed("no answer") is None


def test_noise_bug_is_the_mode_and_slips_are_rare():
    # 58 + 43: units 8 + 3 = 11 -> z2 1, c1 1; tens 5 + 4 + 1 = 10: the bug step. Correct:
    # z1 0, c0 1 -> 101. Bug: the carry in is forgotten, z1 9, c0 0 -> 91.
    task = ArithTask(0, 0, 0)
    p = Problem("p", "", "101", {"n_digits": 2, "x": 58, "y": 43})
    assert is_bug_step(5, 4, 1) and not is_bug_step(5, 4, 0) and not is_bug_step(5, 3, 1)
    rng = random.Random(0)
    traces = [task.trace(p, rng, TraceNoise(bug_rate=0.6)) for _ in range(2000)]
    assert set(traces) == {
        " c2_0 z2_1 c1_1 z1_0 c0_1 \\boxed{101}",
        " c2_0 z2_1 c1_1 z1_9 c0_0 \\boxed{91}",
    }
    wrong = sum(not task.verify(t, p) for t in traces) / len(traces)
    assert 0.56 < wrong < 0.64  # 0.6 ± 4 standard errors (sd = sqrt(0.24 / 2000) = 0.011)
    # slips: a wrong sum digit in a non-bug column, carries untouched (123 + 234 = 357, no carry)
    q = Problem("q", "", "357", {"n_digits": 3, "x": 123, "y": 234})
    slipped = [task.trace(q, rng, TraceNoise(slip_rate=0.1)) for _ in range(2000)]
    assert all(
        t.startswith(" c3_0 ") and " c2_0 " in t and " c1_0 " in t and " c0_0 " in t
        for t in slipped
    )
    # P(no slip in 3 columns) = 0.9^3 = 0.729; sd = sqrt(0.729 * 0.271 / 2000) = 0.0099
    assert 0.69 < sum(task.verify(t, q) for t in slipped) / 2000 < 0.77


def test_a_wider_bug_family_forgets_the_carry_in_at_every_listed_sum():
    # 68 + 47: units 8 + 7 = 15 -> z2 5, c1 1; tens 6 + 4 + 1 = 11: x + y = 10 with a carry in.
    # Correct: z1 1, c0 1 -> 115. With 10 in bug_sums the carry in is forgotten: 6 + 4 = 10,
    # z1 0, c0 1 -> 105. With the default family (9 only) the column is never buggy.
    task = ArithTask(0, 0, 0)
    p = Problem("p", "", "115", {"n_digits": 2, "x": 68, "y": 47})
    assert (
        is_bug_step(6, 4, 1, (9, 10))
        and not is_bug_step(6, 4, 1)
        and not is_bug_step(6, 4, 0, (9, 10))
    )
    rng = random.Random(0)
    wide = {task.trace(p, rng, TraceNoise(bug_rate=0.5, bug_sums=(9, 10))) for _ in range(200)}
    assert wide == {
        " c2_0 z2_5 c1_1 z1_1 c0_1 \\boxed{115}",
        " c2_0 z2_5 c1_1 z1_0 c0_1 \\boxed{105}",
    }
    assert {task.trace(p, rng, TraceNoise(bug_rate=0.5)) for _ in range(50)} == {
        " c2_0 z2_5 c1_1 z1_1 c0_1 \\boxed{115}"
    }
    with pytest.raises(ConfigError, match="bug_sums"):
        TraceNoise(bug_sums=(19,))


def test_noisy_trace_answer_is_read_off_the_scratchpad(task):
    rng = random.Random(1)
    for p in task.train[:200]:
        words = task.trace(p, rng, TraceNoise(bug_rate=0.9, slip_rate=0.2)).split()
        z = {int(w[1:].split("_")[0]): w.split("_")[1] for w in words if w.startswith("z")}
        final_carry = words[-2]
        assert final_carry.startswith("c0_")
        expected = ("1" if final_carry == "c0_1" else "") + "".join(
            z[c] for c in range(1, len(z) + 1)
        )
        assert last_boxed(words[-1]) == expected


def test_vocabulary_covers_every_trace_and_prompt_word(task):
    vocab = set(task.vocabulary())
    for p in task.train[:100]:
        assert set(p.prompt.split()) <= vocab
        assert set(task.trace(p).split()[:-1]) <= vocab  # the last is \boxed{digits}
    assert len(vocab) == len(task.vocabulary()) == 3 * 40 * 10 + 41 * 2 + 3


def test_build_task_registry_and_errors():
    assert isinstance(build_task("arith", seed=0, n_train=5, n_eval=5), ArithTask)
    with pytest.raises(ConfigError, match="did you mean arith"):
        build_task("arth", seed=0, n_train=5, n_eval=5)
    with pytest.raises(ConfigError, match="min_digits, max_digits, length_exponent and readout"):
        build_task("arith", seed=0, n_train=5, n_eval=5, digits=3)
    with pytest.raises(ConfigError, match="exceeds the 55 distinct"):
        ArithTask(0, 50, 10, min_digits=1, max_digits=1)
    with pytest.raises(ValueError, match="already registered"):
        register_task("arith", ArithTask)
    with pytest.raises(ConfigError, match="length_exponent=-1"):
        ArithTask(0, 5, 5, length_exponent=-1)
    with pytest.raises(ConfigError, match="bug_rate"):
        TraceNoise(bug_rate=1.5)


def test_labelled_readout_by_hand():
    task = ArithTask(0, 0, 0, max_digits=3, readout="labelled")
    # 457 + 186 = 643: columns from the left 4+1, 5+8, 7+6; no final carry
    p = Problem("p", "", "643", {"n_digits": 3, "x": 457, "y": 186})
    assert task.trace(p) == " c3_0 z3_3 c2_1 z2_4 c1_1 z1_6 c0_0 \\boxed{ r1_6 r2_4 r3_3 }"
    assert task.verify(task.trace(p), p)
    assert task.verify("\\boxed{r1_6 r2_4 r3_3}", p)
    assert not task.verify("\\boxed{643}", p)  # plain digits are not the labelled answer
    assert not task.verify("\\boxed{ r1_6 r3_4 r3_3 }", p)  # a digit under a wrong label
    assert not task.verify("\\boxed{ r1_6 r2_4 }", p)  # a digit missing
    assert not task.verify("\\boxed{ r0_0 r1_6 r2_4 r3_3 }", p)  # no final carry to write
    # 957 + 186 = 1143: the final carry is r0_1
    q = Problem("q", "", "1143", {"n_digits": 3, "x": 957, "y": 186})
    assert task.trace(q).endswith("c0_1 \\boxed{ r0_1 r1_1 r2_4 r3_3 }")
    assert task.verify(task.trace(q), q)
    assert not task.verify("\\boxed{ r1_1 r2_4 r3_3 }", q)


def test_labelled_readout_tokens_and_noise():
    task = ArithTask(0, 300, 50, max_digits=100, readout="labelled")
    tok = build_tokenizer(task.vocabulary())
    rng = random.Random(0)
    for p in task.train[:100]:
        trace = task.trace(p)
        assert task.verify(trace, p)
        # one token a word: 3n + 3 (+1 with a final carry), like the plain read-out
        n, carry = p.meta["n_digits"], len(p.answer) > p.meta["n_digits"]
        assert len(tok(trace).input_ids) == 3 * n + 3 + carry
        noisy = task.trace(p, rng, TraceNoise(slip_rate=1.0))
        # every column slipped: the read-out copies the wrong digits
        assert not task.verify(noisy, p)
    lengths = [3 * p.meta["n_digits"] + 3 for p in task.train]
    assert min(lengths) <= 10 and max(lengths) >= 250


def test_unknown_readout_is_a_one_line_error():
    with pytest.raises(ConfigError, match="readout='boxed' is not one of"):
        ArithTask(0, 1, 1, readout="boxed")
