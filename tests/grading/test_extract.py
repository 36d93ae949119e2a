"""Extracting the final answer and normalising it: shared with the tasks, and linear on
adversarial text."""

import time

from vapo_lab.grading import extract_answer, grade, last_boxed, normalize_answer


def test_one_extractor_is_shared_with_the_tasks():
    from vapo_lab import tasks
    from vapo_lab.tasks import math as math_task

    assert tasks.last_boxed is last_boxed and math_task.grade is grade
    assert last_boxed(r"a \boxed{\frac{1}{2}} b") == r"\frac{1}{2}"
    assert last_boxed(r"\boxedx{1} \boxed{2} \boxedy{3}") == "2"  # look-alike commands are skipped


def test_normalised_keys_group_equal_answers():
    assert normalize_answer("025", integer=True) == normalize_answer("25", integer=True) == "25"
    assert normalize_answer(r"\dfrac{1}{2}") == normalize_answer(r"\frac{1}{2}") == r"\frac{1}{2}"
    assert normalize_answer(r"$\text{ 1,234 }$.") == "1234"
    assert normalize_answer("0.5") != normalize_answer(r"\frac{1}{2}")  # symbolic only: vote apart


def test_extraction_is_linear_on_adversarial_text():
    # a quadratic regex or brace scan would take minutes on these
    texts = [
        "Answer:" + " " * 200_000 + "x",
        "\\boxedx" * 50_000,
        "\\fbox{" * 50_000,
        "$" * 200_000,
        "Answer" + " " * 200_000 + "x",
        "Answer:" + " *" * 100_000 + "x",
        "Answer: 1" + "* " * 100_000,
    ]
    start = time.perf_counter()
    for text in texts:
        extract_answer(text)
        normalize_answer(text)
    assert time.perf_counter() - start < 5.0
