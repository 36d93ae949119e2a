"""Bad input is refused first, in one line naming the value, the rule and the fix.

Each test runs the CLI in an empty working directory with every expensive step (base-model build,
model load, grid submission, generation) patched to fail the test if it is reached, and checks
the one line, exit code 1, no traceback, and that nothing was created.
"""

import os
import shutil
import socket
import subprocess
import tempfile

import pytest
from typer.testing import CliRunner

from vapo_lab.cli import app

runner = CliRunner()


def _boom(*args, **kwargs):
    raise AssertionError("compute started before the bad input was refused")


@pytest.fixture
def no_compute(monkeypatch, tmp_path):
    """An empty working directory in which building, loading, submitting or generating fails the
    test."""
    import vapo_lab.basemodel.build
    import vapo_lab.eval.harness
    import vapo_lab.eval.responses
    import vapo_lab.launch.submit
    import vapo_lab.trainer.setup

    for module, name in (
        (vapo_lab.trainer.setup, "load_policy"),
        (vapo_lab.trainer.setup, "build_base_for"),
        (vapo_lab.basemodel.build, "build_base"),
        (vapo_lab.launch.submit, "submit_grid"),
        (vapo_lab.eval.harness, "load_generator"),
        (vapo_lab.eval.harness, "grade_records"),
        (vapo_lab.eval.responses, "grade_records"),
    ):
        monkeypatch.setattr(module, name, _boom)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def _writable(folder) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


@pytest.fixture
def readonly_dir(tmp_path):
    """A folder no file can be created in: mode 555, or (as root, who ignores modes) immutable."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    immutable = False
    if _writable(folder) and shutil.which("chattr"):
        immutable = (
            subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        )
    if _writable(folder):
        folder.chmod(0o755)
        pytest.skip("cannot make a read-only folder here (root, and no chattr +i)")
    yield folder
    if immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    folder.chmod(0o755)


def _refused(result, *parts):
    """Asserts a one-line refusal holding every one of ``parts``; returns the line."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def _invoke(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "300"})


# -- ablate --seeds ------------------------------------------------------------------------------
@pytest.mark.parametrize("seeds", ["0", "-1"])
def test_ablate_seeds_below_one_is_refused(no_compute, seeds):
    result = _invoke("ablate", "--drop", "clip_higher", "--seeds", seeds)
    _refused(result, f"--seeds {seeds}", ">= 1", "--seeds 1")
    assert os.listdir(no_compute) == []


def test_sweep_seeds_zero_says_the_fix(no_compute):
    result = _invoke("sweep", "table1", "--seeds", "0")
    _refused(result, "--seeds 0", ">= 1", "--seeds 1")


# -- non-finite floats and component names ------------------------------------------------------
@pytest.mark.parametrize(
    "override", ["rollout.temperature=nan", "rollout.temperature=inf", "trainer.actor_lr=nan"]
)
def test_a_non_finite_float_is_refused_before_any_folder(no_compute, override):
    key = override.split("=")[0]
    _refused(
        _invoke("train", override),
        f"{override} is not a finite number",
        f"set {key} to a finite value",
    )
    assert os.listdir(no_compute) == []


def test_a_drop_in_capitals_suggests_the_registered_name(no_compute):
    _refused(
        _invoke("ablate", "--drop", "CLIP_HIGHER"),
        "unknown component 'CLIP_HIGHER'",
        "did you mean clip_higher?",
    )
    assert os.listdir(no_compute) == []


# -- tracking.uri --------------------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_tracking_server_is_refused_before_the_base_build(no_compute):
    uri = f"http://127.0.0.1:{_closed_port()}"
    result = _invoke("train", f"tracking.uri={uri}")
    _refused(result, uri, "not answering", "tracking.uri", "tracking=none")
    assert os.listdir(no_compute) == []


def test_unwritable_sqlite_store_is_refused(no_compute, readonly_dir):
    uri = f"sqlite:///{readonly_dir}/mlflow.db"
    result = _invoke("train", f"tracking.uri={uri}")
    _refused(result, f"tracking.uri={uri}", str(readonly_dir), "not writable", "tracking=none")
    assert os.listdir(no_compute) == [] and os.listdir(readonly_dir) == []


