"""Tests for vapo_lab.tasks.arithfree: problems, trace format by hand, the guess rule, verifier,
strata."""

import random
from collections import Counter

import pytest

from vapo_lab.errors import ConfigError
from vapo_lab.models.tokenizer import build_tokenizer
from vapo_lab.tasks import Problem, build_task
from vapo_lab.tasks.arith import TraceNoise
from vapo_lab.tasks.arithfree import (
    ArithFreeTask,
    LengthChoice,
    answer_words,
    guess_is_right,
    stratum_label,
)


def problem(x: int, y: int, n: int) -> Problem:
    return Problem("p", "", " ".join(answer_words(x, y, n)), {"n_digits": n, "x": x, "y": y})


@pytest.fixture(scope="module")
def task():
    return ArithFreeTask(seed=0, n_train=600, n_eval=200)


def test_built_by_name_with_the_trainer_keys():
    t = build_task(
        "arithfree",
        seed=0,
        n_train=5,
        n_eval=5,
        train_path=None,
        eval_path=None,
        problem_key="problem",
        answer_key="answer",
        prompt_template="{problem}",
        max_digits=8,
    )
    assert isinstance(t, ArithFreeTask) and len(t.train) == 5


def test_bad_options_are_config_errors():
    with pytest.raises(ConfigError, match="readout"):
        ArithFreeTask(0, 1, 1, readout="plain")
    with pytest.raises(ConfigError, match="strata"):
        ArithFreeTask(0, 1, 1, strata=[2, 5])  # first edge above min_digits 1
    with pytest.raises(ConfigError, match="train_path"):
        ArithFreeTask(0, 1, 1, train_path="x.jsonl")
    with pytest.raises(ConfigError, match="exceeds"):
        ArithFreeTask(0, 50, 10, max_digits=1)  # 55 one-digit pairs


def test_splits_disjoint_deterministic_and_eval_independent_of_train(task):
    def key(p):
        return (
            p.meta["n_digits"],
            min(p.meta["x"], p.meta["y"]),
            max(p.meta["x"], p.meta["y"]),
        )

    assert not {key(p) for p in task.train} & {key(p) for p in task.eval}
    assert ArithFreeTask(0, 10, 200).eval == task.eval
    assert ArithFreeTask(0, 600, 200).train == task.train


def test_leading_zeros_occur_in_every_column(task):
    # the arith hole: x1_0 only ever in 1-digit problems. Here the leading digit is 0 about 10% of
    # the time
    firsts = Counter(
        p.prompt.split()[0].split("_")[1] for p in task.train if p.meta["n_digits"] > 1
    )
    assert firsts["0"] > 0.05 * sum(firsts.values())
    words = {w for p in task.train for w in p.prompt.split()}
    assert {"x1_0", "y1_0", "x5_0"} <= words


def test_answer_words_by_hand():
    assert answer_words(457, 186, 3) == ["r1_6", "r2_4", "r3_3"]
    assert answer_words(95, 17, 2) == ["r0_1", "r1_1", "r2_2"]  # 112: final carry
    assert answer_words(3, 4, 2) == ["r1_0", "r2_7"]  # 03 + 04 = 07, leading zero kept


def test_full_trace_by_hand():
    # 457 + 186 = 643: units 7+6=13 -> z3 3 c2 1; tens 5+8+1=14 -> z2 4 c1 1; hundreds 4+1+1=6 ->
    # z1 6 c0 0
    t = ArithFreeTask(0, 0, 0)
    p = problem(457, 186, 3)
    assert t.trace(p) == " c3_0 z3_3 c2_1 z2_4 c1_1 z1_6 c0_0 \\boxed{ r1_6 r2_4 r3_3 }"
    assert t.verify(t.trace(p), p)


def test_partial_and_direct_traces_guess_without_carries():
    t = ArithFreeTask(0, 0, 0)
    p = problem(457, 186, 3)
    # one worked column (units: 3, carry 1), then guesses 4+1=5 and 5+8=13 -> 3, dropping both
    # carries
    assert t.trace(p, columns=1) == " c3_0 z3_3 c2_1 \\boxed{ r1_5 r2_3 r3_3 }"
    assert t.trace(p, columns=0) == " \\boxed{ r1_5 r2_3 r3_3 }"
    assert not t.verify(t.trace(p, columns=1), p)
    # the guessed top column's overflow is the final carry: 9 + 3 = 12 -> r0_1 r1_2, right
    q = problem(9, 3, 1)
    assert t.trace(q, columns=0) == " \\boxed{ r0_1 r1_2 }" and t.verify(t.trace(q, columns=0), q)
    # 52 + 61 = 113: no carry crosses a column, so the direct guess is right
    r = problem(52, 61, 2)
    assert t.trace(r, columns=0) == " \\boxed{ r0_1 r1_1 r2_3 }" and t.verify(
        t.trace(r, columns=0), r
    )


