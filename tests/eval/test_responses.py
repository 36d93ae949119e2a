"""`--responses` mode: responses generated elsewhere graded exactly as the hand-checked grader
table says."""

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.eval.responses import grade_responses
from vapo_lab.eval.settings import EvalError, EvalSettings


def _table():
    """Returns test_match.CASES: (response, reference, integer set?, extracted answer, correct)."""
    spec = importlib.util.spec_from_file_location(
        "_grader_table", Path(__file__).parents[1] / "grading" / "test_match.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


CASES = _table()


def _files(tmp_path, integer):
    """Writes a benchmark (one problem per case) and a responses file; returns their paths and the
    cases."""
    cases = [c for c in CASES if c[2] is integer]
    data, responses = tmp_path / f"table-{integer}.jsonl", tmp_path / f"responses-{integer}.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"case-{i}", "problem": "?", "answer": c[1]}) + "\n"
            for i, c in enumerate(cases)
        )
    )
    responses.write_text(
        "".join(
            json.dumps({"problem_id": f"case-{i}", "response": c[0]}) + "\n"
            for i, c in enumerate(cases)
        )
    )
    return data, responses, cases


@pytest.mark.parametrize("integer", [True, False])
def test_responses_are_graded_as_the_hand_checked_table(tmp_path, integer):
    data, responses, cases = _files(tmp_path, integer)
    r = grade_responses(None, responses, data=data, out_dir=tmp_path / "out", track=False)
    # every reference of the integer half is an integer
    assert r.summary["benchmark"]["integer_answers"] is integer
    graded = [json.loads(line) for line in r.samples_path.read_text().splitlines()]
    assert [(g["extracted_answer"], g["correct"]) for g in graded] == [(c[3], c[4]) for c in cases]
    right = sum(c[4] for c in cases)
    assert r.metrics["avg_at_1"] == pytest.approx(right / len(cases), abs=1e-12)
    assert r.metrics["maj_at_1"] == pytest.approx(right / len(cases), abs=1e-12)
    assert r.metrics["grade_status"].get("timeout", 0) == 0 and r.metrics["response_length"] is None


def test_responses_cli_prints_the_figures(tmp_path):
    data, responses, cases = _files(tmp_path, True)
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--data",
            str(data),
            "--responses",
            str(responses),
            "--no-track",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    right = sum(c[4] for c in cases)
    assert f"avg@1       {100 * right / len(cases):.1f}%" in result.output
    assert f"{len(cases)} problems x 1 samples" in result.output


def test_a_grading_timeout_is_counted_and_reported(tmp_path):
    # (9)^{(9)^{(9)^{(9)}}} passes the grader's pre-checks and sympy expands it for minutes: over
    # the 2 s limit, its worker is killed; it counts wrong, and the summary and warnings say so
    data = tmp_path / "d.jsonl"
    # not integer
    data.write_text(json.dumps({"id": "p1", "problem": "?", "answer": r"\frac{1}{2}"}) + "\n")
    responses = tmp_path / "r.jsonl"
    responses.write_text(
        json.dumps({"problem_id": "p1", "response": r"\boxed{(9)^{(9)^{(9)^{(9)}}}}"})
        + "\n"
        + json.dumps({"problem_id": "p1", "response": r"\boxed{0.5}"})
        + "\n"
    )
    r = grade_responses(
        None,
        responses,
        data=data,
        settings=EvalSettings(grade_timeout_s=2.0),
        out_dir=tmp_path / "o",
        track=False,
    )
    assert (r.metrics["grade_timeouts"], r.metrics["grade_errors"], r.metrics["avg_at_2"]) == (
        1,
        0,
        0.5,
    )
    assert any("1 timeout" in w for w in r.warnings)
    assert (
        json.loads((tmp_path / "o" / "summary.json").read_text())["metrics"]["grade_timeouts"] == 1
    )


def test_several_responses_per_problem_and_bad_lines(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        '{"id": "p1", "problem": "?", "answer": "12"}\n'
        '{"id": "p2", "problem": "?", "answer": "3"}\n'
    )
    ok = tmp_path / "r.jsonl"
    ok.write_text(
        '{"problem_id": "p1", "response": "\\\\boxed{12}"}\n'
        '{"problem_id": "p1", "response": "no"}\n'
        '{"id": "p2", "response": "Answer: 3", "finish_reason": "stop", "length": 4}\n'
        '{"id": "p2", "response": "\\\\boxed{4}", "finish_reason": "length", "length": 9}\n'
    )
    r = grade_responses(None, ok, data=data, out_dir=tmp_path / "o", track=False)
    # p1: 1 of 2, p2: 1 of 2 → avg@2 = 0.5; pass@2 = 1
    assert r.metrics["avg_at_2"] == 0.5 and r.metrics["pass_at_k"]["2"] == 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem_id": "p1", "response": "x"}\n{"problem_id": "p9", "response": "x"}\n')
    with pytest.raises(
        EvalError,
        match=r"bad.jsonl:2: problem_id 'p9' is not in the benchmark \(its ids look like p1, p2\)",
    ):
        grade_responses(None, bad, data=data, out_dir=tmp_path / "o2", track=False)
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"problem_id": "p1", "response": "x"}\n{"problem_id": "p1", "resp\n')
    with pytest.raises(EvalError, match="torn.jsonl:2: not valid JSON"):
        grade_responses(None, torn, data=data, out_dir=tmp_path / "o3", track=False)
