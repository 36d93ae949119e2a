r"""Matching answers: a hand-checked table of responses, and grade_many's time limit and crash
handling."""

import ast
import multiprocessing
import os
import random
import subprocess
import sys
import time

import pytest

from vapo_lab.grading import extract_answer, grade, grade_many
from vapo_lab.grading import match as grading_match

# (response, reference, integer set?, extracted answer, correct), each checked by hand.
CASES = [
    # leading zeros: AIME answers are written 000-999
    (r"The answer is \boxed{025}.", "25", True, "025", True),
    (r"\boxed{007}", "7", True, "007", True),
    (r"\boxed{0}", "0", True, "0", True),
    # fractions vs decimals: 1/2 = 0.5 exactly; 0.33 ≠ 1/3 (math-verify rounds to 6 digits)
    (r"\boxed{\frac{1}{2}}", "0.5", False, r"\frac{1}{2}", True),
    (r"\boxed{0.5}", r"\frac{1}{2}", False, "0.5", True),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12", False, r"\dfrac{1}{2}", True),
    (r"\boxed{0.33}", r"\frac{1}{3}", False, "0.33", False),
    # several boxed answers: the last wins
    (r"First \boxed{3}, then \boxed{5}", "5", True, "5", True),
    (r"First \boxed{3}, then \boxed{5}", "3", True, "5", False),
    # no answer at all
    ("I do not know.", "5", True, None, False),
    ("", "5", False, None, False),
    (r"\boxed{}", "1", False, None, False),
    # unbalanced braces: a truncated answer is no answer, even after an Answer: line
    (r"\boxed{12", "12", True, None, False),
    (r"\boxed{\frac{1}{2}", "1/2", False, None, False),
    ("Answer: 12\nso \\boxed{12", "12", True, None, False),
    # units
    (r"\boxed{5\text{ cm}}", "5", False, r"5\text{ cm}", True),
    (r"\boxed{5 \text{ cm}}", "5", True, r"5 \text{ cm}", True),
    # degrees
    (r"\boxed{30^\circ}", "30", True, r"30^\circ", True),
    (r"\boxed{30^{\circ}}", "30", True, r"30^{\circ}", True),
    (r"\boxed{45°}", "45", True, "45°", True),
    # text answers
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", False, r"\text{Evelyn}", True),
    (r"\boxed{Evelyn}", r"\text{Evelyn}", False, "Evelyn", True),
    (r"\boxed{\text{(C)}}", r"\text{(C)}", False, r"\text{(C)}", True),
    # intervals: open and closed ends differ
    (r"\boxed{[1,2)}", "(1,2]", False, "[1,2)", False),
    (r"\boxed{[1,2)}", "[1,2)", False, "[1,2)", True),
    (r"\boxed{(-\infty, 0]}", r"(-\infty, 0]", False, r"(-\infty, 0]", True),
    (r"\boxed{(1,2)}", "(2,1)", False, "(1,2)", False),  # ordered pair, not a set
    # very long garbage: no answer, or the box at its end
    ("x" * 200_000, "1", False, None, False),
    ("\\boxed{" + "{" * 50_000, "1", False, None, False),
    ("z" * 100_000 + r" \boxed{42}", "42", True, "42", True),
    # thousands separators
    (r"\boxed{1,000}", "1000", True, "1,000", True),
    (r"\boxed{1{,}000}", "1000", True, "1{,}000", True),
    (r"\boxed{10,080}", r"10,\!080", False, "10,080", True),
    # negative numbers, also with a Unicode minus sign
    (r"\boxed{-5}", "-5", True, "-5", True),
    (r"\boxed{-5}", "5", True, "-5", False),
    ("\\boxed{\u22125}", "-5", True, "\u22125", True),
    # square roots: 2√2 = √8, √2/2 = 1/√2, √3 ≠ 1.732 to 6 digits
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", False, r"2\sqrt{2}", True),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", False, r"\frac{\sqrt{2}}{2}", True),
    (r"\boxed{\sqrt{3}}", "1.732", False, r"\sqrt{3}", False),
    # other box forms
    (r"\boxed 5", "5", True, "5", True),
    (r"so $\boxed 9$.", "9", True, "9", True),
    (r"\fbox{7}", "7", True, "7", True),
    # DAPO's Answer: line, the last one wins
    ("Answer: 42", "42", True, "42", True),
    ("Work...\nAnswer: $042$.", "42", True, "$042$.", True),
    ("answer: 17\nAnswer: 18", "18", True, "18", True),
    # wrappers and trailing periods
    (r"\boxed{25.}", "25", True, "25.", True),
    (r"\boxed{$25$}", "25", True, "$25$", True),
    (r"\boxed{\mbox{12}}", "12", True, r"\mbox{12}", True),
    # integer sets take integer literals only: 50/2 is 25 but is not an AIME answer
    (r"\boxed{\frac{50}{2}}", "25", True, r"\frac{50}{2}", False),
    (r"\boxed{m+n=25}", "25", True, "m+n=25", True),
    (r"\boxed{18.00}", "18", True, "18.00", True),
    (r"\boxed{18.5}", "18", True, "18.5", False),
    # GSM8K-style dollars and percent
    (r"\boxed{\$18}", "18", True, r"\$18", True),
    (r"\boxed{25\%}", "25", True, r"25\%", True),
    # symbolic equivalence
    (r"\boxed{x^2+2x+1}", "(x+1)^2", False, "x^2+2x+1", True),
    (r"\boxed{x = 3}", "3", False, "x = 3", True),
    (r"\boxed{\pi}", "3.14", False, r"\pi", False),
    # Markdown emphasis around DAPO's Answer: line: the value is the number, not "** 73"
    ("**Answer:** 73", "73", True, "73", True),
    ("**Answer: 73**", "73", True, "73", True),
    ("Answer: **73**", "73", True, "73", True),
    ("**Final Answer:** 73", "73", True, "73", True),
    ("**Answer**: 73", "73", True, "73", True),
    ("__Answer:__ 73", "73", True, "73", True),
    ("*Answer:* 73", "73", True, "73", True),
    ("Work...\n**Answer:** **$073$**.", "73", True, "$073$.", True),
    ("**Answer:** 72", "73", True, "72", False),
    ("Answer: z^*", "z^*", False, "z^*", True),  # a star after ^ is a conjugate, not emphasis
    # nested and escaped braces
    (r"\boxed{\{1,2\}}", r"\{2,1\}", False, r"\{1,2\}", True),
    (
        r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}",
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
        False,
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
        True,
    ),
]


