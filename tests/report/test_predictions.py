"""Scoring pre-registered predictions: each measure against values worked out by hand, the verdict
rule on every side of the interval, and bad prediction files refused in one line."""

import pytest

from vapo_lab.report import predictions as pred
from vapo_lab.report.collect import ReportError, RunData

KEY = "eval/avg_at_4"


def run(variant, seed, **history):
    """A finished run; metric names use "." for "/" (``diag.value_bias.000_007``)."""
    hist = {k.replace(".", "/"): v for k, v in history.items()}
    hist.setdefault("rollout/reward", [(s, 0.5) for s in range(1, 11)])  # 10 training steps
    return RunData(
        run_id=f"{variant}-{seed}",
        variant=variant,
        seed=seed,
        status="FINISHED",
        tags={},
        history=hist,
    )


def test_windowed_measures_are_the_hand_computed_means():
    # 10 steps: the early window is steps 1-2, the late one 9-10 (a fifth, at least one)
    r = run(
        "VAPO",
        0,
        **{
            "diag.value_bias.000_007": [(1, -0.4), (2, -0.2), (9, 0.1), (10, 0.1)],
            "diag.value_bias.008_015": [(1, -0.6), (2, -0.4)],  # not logged late: left out there
            "diag.value_bias.032_063": [(1, 9.0)],  # not an early-token bucket
            "diag.adv_gap.016_031": [(3, 0.5), (7, 1.5)],
            "actor.entropy": [(s, s / 10) for s in range(1, 11)],
        },
    )
    m = pred.MEASURES
    # early: bucket means -0.3 and -0.5, their mean -0.4, absolute 0.4
    assert m["value_bias_early_tokens_abs"].read(r, "early", KEY) == pytest.approx(0.4)
    assert m["value_bias_early_tokens_abs"].read(r, "late", KEY) == pytest.approx(0.1)
    assert m["adv_gap_early_tokens"].read(r, "all", KEY) == pytest.approx(1.0)
    assert m["adv_gap_early_tokens"].read(r, "early", KEY) is None  # never logged in steps 1-2
    assert m["entropy"].read(r, "late", KEY) == pytest.approx(0.95)
    assert m["clipfrac_high"].read(r, "late", KEY) is None


def test_long_accuracy_weights_each_step_by_its_count():
    r = run(
        "VAPO",
        0,
        **{
            "diag.length.count_064_127": [(9, 10), (10, 30)],
            "diag.length.acc_064_127": [(9, 0.5), (10, 0.1)],
            "diag.length.count_128_255": [(10, 10), (1, 100)],
            "diag.length.acc_128_255": [(10, 0.2), (1, 1.0)],
            "diag.length.count_032_063": [(10, 50)],
            "diag.length.acc_032_063": [(10, 1.0)],
        },
    )
    # late (steps 9-10): (10*0.5 + 30*0.1 + 10*0.2) / 50 = 10 / 50 = 20%; step 1 and short
    # responses left out
    assert pred.MEASURES["long_accuracy"].read(r, "late", KEY) == pytest.approx(20.0)
    assert pred.MEASURES["long_accuracy"].read(r, "early", KEY) == pytest.approx(100.0)


def test_score_is_the_final_evaluation():
    r = run("VAPO", 0, **{"eval.avg_at_4": [(10, 0.5), (20, 0.6), (30, 0.55)]})
    assert pred.MEASURES["score"].read(r, "late", KEY) == pytest.approx(55.0)


@pytest.mark.parametrize(
    "expect, interval, verdict",
    [
        ("lower", (-3.0, -1.0), "confirmed"),
        ("lower", (1.0, 3.0), "refuted"),
        ("lower", (-1.0, 1.0), "not separable"),
        ("higher", (1.0, 3.0), "confirmed"),
        ("higher", (-3.0, -1.0), "refuted"),
        ("higher", (-1.0, 1.0), "not separable"),
        ("same", (-1.0, 1.0), "confirmed"),
        ("same", (1.0, 3.0), "refuted"),
        ("same", (-3.0, -1.0), "refuted"),
        ("lower", None, "not determinable"),
    ],
)
def test_verdict_rule(expect, interval, verdict):
    assert pred.verdict(expect, interval) == verdict


def _groups(vapo, row, dapo=None, ppo=None):
    g = {
        "VAPO": [run("VAPO", s, **{"eval.avg_at_4": [(10, v / 100)]}) for s, v in enumerate(vapo)],
        "w/o clip_higher": [
            run("w/o clip_higher", s, **{"eval.avg_at_4": [(10, v / 100)]})
            for s, v in enumerate(row)
        ],
    }
    for name, vals in (("DAPO", dapo), ("Vanilla PPO", ppo)):
        if vals:
            g[name] = [
                run(name, s, **{"eval.avg_at_4": [(10, v / 100)]}) for s, v in enumerate(vals)
            ]
    return g


