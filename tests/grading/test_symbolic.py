"""The pre-checks before math-verify: huge, deeply nested and power-tower answers are graded fast,
right ones still right."""

import time

from vapo_lab.grading import grade, grade_many, symbolic

# --- large and pathological answers -------------------------------------------------
# math-verify's time grows with an answer's length and steeply with its nesting, and sympy expands
# integer powers: before the pre-checks each of these ran into the 5 s limit (and counted wrong).
PATHOLOGICAL = [
    ("\\boxed{" + "1" * 1_000_000 + "}", r"\frac{1}{2}"),  # a 1 MB number
    ("\\boxed{" + "1+" * 500_000 + "1}", r"\frac{1}{2}"),  # a 1 MB sum
    ("\\boxed{\\text{" + "a " * 500_000 + "}}", r"\frac{1}{2}"),  # 1 MB of text
    ("\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}", "2"),  # braces nested 5000 deep
    ("\\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}", "2"),  # parentheses nested 2000 deep
    ("\\boxed{" + "\\frac{1}{" * 30 + "2" + "}" * 30 + "}", "2"),  # fractions nested 30 deep
    (r"\boxed{9^{9^{9^{9}}}}", "1"),  # a power tower: 9^{9^9} alone has 369,693,100 digits
    (r"\boxed{10^{10^{10}}}", "1"),
]


def test_huge_and_deeply_nested_answers_are_graded_wrong_fast():
    for response, reference in PATHOLOGICAL:
        start = time.perf_counter()
        assert grade(response, reference) is False
        assert time.perf_counter() - start < 2.5, response[:40]  # was 5 s each (the limit)


def test_grade_many_grades_them_within_the_limit():
    # status "ok" (graded: wrong) for all 8, where all but the 30-deep fractions were a "timeout"
    results = grade_many(
        [r for r, _ in PATHOLOGICAL],
        [g for _, g in PATHOLOGICAL],
        integer=False,
        timeout_s=5.0,
        workers=2,
    )
    assert [(r.status, r.correct) for r in results] == [("ok", False)] * len(PATHOLOGICAL)


def test_pre_checks_keep_right_answers_right():
    # whitespace is not length: "73" padded with 1 MB of spaces is 73, and "x^2 + 2x + 1" so padded
    # still reaches math-verify (runs of spaces collapse to one before the length check)
    assert grade("\\boxed{73" + " " * 1_000_000 + "}", "73", integer=True)
    assert grade("\\boxed{x^2 + 2x" + " " * 1_000_000 + "+ 1}", "(x+1)^2")
    # small towers are still evaluated: 2^{2^2} = 2^4 = 16
    assert grade(r"\boxed{2^{2^{2}}}", "16") and grade(r"\boxed{2^{10}}", "1024")
    # a continued fraction nested 3 deep: 1/(1 + 1/(1 + 1/2)) = 1/(1 + 2/3) = 3/5
    assert grade(r"\boxed{\frac{1}{1+\frac{1}{1+\frac{1}{2}}}}", r"\frac{3}{5}")
    # 399 characters, within the limit of 400: 0+0+...+0+1 = 1 (4 x the reference's 1 character is
    # less)
    assert grade("\\boxed{" + "0+" * 199 + "1}", "1")
    # 403 characters: past it, so compared as text only
    assert not grade("\\boxed{" + "0+" * 201 + "1}", "1")


def test_pre_check_measures():
    # depth counts unescaped ( [ { : \{ is a set brace, written as text
    assert symbolic._nesting_depth(r"\left\{ (a+[b]) \right\}") == 2
    assert symbolic._nesting_depth("{{x}}") == 2 and symbolic._nesting_depth("x)(") == 1
    # digits of integer powers: 2^10 = 1024 has 4; 9^{9^9} = 9^387420489 has
    # floor(387420489 * log10 9) + 1 = floor(369693099.63) + 1 = 369,693,100
    assert symbolic._power_digits(r"2^{10}") == 4 and symbolic._power_digits("2^10") == 4
    assert symbolic._power_digits(r"9^{9^{9}}") == 369_693_100
    assert symbolic._power_digits(r"9^{9^{9^{9}}}") == float("inf")
    # the limit is 10,000 digits: 2^33219 has floor(9999.92) + 1 = 10,000, 2^33220 has 10,001
    assert (
        symbolic._power_digits(r"2^{33219}") == 10_000
        and symbolic._power_digits(r"2^{33220}") == 10_001
    )
    # only integer powers count: in x^{9^{9}} that is 9^9 = 387,420,489 (9 digits); 9^{x} has none
    assert symbolic._power_digits(r"x^{9^{9}}") == 9 and symbolic._power_digits(r"9^{x}") == 0
