"""Each committed report is what `vapo-lab report` makes from its committed runs file (and, where the
folder holds one, its predictions file)."""

from pathlib import Path

import pytest

from vapo_lab.report import report_from_export

REPORTS = Path(__file__).resolve().parents[2] / "reports"
# the committed reports made from a runs file; a report folder with a predictions.yaml is scored with it
FOLDERS = sorted(p.parent.name for p in REPORTS.glob("*/runs.json.gz"))
TEXT = ("table1.md", "table1.tex", "table1.csv", "index.md", "report.json")


def test_the_committed_reports_are_listed():
    assert {"table1-80steps", "table1-cpu-long"} <= set(FOLDERS), FOLDERS


@pytest.mark.parametrize("name", FOLDERS)
def test_a_committed_report_is_remade_from_its_runs(tmp_path, name):
    folder = REPORTS / name
    predictions = folder / "predictions.yaml"
    rep = report_from_export(folder / "runs.json.gz", tmp_path,
                             predictions=predictions if predictions.is_file() else None)
    text = TEXT + (("predictions_scored.md",) if predictions.is_file() else ())
    for file in text:  # every number, run id and command, byte for byte
        assert (tmp_path / file).read_text() == (folder / file).read_text(), file
    figures = sorted(p.name for p in folder.iterdir() if p.suffix in (".png", ".pdf"))
    assert figures == sorted(p.name for p in rep.files if p.suffix in (".png", ".pdf"))
    for file in figures:  # images may differ by matplotlib version; their data is in report.json
        assert (tmp_path / file).stat().st_size > 1000, file
