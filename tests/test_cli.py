"""The Typer CLI: help, components table, config printing, one-line errors."""

import yaml
from typer.testing import CliRunner

from vapo_lab.cli import app

runner = CliRunner()


def test_help_lists_commands_with_one_line_each():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("components", "config", "bench"):
        assert command in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("vapo-lab ")


def test_components_lists_exactly_the_seven():
    result = runner.invoke(app, ["components"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("value_pretraining", "decoupled_gae", "length_adaptive_gae", "clip_higher",
                 "token_level_loss", "positive_lm_loss", "group_sampling"):
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
    assert "speedup" in result.output and "64" in result.output
