"""Scoring graded records: avg@N, its SE and CI, pass@k, maj@N, grader failures, MLflow names."""

import pytest

from vapo_lab.eval.scoring import compute_metrics, metric_names
from vapo_lab.tasks import Problem


def test_metrics_of_hand_made_records():
    # problem a: 1 of 2 right ("5" twice: the majority is right); b: 0 of 2, no answer once
    problems = [Problem("a", "?", "5"), Problem("b", "?", "7")]
    records = [
        {
            "problem_id": "a",
            "correct": True,
            "extracted_answer": "5",
            "length": 4,
            "finish_reason": "stop",
        },
        {
            "problem_id": "a",
            "correct": False,
            "extracted_answer": "6",
            "length": 6,
            "finish_reason": "length",
        },
        {
            "problem_id": "b",
            "correct": False,
            "extracted_answer": None,
            "length": 10,
            "finish_reason": "length",
        },
        {
            "problem_id": "b",
            "correct": False,
            "extracted_answer": "8",
            "length": 8,
            "finish_reason": "stop",
        },
    ]
    m, rows = compute_metrics(records, problems, integer=True)
    # avg@2 = (1/2 + 0)/2 = 0.25; SE = std([0.5, 0], ddof=1)/√2 = 0.3536/1.414 = 0.25
    assert m["avg_at_2"] == pytest.approx(0.25, abs=1e-12) and m["avg_at_2_se"] == pytest.approx(
        0.25, abs=1e-12
    )
    # pass@2: a has a right one among its 2 → 1, b → 0
    assert m["pass_at_k"] == {"1": pytest.approx(0.25), "2": pytest.approx(0.5)}
    # maj@2: a ties 5 vs 6, first appearance wins → right; b → wrong
    assert m["maj_at_2"] == pytest.approx(0.5)
    assert (m["response_length"], m["truncated_frac"]) == (7.0, 0.5)
    assert rows[0]["majority_answer"] == "5" and rows[1]["accuracy"] == 0.0
    names = metric_names("aime24", m)
    assert names["eval/aime24/avg_at_2"] == 0.25 and "eval/aime24/pass_at_2" in names
    assert "eval/aime24/avg_at_2_ci95_low" in names and not any("@" in k for k in names)


def test_grader_timeouts_and_errors_are_counted_apart():
    # 4 samples of one problem: 2 timed out, 1 crashed, 1 graded; all 4 count wrong
    problems = [Problem("a", "?", "5")]
    records = [
        {"problem_id": "a", "correct": False, "extracted_answer": None, "grade_status": status}
        for status in ("timeout", "ok", "error", "timeout")
    ]
    m, _ = compute_metrics(records, problems, integer=False)
    assert (m["grade_timeouts"], m["grade_errors"], m["avg_at_4"]) == (2, 1, 0.0)
    names = metric_names("math500", m)
    assert (names["eval/math500/grade_timeouts"], names["eval/math500/grade_errors"]) == (2.0, 1.0)
