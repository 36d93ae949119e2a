"""What --model names: a run, one of its checkpoints, its MLflow run id, the latest run, a model
folder."""

import shutil

import pytest

from vapo_lab.eval.model_ref import resolve_model
from vapo_lab.eval.settings import EvalError


def test_model_resolution(tiny, tmp_path):
    ckpts = tiny.run / "checkpoints"
    latest = resolve_model(str(tiny.run))
    assert (latest.step, latest.path) == (4, ckpts / "step_000004" / "policy")
    # tiny: rebuilt from the task
    assert latest.run_id == tiny.run_id and latest.tokenizer_path is None
    assert resolve_model(str(tiny.run), step=2).checkpoint == ckpts / "step_000002"
    # a checkpoint folder names its run and step
    assert resolve_model(str(ckpts / "step_000002")).step == 2
    assert resolve_model(None, runs_dir=tiny.runs).run_dir == tiny.run  # default: the latest run
    assert resolve_model(tiny.run_id, runs_dir=tiny.runs).run_dir == tiny.run  # by MLflow run id
    hf = resolve_model(str(tiny.base))
    assert (
        hf.run_dir is None and hf.tokenizer_path == tiny.base and hf.base_config["max_digits"] == 3
    )

    with pytest.raises(EvalError, match=r"no checkpoint at step 3 \(it has: 2, 4"):
        resolve_model(str(tiny.run), step=3)
    with pytest.raises(EvalError, match="does not exist: give a run directory"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(EvalError, match="no vapo-lab run under"):
        resolve_model(None, runs_dir=tmp_path)
    with pytest.raises(EvalError, match="--step 2 picks a checkpoint of a vapo-lab run"):
        resolve_model(str(tiny.base), step=2)
    empty = tmp_path / "runs" / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "run.json").write_text("{}")
    (empty / "config.yaml").write_text((tiny.run / "config.yaml").read_text())
    with pytest.raises(EvalError, match="has no checkpoint yet"):
        resolve_model(str(empty))


def test_eval_says_when_it_falls_back_to_an_older_checkpoint(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny.run, run)
    newest = run / "checkpoints" / "step_000004"
    victim = next(p for p in sorted(newest.rglob("*")) if p.is_file() and p.name != "manifest.json")
    victim.write_bytes(b"\0" * victim.stat().st_size)  # zeroed: its checksum fails
    ref = resolve_model(str(run))
    assert ref.step == 2
    err = capsys.readouterr().err
    assert "checkpoint step_000004 is unusable" in err and "falling back" in err
