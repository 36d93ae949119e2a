"""The committed example report is what `vapo-lab report` makes from the committed runs file."""

from pathlib import Path

import pytest

from vapo_lab.report import report_from_export

EXAMPLE = Path(__file__).resolve().parents[2] / "reports" / "table1-20steps"
TEXT = ("table1.md", "table1.tex", "table1.csv", "index.md", "report.json")


@pytest.mark.skipif(not (EXAMPLE / "runs.json.gz").is_file(), reason="no committed example runs")
def test_the_committed_example_report_is_remade_from_its_runs(tmp_path):
    rep = report_from_export(EXAMPLE / "runs.json.gz", tmp_path)
    for name in TEXT:  # every number, run id and command, byte for byte
        assert (tmp_path / name).read_text() == (EXAMPLE / name).read_text(), name
    figures = sorted(p.name for p in EXAMPLE.iterdir() if p.suffix in (".png", ".pdf"))
    assert figures == sorted(p.name for p in rep.files if p.suffix in (".png", ".pdf"))
    for name in figures:  # images may differ by matplotlib version; their data is in report.json
        assert (tmp_path / name).stat().st_size > 1000, name