def test_sqlite_store_under_a_file_is_refused(no_compute):
    (no_compute / "notes.txt").write_text("x")
    uri = f"sqlite:///{no_compute}/notes.txt/mlflow.db"
    result = _invoke("train", f"tracking.uri={uri}")
    _refused(result, f"tracking.uri={uri}", "notes.txt is a file, not a folder", "tracking.uri=")
    assert sorted(os.listdir(no_compute)) == ["notes.txt"]


def test_ablate_grid_checks_the_tracking_store_before_submitting(no_compute):
    uri = f"http://127.0.0.1:{_closed_port()}"
    result = _invoke("ablate", "--drop", "clip_higher", "--seeds", "2", f"tracking.uri={uri}")
    _refused(result, uri, "not answering")
    assert os.listdir(no_compute) == []


# -- output folders ------------------------------------------------------------------------------
def test_unwritable_output_dir_is_refused(no_compute, readonly_dir):
    out = readonly_dir / "runs"
    result = _invoke("train", f"output_dir={out}", "tracking=none")
    _refused(result, f"output_dir={out}", str(readonly_dir), "not writable", "set output_dir=")
    assert os.listdir(no_compute) == [] and os.listdir(readonly_dir) == []


def test_output_dir_under_a_file_is_refused(no_compute):
    (no_compute / "runs").write_text("not a folder")
    result = _invoke("train", "tracking=none")
    _refused(result, "output_dir=runs", "is a file, not a folder", "set output_dir=")


def test_readonly_working_directory_is_one_line_naming_what_goes_there(
    no_compute, readonly_dir, monkeypatch
):
    monkeypatch.chdir(readonly_dir)
    result = _invoke("train")
    line = _refused(
        result,
        str(readonly_dir),
        "not writable",
        "output_dir=runs",
        ".vapo_cache",
        "mlflow.db",
        "writable folder",
    )
    assert "tracking=none" in line
    assert os.listdir(readonly_dir) == []


def test_grid_output_dir_is_checked_before_submitting(no_compute, readonly_dir):
    result = _invoke(
        "ablate",
        "--drop",
        "clip_higher",
        "--seeds",
        "2",
        f"output_dir={readonly_dir}/runs",
        "tracking=none",
    )
    _refused(result, f"output_dir={readonly_dir}/runs", "not writable")


def test_eval_out_folder_is_checked_before_the_model_loads(no_compute, readonly_dir):
    data = no_compute / "d.jsonl"
    data.write_text('{"id": "p1", "problem": "1+1?", "answer": "2"}\n')
    responses = no_compute / "r.jsonl"
    responses.write_text('{"problem_id": "p1", "response": "\\\\boxed{2}"}\n')
    result = _invoke(
        "eval",
        "--data",
        str(data),
        "--responses",
        str(responses),
        "--no-track",
        "--out",
        str(readonly_dir / "out"),
    )
    _refused(result, f"--out {readonly_dir / 'out'}", "not writable")


# -- eval ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", [["--runs-dir", "nowhere"], ["--model", "/no/such/model"]])
def test_unknown_eval_benchmark_is_refused_before_the_model(no_compute, where):
    result = _invoke("eval", "aime2024", *where, "--no-track")
    _refused(result, "'aime2024'", "did you mean aime24?", "aime24, aime25, math500, gsm8k")
    assert os.listdir(no_compute) == []


def _responses(folder, lines):
    data = folder / "d.jsonl"
    data.write_text(
        '{"id": "p1", "problem": "?", "answer": "12"}\n'
        '{"id": "p2", "problem": "?", "answer": "3"}\n'
    )
    responses = folder / "r.jsonl"
    responses.write_text("".join(line + "\n" for line in lines))
    return data, responses


