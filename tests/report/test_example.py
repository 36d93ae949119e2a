"""Each committed report is what `vapo-lab report` makes from its committed runs file (and, where
the folder holds one, its predictions file): every word, run id and command exactly, every number
to the precision it is written at (``compare``). Floats that differ in their last bits, as another
machine's numpy or scipy sums them, give the same report; a figure that moves does not."""

import gzip
import itertools
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.report.compare import json_mismatches, load_json, report_mismatches, text_mismatches
from vapo_lab.report import Report, report_from_export

REPORTS = Path(__file__).resolve().parents[2] / "reports"
# the committed reports made from a runs file, a setting's sub-report in its folder too (e.g.
# "table1-plateau/clip-higher-setting"); a report folder with a predictions.yaml is scored with it
FOLDERS = sorted(p.parent.relative_to(REPORTS).as_posix() for p in REPORTS.rglob("runs.json.gz"))
TEXT = ("table1.md", "table1.tex", "table1.csv", "index.md", "report.json")
# a 100-run report takes minutes to remake on 2 cores: its last-bits variant runs in the slow step
LARGE_RUNS_BYTES = 2_000_000
NUDGED = [
    pytest.param(name, marks=pytest.mark.slow)
    if (REPORTS / name / "runs.json.gz").stat().st_size > LARGE_RUNS_BYTES
    else name
    for name in FOLDERS
]


def remake(runs: Path, folder: Path, out: Path) -> Report:
    """Writes to ``out`` the report of ``runs`` as the committed report ``folder`` was made: with
    its predictions.yaml where it has one, and the options of its remake.yaml where it has one
    (``score``; ``band``; ``also``: the other experiments' runs files, relative to the folder,
    that its plan reads; ``findings``: the findings file that qualifies its verdicts)."""
    import yaml

    predictions = folder / "predictions.yaml"
    how = (
        yaml.safe_load((folder / "remake.yaml").read_text())
        if (folder / "remake.yaml").is_file()
        else {}
    )
    paths = [runs, *(folder / p for p in how.get("also", []))]
    return report_from_export(
        paths,
        out,
        predictions=predictions if predictions.is_file() else None,
        score=how.get("score", "final"),
        band=how.get("band", "minmax"),
        findings=folder / how["findings"] if "findings" in how else None,
    )


def text_files(folder: Path) -> list[str]:
    """The report's text files in ``folder``: the tables, index.md, report.json and, with
    predictions, their scoring."""
    return list(TEXT) + (
        ["predictions_scored.md"] if (folder / "predictions.yaml").is_file() else []
    )


