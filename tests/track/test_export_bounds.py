"""An untrusted runs export (`vapo-lab report --runs FILE`) is read in bounded memory and checked
run by run: a file over the caps, not gzip, not JSON or not what `export_runs` writes is refused in
one line naming the problem (the first bad run and field) before any MLflow store is made."""

import copy
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.track.export import FORMAT, ExportError, import_runs, read_export

REPORTS = Path(__file__).resolve().parents[2] / "reports"
RUN = {
    "run_id": "a" * 32,
    "run_name": "r",
    "status": "FINISHED",
    "start_time": 1,
    "end_time": 2,
    "tags": {"algo": "vapo"},
    "params": {"lr": "1e-06"},
    "metrics": {"eval/avg_at_4": [[0, 1, 0.5], [1, 2, 0.75]]},
}
BAD = "b" * 32  # the run_id of the bad run, second in its file
# runs `vapo-lab report` in a child and prints its exit code, stderr and peak memory (KiB) as JSON
MEASURE = (
    "import json, resource, subprocess, sys; "
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
    "print(json.dumps({'rc': p.returncode, 'stderr': p.stderr, "
    "'maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))"
)


def _gzip(path: Path, text: str | bytes) -> Path:
    with gzip.open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    return path


def _export(path: Path, run_list: list, **top) -> Path:
    """An export of ``run_list``; ``top`` replaces its top-level fields."""
    return _gzip(
        path, json.dumps({"format": FORMAT, "experiment": "table1", "runs": run_list, **top})
    )


def _refused(tmp_path: Path, path: Path, *parts: str) -> str:
    """Runs `vapo-lab report --runs path`: asserts a one-line refusal holding every one of ``parts``
    and no report folder; returns the line."""
    result = CliRunner().invoke(
        app, ["report", "--runs", str(path), "--out", str(tmp_path / "out")], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for part in parts:
        assert part in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    return lines[0]


def _report_in_a_child(tmp_path: Path, path: Path) -> dict:
    """`vapo-lab report --runs path` in a fresh process: its exit code, stderr and peak RSS."""
    cli = [sys.executable, "-c", "from vapo_lab.cli import main; main()"]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            MEASURE,
            *cli,
            "report",
            "--runs",
            str(path),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    return json.loads(done.stdout)


def test_a_gzip_bomb_is_refused_in_one_line_in_little_memory(tmp_path):
    """1 MB of gzip inflating to 1 GiB of spaces: refused at the inflated-size cap while streaming,
    the process's peak RSS under 300 MB (it was 2.2 GiB, the whole text inflated then parsed)."""
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=6) as f:  # written streaming: 1 MiB at a time
        for _ in range(1024):
            f.write(b" " * (1 << 20))
    assert bomb.stat().st_size < 2 << 20
    child = _report_in_a_child(tmp_path, bomb)
    lines = child["stderr"].strip().splitlines()
    assert child["rc"] == 1 and len(lines) == 1, child["stderr"]
    assert lines[0].startswith("error: ") and str(bomb) in lines[0] and "256 MiB" in lines[0], (
        lines[0]
    )
    assert child["maxrss_kib"] < 300 * 1024, child
    assert not (tmp_path / "out").exists()


def test_a_right_format_export_with_a_huge_runs_array_is_refused_before_it_is_parsed(tmp_path):
    """The format field right and 20 million empty lists for runs (60 MB of text): refused by the
    count of JSON values while streaming, in little memory (it was 1.7 GB, then a TypeError
    traceback)."""
    path = _gzip(
        tmp_path / "huge.json.gz",
        f'{{"format": "{FORMAT}", "experiment": "table1", "runs": [' + "[]," * 20_000_000 + "[]]}",
    )
    child = _report_in_a_child(tmp_path, path)
    lines = child["stderr"].strip().splitlines()
    assert child["rc"] == 1 and len(lines) == 1, child["stderr"]
    assert "JSON values" in lines[0], lines[0]
    assert child["maxrss_kib"] < 300 * 1024, child


def test_runs_that_are_not_objects_are_refused_naming_the_run(tmp_path):
    _refused(
        tmp_path, _export(tmp_path / "ints.json.gz", [1, 2, 3]), "run 0 ", "is 1, not an object"
    )


@pytest.mark.parametrize(
    "point", [[1, 2], [1, 2, "0.5"], [1.5, 2, 0.5], [1, True, 0.5], 7, [1, 2, 0.5, 4]]
)
def test_a_malformed_metric_point_is_refused_naming_the_run_and_metric(tmp_path, point):
    bad = dict(copy.deepcopy(RUN), run_id=BAD)
    bad["metrics"]["eval/avg_at_4"].append(point)
    line = _refused(
        tmp_path,
        _export(tmp_path / "bad.json.gz", [RUN, bad]),
        f"run 1 ({BAD!r})",
        "metrics",
        "'eval/avg_at_4' point 2",
        "[step, timestamp, value]",
    )
    assert repr(point) in line, line