@pytest.mark.parametrize(
    "lines, parts",
    [
        (
            [
                '{"problem_id": "p1", "response": "a", "sample_index": 0}',
                '{"problem_id": "p1", "response": "b", "sample_index": 5}',
            ],
            ["r.jsonl:2", "sample_index 5", "out of range", "p1 has 2 responses", "0..1"],
        ),
        (
            ['{"problem_id": "p1", "response": "a", "sample_index": -1}'],
            ["r.jsonl:1", "sample_index -1", "out of range", "0..0"],
        ),
        (
            ['{"problem_id": "p1", "response": "a", "sample_index": "first"}'],
            ["r.jsonl:1", "sample_index 'first'", "not an integer"],
        ),
        (
            [
                '{"problem_id": "p1", "response": "a", "sample_index": 0}',
                '{"problem_id": "p1", "response": "b", "sample_index": 0}',
            ],
            ["r.jsonl:2", "sample_index 0", "twice", "p1"],
        ),
    ],
)
def test_sample_index_out_of_range_is_refused_before_grading(no_compute, lines, parts):
    data, responses = _responses(no_compute, lines)
    result = _invoke(
        "eval",
        "--data",
        str(data),
        "--responses",
        str(responses),
        "--no-track",
        "--out",
        str(no_compute / "out"),
    )
    _refused(result, *parts, "leave sample_index out")
    assert not (no_compute / "out").exists()


# -- files that are not UTF-8, YAML errors -------------------------------------------------------
def test_data_file_not_utf8_names_file_and_line(no_compute):
    data = no_compute / "d.jsonl"
    data.write_bytes(
        b'{"id": "p1", "problem": "?", "answer": "1"}\n'
        b'{"id": "p2", "problem": "caf\xe9", "answer": "2"}\n'
    )
    result = _invoke(
        "eval", "--data", str(data), "--samples", "1", "--model", "/no/such", "--no-track"
    )
    _refused(result, f"{data}:2", "not UTF-8", "byte 0xe9", "save it as UTF-8")


def test_math_train_file_not_utf8_is_a_config_error(tmp_path):
    from vapo_lab.errors import ConfigError
    from vapo_lab.tasks.math import load_jsonl

    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"problem": "1+1", "answer": "2"}\n\n{"problem": "\xff", "answer": "2"}\n')
    with pytest.raises(ConfigError, match=r"train.jsonl:3: not UTF-8 \(byte 0xff at column 14\)"):
        load_jsonl(path)


def test_grid_file_not_utf8_names_file_and_line(no_compute):
    grid = no_compute / "g.yaml"
    grid.write_bytes(b"name: g\n# caf\xe9\ncells:\n  - {name: a, algo: vapo}\n")
    result = _invoke("sweep", str(grid), "--dry-run")
    _refused(result, f"grid file {grid}:2", "not UTF-8", "byte 0xe9", "save it as UTF-8")


def test_grid_file_yaml_error_names_the_line(no_compute):
    grid = no_compute / "g.yaml"
    grid.write_text("name: g\ncells:\n  - {name: a, algo: vapo\n  - {name: b, algo: ppo}\n")
    result = _invoke("sweep", str(grid), "--dry-run")
    line = _refused(result, f"grid file {grid}:4", "not valid YAML")
    assert "column" in line


# -- rollout.max_new_tokens ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, shortest",
    [
        (["rollout.max_new_tokens=5"], 6),
        (
            [
                "rollout.max_new_tokens=20",
                "task.options.min_digits=6",
                "task.options.max_digits=8",
                "reward.overlong.l_cache=8",
            ],
            21,
        ),
    ],
)
def test_max_new_tokens_shorter_than_any_answer_is_refused(no_compute, overrides, shortest):
    result = _invoke("train", *overrides)
    line = _refused(
        result,
        overrides[0],
        f"{shortest} tokens",
        "task=arith",
        f"rollout.max_new_tokens>={shortest}",
    )
    assert "shortest" in line
    assert os.listdir(no_compute) == []


def test_max_new_tokens_that_fits_the_shortest_answer_composes():
    from vapo_lab.config.compose import compose_config

    compose_config(overrides=["rollout.max_new_tokens=6", "reward.overlong.l_cache=4"])


