"""Tests for vapo_lab.eval.strata: per-stratum accuracy and the evaluation's stratum metrics, by
hand."""

import pytest

from vapo_lab.eval.strata import accuracy_by_stratum, response_labels, stratum_metrics
from vapo_lab.tasks import Problem
from vapo_lab.tasks.arithfree import ArithFreeTask, answer_words


def test_accuracy_by_stratum_by_hand():
    assert accuracy_by_stratum([1, 0, 1, 1], ["a", "a", "b", "b"]) == {"a": 0.5, "b": 1.0}
    assert accuracy_by_stratum([False, False, True], ["x", "y", "y"]) == {"x": 0.0, "y": 0.5}
    assert accuracy_by_stratum([], []) == {}
    with pytest.raises(ValueError):
        accuracy_by_stratum([True], [])


def test_stratum_metrics_by_hand():
    labels = [("d01_03", "direct"), ("d01_03", "full"), ("d04_08", "partial"), ("d04_08", "full")]
    out = stratum_metrics(labels, [True, True, False, True], [3, 9, 20, 30])
    assert out == {
        "eval/acc_d01_03": 1.0,
        "eval/acc_d04_08": 0.5,
        "eval/length_d01_03": 6.0,
        "eval/length_d04_08": 25.0,
        "eval/full_d01_03": 0.5,
        "eval/full_d04_08": 0.5,
        "eval/mode_share_direct": 0.25,
        "eval/mode_share_full": 0.5,
        "eval/mode_share_partial": 0.25,
        "eval/mode_acc_direct": 1.0,
        "eval/mode_acc_full": 1.0,
        "eval/mode_acc_partial": 0.0,
    }


def test_stratum_metrics_without_modes():
    out = stratum_metrics([("a", None), ("b", None)], [True, False], [4, 6], prefix="x/")
    assert out == {"x/acc_a": 1.0, "x/acc_b": 0.0, "x/length_a": 4.0, "x/length_b": 6.0}


def test_response_labels_follow_the_sampling_order():
    task = ArithFreeTask(0, 0, 0)
    short = Problem("s", "", " ".join(answer_words(5, 2, 1)), {"n_digits": 1, "x": 5, "y": 2})
    long = Problem(
        "l", "", " ".join(answer_words(12345, 1, 5)), {"n_digits": 5, "x": 12345, "y": 1}
    )
    texts = [
        task.trace(short, columns=0),
        task.trace(short),
        task.trace(long, columns=2),
        task.trace(long),
    ]
    assert response_labels(task, [short, long], texts, 2) == [
        ("d01_03", "direct"),
        ("d01_03", "full"),
        ("d04_08", "partial"),
        ("d04_08", "full"),
    ]
    assert (
        response_labels(object(), [short], texts[:1], 1) is None
    )  # a task without strata: no metrics
