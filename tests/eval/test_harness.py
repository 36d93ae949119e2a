"""The evaluation harness on a tiny model: resume, seeding, the trainer's eval, MLflow."""

import json

import pytest
import torch

from vapo_lab.eval.files import SAMPLES_FILE
from vapo_lab.eval.harness import evaluate_model
from vapo_lab.eval.settings import EvalError, EvalSettings

# 8 arith problems x 2 samples in chunks of 3 problems: chunks of 6, 6 and 4 samples
FAST = EvalSettings(samples=2, max_tokens=8, chunk_problems=3, seed=11, threads=1)


class Stop(Exception):
    """Raised by the progress hook to interrupt an evaluation after a chunk."""


def _eval(tiny, out, settings=FAST, **kw):
    return evaluate_model(
        "arith", model=str(tiny.run), settings=settings, out_dir=out, track=False, **kw
    )


def _stop_after_first_chunk(done, total):
    if done > 0:
        raise Stop


def test_resume_after_an_interrupt_equals_an_uninterrupted_run(tiny, tmp_path):
    whole = _eval(tiny, tmp_path / "whole")
    lines = (whole.samples_path).read_text().splitlines()
    assert len(lines) == 16 and whole.summary["timing"]["resumed_chunks"] == 0

    out = tmp_path / "cut"
    with pytest.raises(Stop):
        _eval(tiny, out, on_progress=_stop_after_first_chunk)
    assert len((out / SAMPLES_FILE).read_text().splitlines()) == 6  # the first chunk, whole
    with (out / SAMPLES_FILE).open("a") as f:  # and a torn second chunk, as a kill mid-write leaves
        f.write(lines[6] + "\n" + lines[7][:40])
    messages = []
    resumed = _eval(tiny, out, log=messages.append)
    assert any("1 of 3 chunks (6 samples) already done" in m for m in messages)
    assert resumed.summary["timing"]["resumed_chunks"] == 1
    assert (out / SAMPLES_FILE).read_bytes() == whole.samples_path.read_bytes()
    assert resumed.metrics == whole.metrics and resumed.per_problem == whole.per_problem

    # a rerun of a complete file generates nothing and reports the same figures
    again = _eval(tiny, out, log=messages.append)
    assert again.metrics == whole.metrics and "is complete" in messages[-1]
    assert again.summary["generation"] == whole.summary["generation"]  # the engine record is kept


def test_resume_with_other_settings_is_refused_in_one_line(tiny, tmp_path):
    out = tmp_path / "e"
    with pytest.raises(Stop):
        _eval(tiny, out, on_progress=_stop_after_first_chunk)
    hotter = EvalSettings(**{**FAST.__dict__, "temperature": 0.5})
    with pytest.raises(EvalError) as e:
        _eval(tiny, out, settings=hotter)
    assert "temperature=1.0 (now 0.5)" in str(e.value) and "--overwrite" in str(e.value)
    assert len(str(e.value).splitlines()) == 1
    fresh = _eval(tiny, out, settings=hotter, overwrite=True)
    assert len(fresh.samples_path.read_text().splitlines()) == 16


def test_same_seed_same_samples_and_another_seed_others(tiny, tmp_path):
    a = _eval(tiny, tmp_path / "a").samples_path.read_text()
    b = _eval(tiny, tmp_path / "b").samples_path.read_text()
    c = _eval(
        tiny, tmp_path / "c", settings=EvalSettings(**{**FAST.__dict__, "seed": 12})
    ).samples_path.read_text()
    assert a == b
    assert [json.loads(x)["response"] for x in a.splitlines()] != [
        json.loads(x)["response"] for x in c.splitlines()
    ]
    record = json.loads(a.splitlines()[0])
    assert set(record) >= {
        "problem_id",
        "sample_index",
        "prompt",
        "response",
        "extracted_answer",
        "correct",
        "length",
        "finish_reason",
    }
    assert record["prompt"].endswith("=") and record["finish_reason"] in ("stop", "length")


