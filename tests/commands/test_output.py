"""Output that pipes well: into a pipe or a log file no printed line is wrapped, so a path or run id
stays whole on one line for grep and copy-paste; on a terminal rich wraps as before."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from rich.console import Console
from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.commands.output import WholeLineConsole

# rich's terminal overrides
NO_TTY = {
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "TTY_INTERACTIVE": None,
}
RUN_ID = "0123456789abcdef0123456789abcdef"


def _long_dir(tmp_path: Path) -> Path:
    """Returns a folder under ``tmp_path`` whose path is longer than 120 characters."""
    path = (
        tmp_path
        / "a-folder-with-a-rather-long-name-as-on-a-cluster"
        / "and-another-level-below-it-0123456789"
    )
    path = path / ("x" * max(1, 121 - len(str(path))))
    assert len(str(path)) > 120
    return path


def _line_with(text: str, *parts: str) -> str:
    """Returns the one line of ``text`` that holds every part, failing when none does."""
    lines = [line for line in text.splitlines() if all(p in line for p in parts)]
    assert lines, f"no line holds all of {parts}:\n{text}"
    return lines[0]


def test_a_console_into_a_file_prints_a_long_line_whole_with_markup():
    buf = io.StringIO()
    console = WholeLineConsole(file=buf, width=80)
    line = "word " * 30 + "/a/path/" + "p" * 100
    console.print(f"[bold]{line}[/]", highlight=False)
    assert buf.getvalue() == line + "\n"


def test_a_console_on_a_terminal_still_wraps_at_its_width():
    buf = io.StringIO()
    console = WholeLineConsole(file=buf, force_terminal=True, width=40, color_system=None)
    console.print("word " * 30, highlight=False)
    assert max(len(line) for line in buf.getvalue().splitlines()) <= 40
    assert len(buf.getvalue().splitlines()) > 1
    plain = Console(file=io.StringIO(), force_terminal=True, width=40, color_system=None)
    plain.print("word " * 30, highlight=False)
    assert plain.file.getvalue() == buf.getvalue()  # what rich's own console prints


class _FakeTracker:
    uri = "sqlite:///" + "/tmp/a-tracking-store-folder-with-a-long-name/" + "s" * 60 + "/mlflow.db"


def _fake_trainer(run_dir: Path):
    """Returns a stand-in for the Trainer: one step, a log line naming its folder."""
    from vapo_lab.trainer.trainer import TrainResult

    class FakeTrainer:
        def __init__(self, cfg, choices, progress, log, command):
            self.run_dir, self.run_id, self.tracker, self.step, self.log = (
                run_dir,
                RUN_ID,
                _FakeTracker(),
                0,
                log,
            )

        def start(self):
            pass

        def close(self):
            pass

        def train(self, on_step):
            self.log(f"resumed {self.run_dir} at step 0")
            on_step(1, {})
            return TrainResult(
                self.run_dir,
                RUN_ID,
                1,
                0.5,
                0.5,
                0.25,
                self.run_dir / "checkpoints" / "step_000001",
            )

    return FakeTrainer


def test_train_into_a_log_keeps_run_folder_id_and_store_on_one_line(monkeypatch, tmp_path):
    run_dir = _long_dir(tmp_path) / "vapo-seed0-20260101-000000"
    monkeypatch.setattr("vapo_lab.trainer.trainer.Trainer", _fake_trainer(run_dir))
    result = CliRunner().invoke(
        app,
        ["train", "trainer.total_steps=1", "tracking=none", f"output_dir={run_dir.parent}"],
        env={"COLUMNS": "80", **NO_TTY},
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert _line_with(out, "tracking run").endswith(
        f"run {run_dir} (tracking run {RUN_ID}, {_FakeTracker.uri})"
    )
    assert _line_with(out, "resumed") == f"resumed {run_dir} at step 0"
    assert _line_with(out, "run dir") == f"run dir     {run_dir}"
    assert _line_with(out, "checkpoint") == f"checkpoint  {run_dir / 'checkpoints' / 'step_000001'}"


def test_report_into_a_pipe_of_a_real_process_keeps_its_folder_on_one_line(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("table1")
    run = client.create_run(
        exp, tags={"algo": "vapo", "components_off": "none", "seed": "0", "grid_id": "g-1"}
    )
    for step, v in ((0, 0.4), (10, 0.5)):
        client.log_metric(run.info.run_id, "eval/avg_at_4", v, step=step)
    client.set_terminated(run.info.run_id)
    out_dir = _long_dir(tmp_path) / "report"
    env = {k: v for k, v in os.environ.items() if k not in NO_TTY}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vapo_lab.cli",
            "report",
            "--tracking-uri",
            uri,
            "--variants",
            "VAPO",
            "--out",
            str(out_dir),
        ],
        env={**env, "COLUMNS": "80"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    line = _line_with(out, "wrote")
    assert line.endswith(f"files to {out_dir} (start with {out_dir / 'index.md'})"), out
    assert max(len(line) for line in out.splitlines()) > 200  # a line longer than rich's 80 columns


@pytest.mark.parametrize(
    "error, expect",
    [
        (
            PermissionError(13, "Permission denied", "/runs/r/metrics.jsonl"),
            "error: Permission denied: /runs/r/metrics.jsonl (PermissionError): fix that file or "
            "folder (permissions, space, path) and run the same command again",
        ),
        (OSError(28, "No space left on device"), "error: No space left on device (OSError): fix"),
        (MemoryError(), "error: out of memory (MemoryError): give the process more memory"),
    ],
)
def test_an_os_or_memory_error_prints_one_line_not_a_traceback(error, expect):
    import typer
    from typer.testing import CliRunner

    from vapo_lab.commands.output import cli_errors

    app = typer.Typer()

    @app.command()
    @cli_errors
    def fails() -> None:
        raise error

    result = CliRunner().invoke(app, [])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(expect)