def read_runs(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def write_runs(data: dict[str, Any], path: Path) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(data, f)
    return path


def nudged(tree: Any, units: Iterator[int]) -> Any:
    """Returns ``tree`` with every float x replaced by x·(1 + k·2^-52), k the next of ``units``:
    a nonzero float moves by |k| units in its last place or so, up or down."""
    if isinstance(tree, float):
        return tree * (1 + next(units) * 2.0**-52)
    if isinstance(tree, dict):
        return {k: nudged(v, units) for k, v in tree.items()}
    if isinstance(tree, list):
        return [nudged(v, units) for v in tree]
    return tree


def floats(tree: Any) -> list[float]:
    if isinstance(tree, float):
        return [tree]
    values = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else []
    return [x for v in values for x in floats(v)]


def test_the_committed_reports_are_listed():
    assert {"table1-80steps", "table1-cpu-long"} <= set(FOLDERS), FOLDERS


@pytest.mark.parametrize("name", FOLDERS)
def test_a_committed_report_is_remade_from_its_runs(tmp_path, name):
    folder = REPORTS / name
    rep = remake(folder / "runs.json.gz", folder, tmp_path)
    assert report_mismatches(tmp_path, folder, text_files(folder)) == {}
    figures = sorted(p.name for p in folder.iterdir() if p.suffix in (".png", ".pdf"))
    assert figures == sorted(p.name for p in rep.files if p.suffix in (".png", ".pdf"))
    for file in figures:  # images may differ by matplotlib version; their data is in report.json
        assert (tmp_path / file).stat().st_size > 1000, file


@pytest.mark.parametrize("name", NUDGED)
def test_the_last_bits_of_every_float_in_the_runs_leave_the_report_as_committed(tmp_path, name):
    """Each float of the runs file moved 1 to 3 units in its last place, up or down in turn (ties
    between equal values broken both ways): the remade report is the committed one."""
    folder = REPORTS / name
    runs = read_runs(folder / "runs.json.gz")
    moved = nudged(runs, itertools.cycle((1, -2, 3, -1, 2, -3)))
    before, after = floats(runs), floats(moved)
    assert sum(a != b for a, b in zip(before, after)) == sum(a != 0 for a in before) > 1000
    remake(write_runs(moved, tmp_path / "runs.json.gz"), folder, tmp_path / "report")
    assert report_mismatches(tmp_path / "report", folder, text_files(folder)) == {}


def test_a_score_that_moves_half_a_point_is_caught(tmp_path):
    """Every Vanilla PPO seed's final held-out score raised by 0.5 points: the row's mean moves by
    0.5, five units of the tables' last place, and every text file of the report differs."""
    folder = REPORTS / "table1-80steps"
    runs = read_runs(folder / "runs.json.gz")
    for run in runs["runs"]:
        key = max(
            (k for k in run["metrics"] if k.startswith("eval/avg_at_")),
            default=None,
            key=lambda k: int(k.rsplit("_", 1)[-1]),
        )
        if run["tags"].get("algo") == "ppo" and key:
            run["metrics"][key][-1][2] += 0.005
    remake(write_runs(runs, tmp_path / "runs.json.gz"), folder, tmp_path / "report")
    found = report_mismatches(tmp_path / "report", folder, text_files(folder))
    assert set(found) == set(text_files(folder)), found
    assert any("43.9 != 43.4" in m for m in found["table1.md"]), found["table1.md"]


def test_numbers_match_to_one_unit_in_their_last_place():
    assert text_mismatches("| 43.4 ± 0.2 | [-0.0, +1.0] |", "| 43.3 ± 0.2 | [+0.0, +1.0] |") == []
    assert text_mismatches("42.1875,0.5", "42.1874,0.5") == []  # a half rounded the other way
    assert text_mismatches("| 43.9 |", "| 43.4 |")  # half a point
    assert text_mismatches("| 43.40 |", "| 43.4 |")  # not written to the same places
    assert text_mismatches("0-7 58% (n=14)", "0-7 57% (n=14)") == []  # a rounded percentage
    assert text_mismatches("0-7 59% (n=14)", "0-7 57% (n=14)")


def test_words_ids_counts_and_commands_match_exactly():
    assert text_mismatches("0-7 57% (n=15)", "0-7 57% (n=14)")  # a count
    assert text_mismatches("- VAPO: `a9304f98`", "- VAPO: `a9304f99`")  # a run id
    assert text_mismatches("| yes |", "| no |")
    assert text_mismatches("step 61", "step 60")
    assert text_mismatches(
        "    vapo-lab ablate gae.alpha=0.06\n", "    vapo-lab ablate gae.alpha=0.05\n"
    )
    assert text_mismatches("run `vapo-lab report --ema 0.8`", "run `vapo-lab report --ema 0.9`")
    assert text_mismatches("version 2.13.1", "version 2.13.0")


def test_report_json_floats_match_to_the_digits_it_keeps():
    def diff(made: str, committed: str) -> list[str]:
        return json_mismatches(load_json(made), load_json(committed))

    assert (
        diff('{"mean": 41.503907, "ci": [0.0, 1e-05]}', '{"mean": 41.503906, "ci": [0.0, 1e-05]}')
        == []
    )
    assert diff('{"mean": 41.50392}', '{"mean": 41.503906}')
    assert diff('{"delta": 1e-13}', '{"delta": 0.0}') == []  # below the last place kept
    assert diff('{"seeds": 4}', '{"seeds": 3}') and diff('{"seeds": 3.0}', '{"seeds": 3}')
    assert diff('{"b": 1, "a": 2}', '{"a": 2, "b": 1}')  # keys in their order
    assert diff('{"run_ids": ["a1"]}', '{"run_ids": ["a2"]}') and diff('{"x": NaN}', '{"x": 1.0}')
    assert diff('{"x": NaN, "ok": true}', '{"x": NaN, "ok": true}') == []
