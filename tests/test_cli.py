"""The Typer CLI: help, components table, config printing, one-line errors; tables that never cut
what a user types, and train progress that reaches a log as it goes."""

import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml
from rich.cells import cell_len
from rich.console import Console
from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.commands import output
from vapo_lab.commands.evaluate import print_eval
from vapo_lab.registry.components import COMPONENTS

# the component names, from the registry (checked against the paper in tests/test_components.py)
NAMES = tuple(c.name for c in COMPONENTS)

runner = CliRunner()


def test_help_lists_commands_with_one_line_each():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("components", "config", "bench"):
        assert command in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("vapo-lab ")


def test_components_lists_every_component_of_the_registry():
    # the registry's names are checked against the paper's Table 1 in tests/test_components.py
    result = runner.invoke(app, ["components"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in NAMES:
        assert name in result.output
    assert "loss.eps_high: 0.28 -> = loss.eps_low" in result.output
    assert "loss.agg: token-mean -> seq-mean-token-mean" in result.output


def test_config_prints_yaml_of_the_composition():
    result = runner.invoke(app, ["config"])
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.output)
    assert cfg["algo"]["name"] == "vapo" and cfg["loss"]["eps_high"] == 0.28


def test_config_drop_and_overrides():
    base = yaml.safe_load(runner.invoke(app, ["config"]).output)
    result = runner.invoke(app, ["config", "--drop", "clip_higher", "seed=3"])
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.output)
    assert cfg["loss"]["eps_high"] == cfg["loss"]["eps_low"] == 0.2 and cfg["seed"] == 3
    base["loss"]["eps_high"], base["seed"] = 0.2, 3
    assert cfg == base


def test_config_algo_ppo():
    cfg = yaml.safe_load(runner.invoke(app, ["config", "--algo", "ppo"]).output)
    assert cfg["loss"]["agg"] == "seq-mean-token-mean" and cfg["rollout"]["n_samples"] == 1


