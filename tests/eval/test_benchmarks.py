"""Benchmarks: the packaged sets load with their row counts, any JSONL file loads, bad input is
named."""

import json
import re
import tomllib
from pathlib import Path

import pytest

from vapo_lab.errors import ConfigError
from vapo_lab.eval import load_benchmark
from vapo_lab.eval.benchmarks import BENCHMARKS, data_dir

REPO = Path(__file__).resolve().parents[2]


# What the packaged files hold (their provenance: vapo_lab/data/README.md), by benchmark name
KNOWN = {
    "aime24": (30, True, "2024-I-1"),
    "aime25": (30, True, "2025-I-1"),
    "math500": (500, False, "test/precalculus/807.json"),
    "gsm8k": (1319, True, "test-0"),
}


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_packaged_benchmarks(name):
    bench = load_benchmark(name)
    assert bench.name == name and bench.problems
    assert bench.integer_answers == BENCHMARKS[name].integer_answers
    assert len({p.id for p in bench.problems}) == len(bench.problems)
    if bench.integer_answers:
        assert all(re.fullmatch(r"-?\d+", p.answer) for p in bench.problems)
    if name in KNOWN:
        rows, integer, first_id = KNOWN[name]
        assert (len(bench.problems), bench.integer_answers, bench.problems[0].id) == (
            rows,
            integer,
            first_id,
        )


def test_aime24_answers_are_the_official_integers():
    bench = load_benchmark("aime24")
    answers = [int(p.answer) for p in bench.problems]
    assert all(0 <= a <= 999 for a in answers)
    # 2024-I-1 (Aya's walk) is 204; 2024-I-8 is 197, not the 480 of one bad copy (data README)
    assert answers[0] == 204 and answers[7] == 197


def test_gsm8k_reads_the_question_field():
    problem = load_benchmark("gsm8k").problems[0]
    assert (
        problem.prompt.startswith("Janet’s ducks lay 16 eggs per day.") and problem.answer == "18"
    )


def test_any_jsonl_file(tmp_path):
    ints = tmp_path / "mine.jsonl"
    ints.write_text('{"q": "1+1?", "a": "2"}\n\n{"q": "2-5?", "a": "-3"}\n')
    bench = load_benchmark(ints, problem_key="q", answer_key="a")
    assert (bench.name, [p.prompt for p in bench.problems], bench.integer_answers) == (
        "mine",
        ["1+1?", "2-5?"],
        True,
    )
    assert [p.id for p in bench.problems] == ["1", "3"]  # line numbers when there is no id field
    symbolic = tmp_path / "sym.jsonl"
    symbolic.write_text('{"problem": "half?", "answer": "\\\\frac{1}{2}"}\n')
    assert load_benchmark(str(symbolic)).integer_answers is False


def test_a_malformed_line_is_named_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "ok", "answer": "1"}\n{"problem": "cut off", "ans\n')
    with pytest.raises(ConfigError, match=re.escape(f"{bad}:2: not valid JSON")):
        load_benchmark(bad)
    missing_key = tmp_path / "keys.jsonl"
    missing_key.write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    with pytest.raises(ConfigError, match=re.escape(f"{missing_key}:1: no 'problem' text")):
        load_benchmark(missing_key)


def test_an_unknown_name_lists_the_valid_ones():
    with pytest.raises(
        ConfigError, match=f"did you mean aime24.*{re.escape(', '.join(BENCHMARKS))}"
    ):
        load_benchmark("aime2024")


def test_every_data_file_ships_in_the_wheel():
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]
    patterns = package_data["vapo_lab.data"]
    shipped = {
        p.name for p in data_dir().iterdir() if any(p.match(pattern) for pattern in patterns)
    }
    assert shipped == {"README.md"} | {spec.file for spec in BENCHMARKS.values()}