@pytest.mark.parametrize(
    "field,value",
    [
        ("run_id", 7),
        ("run_name", ["r"]),
        ("status", "DONE"),
        ("start_time", "yesterday"),
        ("end_time", 2.5),
        ("start_time", 2**70),
        ("tags", []),
        ("params", {"lr": 0.1}),
        ("metrics", {"x": 0.5}),
        ("metrics", None),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_naming_the_run_and_field(tmp_path, field, value):
    bad = dict(copy.deepcopy(RUN), run_id=BAD)
    bad[field] = value
    name = f"run 1 ({BAD!r})" if field != "run_id" else "run 1 "
    _refused(tmp_path, _export(tmp_path / "bad.json.gz", [RUN, bad]), name, f"bad {field}")


def test_a_run_missing_a_field_is_refused_naming_it(tmp_path):
    bad = {k: v for k, v in RUN.items() if k != "params"} | {"run_id": BAD}
    _refused(
        tmp_path, _export(tmp_path / "bad.json.gz", [RUN, bad]), f"run 1 ({BAD!r})", "no params"
    )


@pytest.mark.parametrize(
    "top,part",
    [({"runs": {}}, "runs"), ({"experiment": 5}, "experiment"), ({"experiment": ""}, "experiment")],
)
def test_a_bad_experiment_or_runs_list_is_refused(tmp_path, top, part):
    _refused(tmp_path, _export(tmp_path / "bad.json.gz", [RUN], **top), part)


def test_more_runs_than_the_exporter_writes_are_refused(tmp_path):
    runs = [dict(RUN, run_id=f"{i:032x}", metrics={}) for i in range(10_001)]
    _refused(tmp_path, _export(tmp_path / "many.json.gz", runs), "10001 runs", "10000")


@pytest.mark.parametrize(
    "case,part",
    [
        ("not gzip", "Not a gzipped file"),
        ("empty", "cannot read runs file"),
        ("truncated", "ended before"),
        ("bad deflate", "invalid block type"),
        ("bad crc", "CRC check failed"),
        ("invalid json", "Expecting"),
        ("not ascii", "ASCII"),
        ("too deep", "too deeply nested"),
        ("huge int", "4300 digits"),
        ("not an export", "not a vapo-lab runs export"),
    ],
)
def test_a_file_that_is_not_a_readable_export_is_refused_in_one_line(tmp_path, case, part):
    path = tmp_path / "runs.json.gz"
    if case == "not gzip":
        path.write_bytes(b"not gzip at all")
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "truncated":
        path.write_bytes(
            gzip.compress(
                gzip.decompress((REPORTS / "table1-cpu-long" / "runs.json.gz").read_bytes())
            )[:100_000]
        )
    # a gzip header, then no deflate block: zlib.error, a traceback before
    elif case == "bad deflate":
        path.write_bytes(gzip.compress(b"")[:10] + b"\xff" * 64)
    elif case == "bad crc":  # the CRC-32 of the text, in the trailer's first 4 bytes, flipped
        good = bytearray(
            gzip.compress(json.dumps({"format": FORMAT, "experiment": "t", "runs": [RUN]}).encode())
        )
        good[-8] ^= 0xFF
        path.write_bytes(bytes(good))
    elif case == "invalid json":
        _gzip(path, f'{{"format": "{FORMAT}", "runs": [')
    elif case == "not ascii":
        _gzip(path, b'{"format": "\xff"}')
    elif case == "too deep":
        _gzip(path, "[" * 100_000 + "]" * 100_000)
    elif case == "huge int":
        _gzip(path, f'{{"format": "{FORMAT}", "experiment": "t", "runs": [], "x": {"9" * 5000}}}')
    else:
        _gzip(path, '{"format": "something-else/1", "runs": []}')
    _refused(tmp_path, path, str(path), part)


def test_a_refused_export_makes_no_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    bad = dict(copy.deepcopy(RUN), run_id=BAD, status="DONE")
    with pytest.raises(ExportError, match="run 1 .* bad status"):
        import_runs(_export(tmp_path / "bad.json.gz", [RUN, bad]), uri)
    assert not (tmp_path / "mlflow.db").exists()
    assert import_runs(_export(tmp_path / "good.json.gz", [RUN]), uri) == ("table1", 1)
    assert (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("name", ["table1-80steps", "table1-cpu-long"])
def test_the_committed_exports_pass_the_checks(name):
    data = read_export(REPORTS / name / "runs.json.gz")
    assert len(data["runs"]) == 31 and data["experiment"] == "table1"