@pytest.mark.parametrize(("response", "reference", "integer", "answer", "correct"), CASES)
def test_hand_checked_table(response, reference, integer, answer, correct):
    assert extract_answer(response) == answer
    assert grade(response, reference, integer) is correct


def test_table_is_large_enough():
    assert len(CASES) >= 40


@pytest.mark.parametrize("integer", [True, False])
def test_grade_many_matches_the_table_exactly(integer):
    cases = [c for c in CASES if c[2] is integer]
    results = grade_many([c[0] for c in cases], [c[1] for c in cases], integer=integer, workers=2)
    assert [(r.answer, r.correct) for r in results] == [(c[3], c[4]) for c in cases]
    assert [r.status for r in results] == ["no_answer" if c[3] is None else "ok" for c in cases]


# --- any thread: the limit holds off the main thread ---------------------------------
# math-verify's limit is SIGALRM, which only the main thread receives; elsewhere a power tower ran
# for minutes holding the GIL, so the script runs in a child process that can always be killed.
_ON_A_THREAD = r"""
import threading, time
from vapo_lab.grading import grade
cases = [("tower", r"\boxed{9^{9^{9^{9}}}}", "1", 5.0),   # refused by the pre-check
         # passes the pre-checks: killed at 2 s
         ("slow", r"\boxed{(9)^{(9)^{(9)^{(9)}}}}", "1", 2.0),
         ("half", r"\boxed{\frac{1}{2}}", "0.5", 5.0)]  # a symbolic comparison off the main thread
out = {}
def run():
    for name, response, reference, limit in cases:
        start = time.perf_counter()
        out[name] = (grade(response, reference, timeout_s=limit), time.perf_counter() - start)
thread = threading.Thread(target=run)
thread.start()
thread.join()
print(repr(out))
"""


