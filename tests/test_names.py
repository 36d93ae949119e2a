"""One rule for every name that becomes a path (issue 49, item 1): a name typed by a user is refused
in one line before any folder; a name read from a file becomes a safe slug; a manifest entry must
stay inside its checkpoint folder (eval's fallback: tests/eval/test_model_ref.py)."""

import json

import pytest
from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.errors import ConfigError
from vapo_lab.integrity import file_sha256, manifest_problem, write_manifest
from vapo_lab.launch.grid import load_grid
from vapo_lab.names import MAX_NAME, check_name, inside, name_problem, slug

runner = CliRunner()


@pytest.mark.parametrize(
    "name, problem",
    [
        ("../escaped", "path separator"),
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("..", "parent folder"),
        (".", "own or parent"),
        ("", "empty"),
        ("x" * (MAX_NAME + 1), f"more than {MAX_NAME}"),
        ("bad\nname", "control character"),
        ("nul\x00", "control character"),
    ],
)
def test_a_name_that_could_leave_or_break_its_folder_is_refused(name, problem):
    assert problem in name_problem(name)
    with pytest.raises(ValueError, match="run_name=.* cannot name a folder") as e:
        check_name(name, "run_name")
    assert "\n" not in str(e.value).replace(repr(name), "")  # one line, the name quoted


def test_ordinary_names_pass_and_slugs_are_safe():
    for name in ("vapo-s0-3e94479492bf06a1", "table1-free", "w.o_clip+x", "x" * MAX_NAME):
        assert name_problem(name) is None and slug(name) == name
    for text in ("../../../x", "..", "/etc/passwd", "a\nb", "", "é" * 300):
        s = slug(text)
        assert name_problem(s) is None and not s.startswith("."), (text, s)


def test_train_refuses_a_run_name_out_of_its_folder_before_making_any(tmp_path):
    for name in ("../escaped", "a/b", "z" * 300):
        out = tmp_path / "runs"
        result = runner.invoke(
            app, ["train", f"run_name={name}", f"output_dir={out}", "tracking=none"]
        )
        assert result.exit_code != 0
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "cannot name a folder" in lines[0], result.output
        assert not out.exists() and not (tmp_path / "escaped").exists()


def test_a_grid_cell_named_out_of_its_folder_is_refused(tmp_path):
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\ncells:\n  - {name: ../../../../escape_cell, algo: vapo}\n")
    with pytest.raises(ConfigError, match="cell name='../../../../escape_cell' cannot name"):
        load_grid(grid)


def test_a_manifest_entry_outside_its_folder_is_refused_unread(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "step_000001"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.bin").write_bytes(b"w" * 10)
    write_manifest(ckpt)
    secret = tmp_path / "outside_secret.txt"
    secret.write_text("secret")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for entry in ("../../../outside_secret.txt", str(secret)):
        files = dict(manifest["files"])
        # the true size and hash: only the place is wrong
        files[entry] = {"bytes": secret.stat().st_size, "sha256": file_sha256(secret)}
        (ckpt / "manifest.json").write_text(json.dumps({**manifest, "files": files}))
        problem = manifest_problem(ckpt)
        assert problem is not None and "outside" in problem and repr(entry) in problem
    assert inside(ckpt, "weights.bin") == ckpt / "weights.bin"
    assert inside(ckpt, "../step_000001/weights.bin") is not None  # stays inside: allowed
    assert inside(ckpt, "../x") is None and inside(ckpt, "/etc/passwd") is None


BOMB = """name: bomb
# the anchors live in `description`, which the loader ignores
description:
  - &a ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]
  - &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
  - &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
  - &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
  - &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
  - &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
  - &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
  - &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
  - &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


@pytest.mark.parametrize(
    "where, expect",
    [
        ("overrides: [*i]\ncells:\n  - {name: c, algo: vapo}\n", "`overrides`: holds a list"),
        ("cells:\n  - {name: c, algo: vapo, overrides: [*i]}\n", "cell c: `overrides`: holds a"),
        ("sweep: {trainer.actor_lr: *i}\ncells:\n  - {name: c, algo: vapo}\n", "`sweep` entry"),
    ],
)
def test_a_yaml_alias_bomb_as_an_override_is_refused_before_it_is_expanded(tmp_path, where, expect):
    # 10^10 strings if expanded (str() of the list): refused as a non-string, in a moment
    grid = tmp_path / "bomb.yaml"
    grid.write_text(BOMB + where)
    with pytest.raises(ConfigError, match=expect) as e:
        load_grid(grid)
    assert "\n" not in str(e.value) and "key=value" in str(e.value)


def test_a_report_names_its_default_folder_by_a_slug_of_the_file_s_experiment(
    tmp_path, monkeypatch
):
    # before issue 49 an export whose experiment was ../../../x put 17 files outside reports/
    import gzip
    import json
    from pathlib import Path

    from vapo_lab.report import report_from_export

    repo = Path(__file__).resolve().parents[1]
    export = json.loads(gzip.open(repo / "reports" / "table1-80steps" / "runs.json.gz").read())
    export["experiment"] = "../../../x"
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    path = work / "runs.json.gz"
    path.write_bytes(gzip.compress(json.dumps(export).encode()))
    monkeypatch.chdir(work)
    rep = report_from_export(str(path))
    assert rep.out.resolve().parent == (work / "reports").resolve()
    assert sorted(
        p.name for p in tmp_path.rglob("*") if p.is_file() and "reports" not in p.parts
    ) == ["runs.json.gz"]
    assert len(list(rep.out.iterdir())) >= 10