# -- overrides -----------------------------------------------------------------------------------
def test_unclosed_list_override_names_it_and_how_to_quote():
    result = _invoke("config", "loss.eps_low=[0.1")
    _refused(
        result,
        "'loss.eps_low=[0.1'",
        "'[' is not closed",
        "loss.eps_low=0.1",
        "'trainer.adam_betas=[0.9,0.999]'",
    )


def test_unclosed_list_override_of_a_list_key_suggests_the_quoted_list():
    result = _invoke("config", "trainer.adam_betas=[0.9,0.99")
    _refused(
        result,
        "'trainer.adam_betas=[0.9,0.99'",
        "'[' is not closed",
        "'trainer.adam_betas=[0.9,0.99]'",
    )


def test_unknown_key_is_not_offered_an_unrelated_one():
    line = _refused(_invoke("config", "trainer.keep=3"), "'trainer.keep'", "vapo-lab config")
    assert "trainer.device" not in line and "did you mean" not in line
    assert "trainer has" in line and "save_every" in line  # the group's keys instead


@pytest.mark.parametrize(
    "override, suggestion",
    [
        ("loss.eps_hgh=0.3", "did you mean loss.eps_high?"),
        ("trainer.eps_low=0.1", "did you mean loss.eps_low?"),
        ("trainr.total_steps=3", "did you mean trainer.total_steps?"),
        ("sed=3", "did you mean seed?"),
    ],
)
def test_unknown_key_suggests_the_close_one(override, suggestion):
    _refused(_invoke("config", override), suggestion)


def test_type_errors_use_the_right_article():
    line = _refused(
        _invoke("config", "trainer.total_steps=abc"),
        "trainer.total_steps=abc is not a valid integer",
        "an integer",
    )
    assert "a integer" not in line
    _refused(
        _invoke("config", "trainer.deterministic=maybe"),
        "trainer.deterministic=maybe",
        "true or false",
    )


# -- report --------------------------------------------------------------------------------------
def test_report_on_a_missing_store_says_so_and_creates_nothing(no_compute):
    result = _invoke("report", "--tracking-uri", "sqlite:///nope.db")
    _refused(result, "sqlite:///nope.db", "does not exist", "--tracking-uri")
    assert os.listdir(no_compute) == []


def test_report_on_the_default_store_that_is_not_there_creates_no_database(no_compute):
    result = _invoke("report")
    _refused(result, "mlflow.db", "does not exist", "--tracking-uri")
    assert os.listdir(no_compute) == []


def test_report_out_folder_is_checked_before_reading_runs(no_compute, readonly_dir):
    result = _invoke(
        "report", "--out", str(readonly_dir / "rep"), "--tracking-uri", "sqlite:///nope.db"
    )
    _refused(
        result, f"--out {readonly_dir / 'rep'}", "not writable", "give --out a writable folder"
    )
    assert os.listdir(no_compute) == []


def test_base_build_in_a_readonly_folder_is_refused_before_building(
    no_compute, readonly_dir, monkeypatch
):
    monkeypatch.chdir(readonly_dir)
    result = _invoke("base", "build", "--quiet")
    _refused(result, ".vapo_cache/base", str(readonly_dir), "not writable", "writable folder")


# -- many ranks ----------------------------------------------------------------------------------
def test_train_on_many_nodes_names_slurm_and_torchrun(no_compute):
    result = _invoke(
        "train",
        "trainer.strategy=fsdp",
        "trainer.nproc_per_node=2",
        "trainer.nodes=2",
        "tracking=none",
    )
    _refused(
        result,
        "trainer.nodes=2",
        "starts the ranks of this node only",
        "--launcher slurm",
        "torchrun --nnodes 2 --nproc-per-node 2",
    )
    assert os.listdir(no_compute) == []


def test_resume_may_change_only_the_rank_counts(no_compute):
    result = _invoke(
        "train", "resume=runs/nowhere", "trainer.nproc_per_node=2", "trainer.actor_lr=1"
    )
    _refused(
        result, "resume=runs/nowhere continues a run with its saved config", "trainer.actor_lr=1"
    )
    assert "trainer.nproc_per_node" not in result.output