def test_guess_is_right_matches_the_written_trace(task):
    for p in task.eval[:80]:
        x, y, n = p.meta["x"], p.meta["y"], p.meta["n_digits"]
        for m in range(n + 1):
            assert guess_is_right(x, y, n, m) == task.verify(task.trace(p, columns=m), p), (
                x,
                y,
                n,
                m,
            )
        assert task.verify(task.trace(p, columns=task.min_columns(p)), p)


def test_min_columns_by_hand():
    t = ArithFreeTask(0, 0, 0)
    # 457 + 186: the tens (5 + 8 + 1) carry into the hundreds, so every column must be worked
    assert t.min_columns(problem(457, 186, 3)) == 3
    # 415 + 125 = 540: the units carry into the tens; tens 1 + 2 + 1 = 4 carry nothing; guess 4 + 1
    assert t.min_columns(problem(415, 125, 3)) == 2
    assert t.min_columns(problem(52, 61, 2)) == 0
    assert t.min_columns(problem(5, 7, 1)) == 0  # every 1-digit problem: the direct answer is right
    assert t.min_columns(problem(19, 1, 2)) == 2  # 19 + 01: the units carry into the tens
    assert t.min_columns(problem(91, 10, 2)) == 0  # 101: only the top column overflows


def test_tokens_by_mode_and_length_span():
    t = ArithFreeTask(0, 0, 0, max_digits=32)
    tok = build_tokenizer(t.vocabulary())
    short = problem(1, 2, 1)
    long = problem(10**32 - 1, 1, 32)

    def count(p, m):
        return len(tok(t.trace(p, columns=m)).input_ids)

    assert count(short, 0) == 3  # \boxed{ r1_3 }
    assert count(long, None) == 3 * 32 + 4  # c32_0, 32 x (z, c), \boxed{, r0_1 + 32 digits, }
    assert (
        count(long, 5) == 1 + 2 * 5 + 1 + 32 + 1
    )  # the guessed top column 9 + 0 does not overflow
    assert count(long, None) / count(short, 0) > 30


def test_noisy_partial_trace_copies_its_own_wrong_step():
    t = ArithFreeTask(0, 0, 0)
    p = problem(
        45, 55, 2
    )  # units 5+5=10 -> carry 1; tens 4+5+1: bug family (x+y=9 with a carry in)
    bugged = t.trace(p, random.Random(0), TraceNoise(bug_rate=1.0, bug_sums=(9,)))
    assert bugged == " c2_0 z2_0 c1_1 z1_9 c0_0 \\boxed{ r1_9 r2_0 }"
    assert not t.verify(bugged, p)


def test_length_choice_draws():
    rng = random.Random(0)
    assert LengthChoice().draw(7, rng) == 7  # no stops: the full trace
    assert LengthChoice(direct_rate=1.0).draw(7, rng) == 0
    draws = [LengthChoice(stop_rate=0.5).draw(3, rng) for _ in range(4000)]
    share = Counter(draws)
    assert set(share) == {1, 2, 3}
    assert abs(share[1] / 4000 - 0.5) < 0.03 and abs(share[2] / 4000 - 0.25) < 0.03
    with pytest.raises(ConfigError):
        LengthChoice(stop_rate=1.5)


def test_verify_reads_only_the_last_box():
    t = ArithFreeTask(0, 0, 0)
    p = problem(52, 61, 2)
    assert t.verify("\\boxed{ r1_0 } junk \\boxed{ r0_1 r1_1 r2_3 }", p)
    assert not t.verify("\\boxed{ r0_1 r1_1 r2_3 } \\boxed{ r1_0 }", p)
    assert not t.verify(" \\boxed{ r0_1 r1_1 r2_3", p)  # unclosed: truncated
    assert not t.verify(" \\boxed{ r0_1 r2_3 r1_1 }", p)  # a digit under a wrong label


def test_classify_modes():
    t = ArithFreeTask(0, 0, 0)
    p = problem(457, 186, 3)
    assert t.classify(t.trace(p), p) == ("full", 3)
    assert t.classify(t.trace(p, columns=1), p) == ("partial", 1)
    assert t.classify(t.trace(p, columns=0), p) == ("direct", 0)
    assert t.classify(" c3_0 z3_3 c2_1", p) == ("other", 1)


def test_strata_labels_by_hand(task):
    assert stratum_label(1) == "d01_03" and stratum_label(3) == "d01_03"
    assert stratum_label(4) == "d04_08" and stratum_label(16) == "d09_16"
    assert stratum_label(17, max_digits=32) == "d17_32" and stratum_label(40) == "d17_up"
    assert {task.stratum(p) for p in task.eval} == {"d01_03", "d04_08", "d09_16", "d17_32"}


def test_no_stratum_is_structurally_unsolvable(task):
    # every problem's full trace is right and fits the vocabulary: no class of problems is 0% by
    # construction
    tok = build_tokenizer(task.vocabulary())
    for p in task.train[:300] + task.eval:
        text = task.trace(p)
        assert task.verify(text, p)
        assert tok.decode(tok(text).input_ids) == text
        assert all(tok.convert_ids_to_tokens(i).lstrip("Ġ") for i in tok(text).input_ids)
        assert len(tok(text).input_ids) == len(text.split())  # one token a word