def test_bad_drop_is_one_line_with_valid_names():
    result = runner.invoke(app, ["config", "--drop", "clip_hihger"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "did you mean clip_higher?" in lines[0] and "group_sampling" in lines[0]
    assert "Traceback" not in result.output


def test_malformed_override_is_one_line():
    result = runner.invoke(app, ["config", "loss.eps_low=="])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1
    assert "malformed override" in result.output


def test_drop_already_off_in_preset():
    result = runner.invoke(app, ["config", "--algo", "ppo", "--drop", "clip_higher"])
    assert result.exit_code == 1 and "already off in preset 'ppo'" in result.output


def test_debug_shows_the_exception():
    result = runner.invoke(app, ["--debug", "config", "--drop", "nope"])
    assert result.exit_code == 1 and result.exception is not None


def test_bench_gae_small():
    result = runner.invoke(app, ["bench", "gae", "--shapes", "4x64,3x17", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    assert "speedup" in result.output and "64" in result.output and "x floor" in result.output
    assert "torch scan" in result.output and "new floor" in result.output


# what a user types from the keys column: keys (with their colon) and values, each whole
TYPED = (
    "critic.pretrain.enabled:",
    "gae.lam_critic_mode:",
    "gae.lam_policy_mode:",
    "length_adaptive",
    "loss.eps_high:",
    "loss.eps_low",
    "seq-mean-token-mean",
    "rollout.n_samples:",
    "rollout.group_size",
)
# rich's terminal overrides
NO_TTY = {
    "FORCE_COLOR": None,
    "TTY_COMPATIBLE": None,
    "TTY_INTERACTIVE": None,
}


def _terminal(monkeypatch, width):
    """Makes stdout a terminal of ``width`` columns for the CLI; returns what it receives."""
    buf = io.StringIO()
    monkeypatch.setattr(
        output, "stdout", Console(file=buf, force_terminal=True, width=width, color_system=None)
    )
    return buf


def _rows(text):
    """Returns {first field: fields} of the tab-separated lines of ``text``."""
    return {line.split("\t")[0]: line.split("\t") for line in text.splitlines() if "\t" in line}


def test_components_piped_are_tab_separated_lines_with_every_name_and_key_whole():
    result = runner.invoke(app, ["components"], env={"COLUMNS": "80", **NO_TTY})
    assert result.exit_code == 0, result.output
    assert "\u2026" not in result.output and "\u2502" not in result.output  # no ellipsis, no box
    rows = _rows(result.output)
    assert set(NAMES) <= set(rows)
    assert rows["name"][:2] == ["name", "keys: on -> off"]  # the header
    assert rows["clip_higher"][1] == "loss.eps_high: 0.28 -> = loss.eps_low"
    assert rows["length_adaptive_gae"][1] == "gae.lam_policy_mode: length_adaptive -> fixed"
    assert rows["token_level_loss"][1] == "loss.agg: token-mean -> seq-mean-token-mean"
    assert rows["value_pretraining"][-1] == "11"  # Table 1 without it


def test_components_into_a_pipe_of_a_real_process():
    env = {k: v for k, v in os.environ.items() if k not in NO_TTY}
    out = subprocess.run(
        [sys.executable, "-m", "vapo_lab.cli", "components"],
        env={**env, "COLUMNS": "80"},
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout
    assert "\u2026" not in out
    assert [
        line.split("\t")[0] for line in out.splitlines() if line.split("\t")[0] in NAMES
    ] == list(NAMES)
    for word in TYPED:
        assert word in out


def test_components_on_an_80_column_terminal_is_a_table_that_keeps_names_and_keys_whole(
    monkeypatch,
):
    buf = _terminal(monkeypatch, 80)
    result = runner.invoke(app, ["components"])
    assert result.exit_code == 0, result.output
    text = buf.getvalue()
    assert "\u2502" in text and "\u2026" not in text  # a table; nothing cut with an ellipsis
    assert max(cell_len(line) for line in text.splitlines()) <= 80
    for word in NAMES + TYPED:
        assert word in text, word


def test_components_on_a_terminal_too_narrow_for_the_table_prints_plain_lines(monkeypatch):
    buf = _terminal(monkeypatch, 40)
    assert runner.invoke(app, ["components"]).exit_code == 0
    assert set(NAMES) <= set(_rows(buf.getvalue())) and "\u2026" not in buf.getvalue()


JOB = {
    "cell": "vapo-no_length_adaptive_gae-s2-0123abcd",
    "job_id": "48151623_17",
    "state": "failed: ValueError: loss is NaN at step 12 (see its log)",
    "run_id": "0123456789abcdef0123456789abcdef",
}
GRID = Path("runs-with-a-long-folder-name/grids/table1-0123abcd")


def test_jobs_keep_the_grid_path_cell_job_and_run_ids_whole(monkeypatch):
    monkeypatch.setattr(
        "vapo_lab.launch.actions.jobs_table", lambda output_dir, grid, log: (GRID, [JOB])
    )
    piped = runner.invoke(app, ["jobs"], env={"COLUMNS": "80", **NO_TTY})
    assert piped.exit_code == 0, piped.output
    assert _rows(piped.output)[JOB["cell"]] == [
        JOB["cell"],
        JOB["state"],
        JOB["job_id"],
        JOB["run_id"],
    ]
    assert str(GRID) in piped.output
    for width in (80, 160):
        buf = _terminal(monkeypatch, width)
        assert runner.invoke(app, ["jobs"]).exit_code == 0
        for typed in (str(GRID), JOB["cell"], JOB["job_id"], JOB["run_id"]):
            assert typed in buf.getvalue(), (width, typed)


def test_base_build_keeps_the_model_path_whole(monkeypatch, tmp_path):
    path = tmp_path / "a-cache-folder-with-a-long-name" / "0123456789abcdef0123456789abcdef"
    accuracy = {"all": 0.25, "1-5": 0.5}
    base = SimpleNamespace(
        path=path,
        cached=True,
        shipped=False,
        metrics={
            "accuracy": {"t1": accuracy, "greedy": accuracy},
            "n_params": 1000,
            "final_loss": 0.5,
            "response_tokens": {"min": 7, "max": 14},
            "train_seconds": 0.8,
            "eval_seconds": 0.2,
            "build_seconds": 1.0,
        },
    )
    monkeypatch.setattr(
        "vapo_lab.basemodel.build_base_for", lambda model, task, progress, force, threads: base
    )
    result = runner.invoke(app, ["base", "build", "--quiet"], env={"COLUMNS": "80", **NO_TTY})
    assert result.exit_code == 0, result.output
    assert str(path) in result.output and _rows(result.output)["greedy"] == [
        "greedy",
        "25.0%",
        "50.0%",
    ]


def test_eval_per_problem_table_keeps_problem_ids_whole(capsys):
    pid = "competition_math/intermediate_algebra/1234"
    summary = {
        "metrics": {
            "samples_per_problem": 2,
            "avg_at_2": 0.5,
            "avg_at_2_se": None,
            "avg_at_2_ci95": [0.5, 0.5],
            "pass_at_k": {"1": 0.5, "2": 1.0},
            "maj_at_2": 0.0,
            "response_length": None,
            "truncated_frac": 0.0,
            "problems_graded": 1,
        },
        "generation": {"engine": "external", "responses": "responses.jsonl"},
        "benchmark": {"name": "math"},
        "model": {"path": "responses"},
        "per_problem": [
            {
                "problem_id": pid,
                "reference": "\\frac{1}{2}",
                "correct": 1,
                "samples": 2,
                "accuracy": 0.5,
                "majority_answer": None,
                "majority_correct": False,
            }
        ],
        "tracking": None,
        "files": {"samples": "evals/math/samples.jsonl"},
        "timing": {"grade_s": 0.1},
    }
    print_eval(summary, per_problem=True)
    out = capsys.readouterr().out
    assert _rows(out)[pid] == [pid, "\\frac{1}{2}", "1/2", "50.0%", "-"]


class _FakeTrainer:
    """Stands for the trainer: 3 steps, a marker in the log after each."""

    def __init__(self, cfg, choices, progress, log, command):
        self.run_dir, self.run_id, self.tracker, self.step = Path("runs/fake"), "r1", None, 0

    def start(self):
        pass

    def close(self):
        pass

    def train(self, on_step):
        for step in (1, 2, 3):
            on_step(
                step,
                {"rollout/reward": 0.25, "rollout/accuracy": 0.25, "rollout/response_length": 12.0},
            )
            print(f"MARKER after step {step}", file=sys.stderr)
        from vapo_lab.trainer.trainer import TrainResult

        return TrainResult(self.run_dir, "r1", 3, None, None, None, None)


def test_train_into_a_log_prints_step_lines_as_it_goes(monkeypatch):
    monkeypatch.setattr("vapo_lab.trainer.trainer.Trainer", _FakeTrainer)
    result = runner.invoke(
        app,
        ["train", "trainer.total_steps=3", "tracking=none"],
        env={"VAPO_PROGRESS_INTERVAL": "0", **NO_TTY},
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    first = lines.index("MARKER after step 1")
    assert "vapo: step 0/3 (0%)" in lines[:first]
    assert any(
        line.startswith("vapo: step 1/3 (33%), ")
        and "ETA" in line
        and line.endswith("reward 0.250 acc 0.250 len 12")
        for line in lines[:first]
    ), result.output
    after2, after3 = lines.index("MARKER after step 2"), lines.index("MARKER after step 3")
    assert any(line.startswith("vapo: done, 3 steps in ") for line in lines[after2:after3]), (
        result.output
    )