def test_arith_reproduces_the_trainers_periodic_eval(tiny, tmp_path):
    """Same checkpoint, one chunk, default seed (the trainer's seed*7919 + step): the same
    figures."""
    from transformers import AutoModelForCausalLM

    from vapo_lab.config.schema import typed
    from vapo_lab.models.load import load_model_and_tokenizer
    from vapo_lab.rollout import make_generator
    from vapo_lab.tasks import build_task
    from vapo_lab.trainer.evaluation import evaluate
    from vapo_lab.trainer.scoring import RewardScorer

    cfg = typed(tiny.cfg)
    _, tokenizer = load_model_and_tokenizer(tiny.base)  # as the trainer loads it
    policy = AutoModelForCausalLM.from_pretrained(
        tiny.run / "checkpoints" / "step_000004" / "policy"
    ).eval()
    task = build_task(
        "arith",
        seed=int(cfg.task.seed),
        n_train=int(cfg.task.n_train),
        n_eval=int(cfg.task.n_eval),
        **dict(cfg.task.options),
    )
    generate = make_generator(
        "builtin",
        policy,
        int(cfg.rollout.max_new_tokens),
        [tokenizer.eos_token_id],
        tokenizer.pad_token_id,
    )
    trainer = evaluate(
        generate,
        tokenizer,
        task,
        RewardScorer(task, tokenizer, cfg.reward),
        cfg.rollout,
        cfg.model.chat_template,
        cfg.seed * 7919 + 4,
    )

    ours = evaluate_model(
        "arith",
        model=str(tiny.run),
        settings=EvalSettings(samples=2, chunk_problems=0),
        out_dir=tmp_path / "e",
        track=False,
    )
    g = ours.summary["generation"]
    assert (g["seed"], g["max_tokens"], g["temperature"], g["top_p"]) == (
        3 * 7919 + 4,
        12,
        1.0,
        0.7,
    )
    assert ours.metrics["avg_at_2"] == pytest.approx(trainer["eval/avg_at_2"], abs=1e-12)
    assert ours.metrics["pass_at_k"]["2"] == pytest.approx(trainer["eval/pass_at_2"], abs=1e-12)
    assert ours.metrics["response_length"] == pytest.approx(
        trainer["eval/response_length"], abs=1e-9
    )
    assert ours.metrics["truncated_frac"] == pytest.approx(
        trainer["eval/truncated_frac"], abs=1e-12
    )


def test_arith_on_the_bare_base_folder_uses_its_build_config(tiny, tmp_path):
    r = evaluate_model(
        "arith", model=str(tiny.base), settings=FAST, out_dir=tmp_path / "b", track=False
    )
    assert r.metrics["problems_graded"] == 8 and r.summary["model"]["name"] == "tiny"


def test_metrics_go_into_the_training_run_at_the_checkpoint_step(tiny, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from vapo_lab.track import MlflowTracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri=uri, experiment="vapo-lab", spool_dir=str(tmp_path / "spool"))
    run_id = tracker.start("tracked", {}, {})
    tracker.finish()
    run = tmp_path / "runs" / "tracked"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text((tiny.run / "config.yaml").read_text())
    (run / "run.json").write_text(json.dumps({"run_id": run_id, "tracking_uri": uri}))
    (run / "checkpoints").symlink_to(tiny.run / "checkpoints")

    r = evaluate_model("arith", model=str(run), settings=FAST, out_dir=tmp_path / "e")
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(run_id, "eval/arith/avg_at_2")
    assert [(h.step, h.value) for h in history] == [(4, r.metrics["avg_at_2"])]
    # the training run's status is left alone
    assert client.get_run(run_id).info.status == "FINISHED"
    assert r.summary["tracking"] == {"run_id": run_id, "uri": uri, "step": 4, "new_run": False}

    # a model outside any run: a new run in experiment "eval"
    other = evaluate_model(
        "arith", model=str(tiny.base), settings=FAST, out_dir=tmp_path / "f", tracking_uri=uri
    )
    new = client.get_run(other.summary["tracking"]["run_id"])
    assert client.get_experiment(new.info.experiment_id).name == "eval"
    assert new.data.metrics["eval/arith/avg_at_2"] == other.metrics["avg_at_2"]
    assert new.data.params["temperature"] == "1.0" and new.data.params["top_p"] == "0.7"


def test_the_sampler_is_deterministic_for_a_seed_on_cpu(tiny):
    """The property resuming rests on: chunk c draws the same samples whenever it is generated."""
    from transformers import AutoModelForCausalLM

    from vapo_lab.rollout.sampler import sample

    policy = AutoModelForCausalLM.from_pretrained(
        tiny.run / "checkpoints" / "step_000002" / "policy"
    ).eval()

    def draw():
        return sample(
            policy,
            [[5, 6, 7], [8, 9]],
            n=3,
            max_new_tokens=5,
            top_p=0.7,
            eos_id=1,
            pad_id=2,
            generator=torch.Generator().manual_seed(1),
        ).response_ids

    assert torch.equal(draw(), draw())