def test_grade_is_time_bounded_on_any_thread():
    done = subprocess.run(
        [sys.executable, "-c", _ON_A_THREAD], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert {name: verdict for name, (verdict, _) in out.items()} == {
        "tower": False,
        "slow": False,
        "half": True,
    }
    assert all(seconds < 20 for _, seconds in out.values()), out  # minutes before


# --- grade_many: hangs and crashes -------------------------------------------------------------
# The hook replaces the comparison in the workers. Only a caller passing match_fn can reach it;
# the references that trigger it never come from model output.


def _hook(answer, reference, integer):
    """Sleeps for reference HANG, raises for RAISE, kills its process for DIE, else compares."""
    if reference == "HANG":
        time.sleep(60)
    if reference == "RAISE":
        raise ValueError("bad sample")
    if reference == "DIE":
        os._exit(3)
    return answer == reference


def test_hanging_and_crashing_samples_are_reported_and_the_rest_graded():
    references = ["1", "HANG", "2", "DIE", "1", "RAISE", "HANG", "1", "2", "1"]
    responses = [r"\boxed{1}"] * len(references)
    start = time.perf_counter()
    results = grade_many(
        responses, references, integer=True, timeout_s=1.0, workers=2, match_fn=_hook
    )
    elapsed = time.perf_counter() - start
    assert [r.status for r in results] == [
        "ok",
        "timeout",
        "ok",
        "error",
        "ok",
        "error",
        "timeout",
        "ok",
        "ok",
        "ok",
    ]
    assert [r.correct for r in results] == [
        True,
        False,
        False,
        False,
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    assert "exit code 3" in results[3].detail and "ValueError: bad sample" in results[5].detail
    # a killed worker's sample has no answer
    assert results[5].answer == "1" and results[1].answer is None
    assert elapsed < 30  # two 1 s timeouts plus restarts; never the 60 s sleep
    assert multiprocessing.active_children() == []  # hung workers were killed, idle ones ended


def test_grade_many_edge_cases():
    assert grade_many([], [], integer=True) == []
    with pytest.raises(ValueError, match="2 responses but 1 references"):
        grade_many(["a", "b"], ["a"], integer=True)
    with pytest.raises(ValueError, match="timeout_s=0"):
        grade_many(["a"], ["a"], integer=True, timeout_s=0)


def test_grade_never_raises(monkeypatch):
    def boom(*args):
        raise RuntimeError("sympy blew up")

    monkeypatch.setattr(grading_match, "_symbolic_equal", boom)
    assert grade(r"\boxed{x+1}", "1+x") is False


def test_random_adversarial_strings_are_all_graded():
    # LaTeX fragments glued at random, some with a final box: every sample must come back with
    # a status, none may stop the batch (the 10,000-string run took 38 s on 2 cores:
    # 5074 ok, 4921 no_answer, 5 timeouts, all on 10^{10^{10}}, which sympy tries to expand)
    pieces = [
        "\\boxed{",
        "}",
        "{",
        "\\frac",
        "\\sqrt",
        "^",
        "(",
        ")",
        "[",
        "]",
        ",",
        "\\text{",
        "$",
        "\\",
        " ",
        "\n",
        "Answer:",
        "=",
        "\\infty",
        "\\pi",
        "-",
        "1",
        "0",
        "x",
        "\\{",
        "\\}",
        "\\fbox{",
        "\\boxed ",
    ]
    rng = random.Random(0)
    responses = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    results = grade_many(
        responses, ["\\frac{1}{2}"] * len(responses), integer=False, timeout_s=5.0, workers=2
    )
    assert len(results) == 300 and {r.status for r in results} <= {"ok", "no_answer", "timeout"}
    assert all(not r.correct for r in results if r.status != "ok")