def test_scoring_separates_seeds_that_do_not_overlap_and_counts_the_paper_direction():
    p = [pred.Prediction("4a", "clip_higher", "score", "all", "same", "lower")]
    # the exact interval: the 2.5% and 97.5% quantiles of the 27 x 27 equally likely differences of
    # resample means (enumerated by hand in a script: -11 1/3 and -8 2/3); 9999 random resamples
    # land within one step (1/3) of them
    res = pred.score(p, [], _groups([50, 51, 52], [40, 41, 42]), KEY)
    s = res["predictions"][0]
    assert s["difference"] == pytest.approx(-10.0)
    assert s["interval"] == pytest.approx((-34 / 3, -26 / 3), abs=0.34)
    assert s["verdict"] == "refuted" and s["paper_direction"] is True
    assert res["goal"] == {"components": ["clip_higher"], "moved": ["clip_higher"]}
    res = pred.score(p, [], _groups([50, 51, 52], [49, 51, 53]), KEY)
    assert res["predictions"][0]["verdict"] == "confirmed" and res["goal"]["moved"] == []


def test_preset_claims():
    g = _groups([50, 51, 52], [48, 49, 50], dapo=[40, 41, 42], ppo=[30, 31, 32])
    res = pred.score([], ["ppo_lowest", "vapo_above_dapo"], g, KEY)
    assert [c["verdict"] for c in res["claims"]] == ["confirmed", "confirmed"]
    g = _groups([50, 51, 52], [28, 29, 30], dapo=[50, 52, 54], ppo=[30, 31, 32])
    res = pred.score([], ["ppo_lowest", "vapo_above_dapo"], g, KEY)
    assert [c["verdict"] for c in res["claims"]] == ["refuted", "not separable"]
    assert "w/o clip_higher at or below" in res["claims"][0]["detail"]


def test_markdown_states_each_verdict_and_the_goal_count():
    p = [pred.Prediction("4a", "clip_higher", "score", "all", "lower", "lower")]
    text = pred.to_markdown(
        pred.score(p, [], _groups([50, 51, 52], [40, 41, 42]), KEY), "predictions.md"
    )
    assert "| 4a | w/o clip_higher | held-out score" in text and "**confirmed**" in text
    assert "-10.0 [-11." in text
    assert "1 of 1 (clip_higher)" in text


@pytest.mark.parametrize(
    "body, needle",
    [
        (
            "predictions: [{id: 1, row: nope, measure: score, expect: lower, paper: lower}]",
            "row 'nope' is not one of",
        ),
        (
            "predictions: [{id: 1, row: clip_higher, measure: speed, expect: lower, paper: lower}]",
            "measure 'speed'",
        ),
        (
            "predictions: [{id: 1, row: clip_higher, measure: score, expect: down, paper: lower}]",
            "expect 'down'",
        ),
        (
            "predictions: [{id: 1, row: clip_higher, measure: score, window: mid, expect: lower, "
            "paper: lower}]",
            "window 'mid'",
        ),
        ("predictions: [{id: 1, row: clip_higher, measure: score}]", "lacks expect, paper"),
        ("predictions: []\nclaims: [ppo_best]", "unknown claim(s) ppo_best"),
        ("rows: 3", "needs a 'predictions:' list"),
        ("predictions: [", "not valid YAML"),
    ],
)
def test_a_bad_predictions_file_is_refused_in_one_line(tmp_path, body, needle):
    path = tmp_path / "p.yaml"
    path.write_text(body)
    with pytest.raises(ReportError) as e:
        pred.load(path)
    assert needle in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ReportError, match="no such file"):
        pred.load(tmp_path / "missing.yaml")


def test_the_committed_predictions_file_loads():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "reports" / "table1-cpu-long" / "predictions.yaml"
    preds, claims, source = pred.load(path)
    assert len(preds) == 16 and {p.row for p in preds} == set(pred.COMPONENTS.names())
    assert claims == ["ppo_lowest", "vapo_above_dapo"] and source == "predictions.md"


def test_cli_refuses_a_missing_predictions_file_before_reading_the_store(tmp_path):
    from typer.testing import CliRunner

    from vapo_lab.cli import app

    store = tmp_path / "no-store.db"  # never created: the predictions file is checked first
    r = CliRunner().invoke(
        app,
        [
            "report",
            "--tracking-uri",
            f"sqlite:///{store}",
            "--out",
            str(tmp_path / "r"),
            "--predictions",
            str(tmp_path / "p.yaml"),
        ],
    )
    assert r.exit_code == 1 and "error: --predictions" in r.output and "no such file" in r.output
    assert not store.exists() and not (tmp_path / "r").exists()
