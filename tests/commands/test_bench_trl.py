"""The TRL envs: a missing one is a one-line error naming the setup command."""

from typer.testing import CliRunner

from vapo_lab.bench.trl.envs import default_python
from vapo_lab.cli import app


def test_missing_trl_env_fails_in_one_line_naming_the_setup_command(tmp_path):
    result = CliRunner().invoke(
        app, ["bench", "trl", "--part", "ppo", "--trl-python", str(tmp_path / "nope/bin/python")]
    )
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "vapo-lab bench trl --setup" in lines[0] and "trl==1.12.0" in lines[0]


def test_missing_default_env_is_named(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .bench-venv/ here
    result = CliRunner().invoke(app, ["bench", "trl", "--part", "grpo"])
    assert result.exit_code == 1
    assert str(default_python("grpo")) in result.output and "--setup" in result.output
