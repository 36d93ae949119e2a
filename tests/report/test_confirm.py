"""The confirmatory scoring (report/confirm.py) and its statistics (report/stats.py) against values
worked out by hand: paired and Welch t, Holm, TOST, the plateau and learning-speed scores."""

import math

import numpy as np
import pytest
import yaml

from vapo_lab.report import confirm, confirm_markdown, stats
from vapo_lab.report.collect import ReportError, RunData
from vapo_lab.report.table import run_score

KEY = "eval/avg_at_16"


def run(variant, seed, curve, status="FINISHED"):
    """A run whose held-out curve is ``curve`` (x100) at steps 0, 10, 20, ..."""
    return RunData(
        f"{variant}-{seed}",
        variant,
        seed,
        status,
        {},
        {KEY: [(10 * i, v / 100) for i, v in enumerate(curve)]},
    )


def test_paired_t_by_hand():
    # mean 1.4, squared deviations 6.7, sd sqrt(6.7/4), se sd/sqrt(5)
    d = [
        1.0,
        2.0,
        -0.5,
        3.0,
        1.5,
    ]
    t = stats.paired(d)
    se = math.sqrt(6.7 / 4) / math.sqrt(5)
    assert t.name == "paired t" and t.n == 5 and t.difference == pytest.approx(1.4)
    assert t.se == pytest.approx(se)
    assert t.p == pytest.approx(2 * stats.stats.t.sf(1.4 / se, 4))
    # 32 sign patterns; |mean| >= 1.4 for the pattern, its negation and two others with the 0.5
    # flipped... 4 of 32
    assert t.sign_flip_p == pytest.approx(4 / 32)
    assert t.ci95[0] == pytest.approx(1.4 - stats.stats.t.ppf(0.975, 4) * se)


def test_sign_flip_p_by_hand_and_its_ties_survive_the_last_bits():
    # [1, 2, 3]: only all-plus and all-minus reach |sum| 6: 2 of 8
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == 2 / 8
    # [0.1, 0.1, -0.1]: every pattern's |sum| is 0.1 or 0.3: all 8 reach 0.1
    assert stats.sign_flip_p([0.1, 0.1, -0.1]) == 1.0
    # the same differences with the last one from a cancellation (100.1 - 100.0 =
    # 0.0999999999999943): scipy's permutation_test reads 0.5 here; the tie is a tie
    assert stats.sign_flip_p([0.1, 0.1, -(100.1 - 100.0)]) == 1.0
    assert stats.sign_flip_p([0.0, 0.0]) == 1.0
    # plain differences: as scipy reads them
    d = [
        0.3,
        -0.1,
        0.7,
        0.2,
        -0.4,
        0.5,
        0.1,
        0.6,
        -0.2,
        0.4,
    ]
    exact = stats.stats.permutation_test(
        (np.array(d),),
        lambda x, axis=-1: x.mean(axis=axis),
        vectorized=True,
        permutation_type="samples",
        n_resamples=np.inf,
    ).pvalue
    assert stats.sign_flip_p(d) == pytest.approx(exact)


def test_welch_t_by_hand():
    x, y = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0]  # variances 1 and 20/3
    t = stats.welch(x, y)
    va, vb = 1 / 3, (20 / 3) / 4
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    assert (
        t.name == "Welch t"
        and t.difference == pytest.approx(-3.0)
        and t.se == pytest.approx(math.sqrt(va + vb))
    )
    assert t.df == pytest.approx(df) and t.p == pytest.approx(
        2 * stats.stats.t.sf(3 / math.sqrt(va + vb), df)
    )


def test_compare_pairs_only_the_same_seeds():
    assert stats.compare({0: 1.0, 1: 3.0, 2: 2.0}, {0: 0.0, 1: 1.0, 2: 1.5}).name == "paired t"
    assert stats.compare({0: 1.0, 1: 3.0, 2: 2.0}, {0: 0.0, 1: 1.0, 3: 1.5}).name == "Welch t"


def test_holm_by_hand():
    # sorted 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 = 0.04 -> raised to 0.06
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_tost_is_significant_exactly_when_the_90_interval_is_inside_the_margin():
    t = stats.paired([0.5, -0.3, 0.2, 0.1, -0.1, 0.4])
    for margin in (0.2, 0.3, 0.38, 0.39, 1.0):
        inside = -margin < t.ci90[0] and t.ci90[1] < margin
        assert (stats.tost_p(t, margin) < 0.05) == inside


def test_plateau_and_speed_scores():
    r = run("VAPO", 0, [50, 60, 80, 90, 94, 96])
    assert run_score(r, KEY, "plateau") == pytest.approx(95)  # steps 40 and 50: the last 20% of 50
    # trapezoids: 10 * (55 + 70 + 85 + 92 + 95) = 3970 over 50 steps
    assert run_score(r, KEY, "speed") == pytest.approx(79.4)


def plan_file(tmp_path, predictions, families=None):
    doc = {
        "source": "predictions.md",
        "alpha": 0.05,
        "families": families or {"F1": {"experiment": "main", "text": "scores"}},
        "predictions": predictions,
    }
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    return path


def groups(rows):
    out = {}
    for variant, offsets in rows.items():
        out[variant] = [
            run(variant, s, [50, 60, 70, 80, 90 + o, 90 + o]) for s, o in enumerate(offsets)
        ]
    return out


def test_verdicts_follow_the_preregistered_rules(tmp_path):
    vapo = [0.0, 1.0, -1.0, 0.5, -0.5, 0.2]
    g = groups(
        {
            "VAPO": vapo,
            "w/o clip_higher": [
                v - 5 + e for v, e in zip(vapo, [0.1, -0.2, 0.3, 0.0, -0.1, 0.2])
            ],  # clearly lower
            "w/o group_sampling": [
                v + e for v, e in zip(vapo, [0.1, -0.1, 0.05, -0.05, 0.0, 0.1])
            ],  # same
            "w/o decoupled_gae": [
                v + 6 + e for v, e in zip(vapo, [0.1, -0.2, 0.3, 0.0, -0.1, 0.2])
            ],  # far off
            "w/o token_level_loss": [v + e for v, e in zip(vapo, [3.0, -2.0, 1.0, -3.0, 2.0, 0.5])],
        }
    )  # noise
    path = plan_file(
        tmp_path,
        [
            {
                "id": "a",
                "family": "F1",
                "row": "clip_higher",
                "measure": "plateau_score",
                "expect": "lower",
                "paper": "lower",
            },
            {
                "id": "b",
                "family": "F1",
                "row": "group_sampling",
                "measure": "plateau_score",
                "expect": "same",
                "margin": 2,
                "paper": "lower",
            },
            {
                "id": "c",
                "family": "F1",
                "row": "decoupled_gae",
                "measure": "plateau_score",
                "expect": "same",
                "margin": 2,
                "paper": "lower",
            },
            {
                "id": "d",
                "family": "F1",
                "row": "token_level_loss",
                "measure": "plateau_score",
                "expect": "lower",
                "paper": "lower",
            },
            {
                "id": "e",
                "family": "F1",
                "row": "clip_higher",
                "measure": "plateau_score",
                "expect": "higher",
                "paper": "lower",
            },
        ],
    )
    result = confirm.score(confirm.load(path), lambda e: g, lambda e: KEY)
    verdicts = {r["id"]: r["verdict"] for r in result["predictions"]}
    assert verdicts == {
        "a": "confirmed",
        "b": "confirmed",
        "c": "refuted",
        "d": "inconclusive",
        "e": "refuted",
    }
    by_id = {r["id"]: r for r in result["predictions"]}
    assert by_id["a"]["test"] == "paired t" and by_id["a"]["n"] == 6
    assert by_id["a"]["difference"] == pytest.approx(-5 + 0.3 / 6)
    # Holm over the five tested p-values (a and e share their two-sided p; b and c are TOST ones)
    own = [by_id[i]["p_tested"] for i in "abcde"]
    assert [by_id[i]["holm_p"] for i in "abcde"] == pytest.approx(stats.holm(own))
    assert by_id["b"]["p_tested"] == pytest.approx(
        stats.tost_p(stats.paired([0.1, -0.1, 0.05, -0.05, 0.0, 0.1]), 2.0)
    )
    # the goal: clip_higher moved the paper's way (lower), decoupled_gae moved the other way
    assert result["goal"]["moved"] == ["clip_higher"]
    assert "paired t (6)" in confirm_markdown.to_markdown(result)


def test_a_contrast_is_tested_on_its_per_seed_sum(tmp_path):
    g = groups(
        {
            "VAPO": [0, 0, 0, 0],
            "w/o decoupled_gae": [-1, -1.2, -0.8, -1],
            "w/o length_adaptive_gae": [-3, -3.1, -2.9, -3],
            "VAPO w/o decoupled_gae, length_adaptive_gae": [-8, -8.5, -7.5, -8.2],
        }
    )
    path = plan_file(
        tmp_path,
        [
            {
                "id": "X3",
                "family": "F1",
                "measure": "plateau_score",
                "expect": "lower",
                "paper": "lower",
                "counts_for": "decoupled_gae",
                "contrast": {
                    "VAPO w/o decoupled_gae, length_adaptive_gae": 1,
                    "length_adaptive_gae": -1,
                    "decoupled_gae": -1,
                    "vapo": 1,
                },
            }
        ],
    )
    r = confirm.score(confirm.load(path), lambda e: g, lambda e: KEY)["predictions"][0]
    # per seed: (-8 + 3) - (-1 - 0) = -4, then -4.2, -3.8, -4.2
    assert (
        r["difference"] == pytest.approx(-4.05)
        and r["verdict"] == "confirmed"
        and r["paper_direction"]
    )


def test_plateau_rule_and_missing_experiments(tmp_path):
    g = groups({"VAPO": [0.0, 1.0]})
    check = confirm.plateau_check(g["VAPO"], KEY)
    assert check["flat"] and check["points"] == pytest.approx({40: 90.5, 50: 90.5})
    rising = [run("VAPO", 0, [50, 60, 70, 80, 85, 90])]
    assert confirm.plateau_check(rising, KEY)["flat"] is False
    path = plan_file(
        tmp_path,
        [
            {
                "id": "G1",
                "family": "F5",
                "row": "group_sampling",
                "measure": "plateau_score",
                "expect": "same",
                "margin": 2,
                "paper": "lower",
            }
        ],
        {"F1": {"experiment": "main"}, "F5": {"experiment": "gs"}},
    )

    def groups_of(name):
        if name == "gs":
            raise confirm.ReportError("experiment 'gs' not found")
        return g

    r = confirm.score(confirm.load(path), groups_of, lambda e: KEY)["predictions"][0]
    assert r["verdict"] == "not determinable" and "not found" in r["note"]
    # a grid still running: VAPO without a finished seed yet
    ppo = {"id": "1", "family": "F1", "row": "ppo", "measure": "plateau_score"}
    path = plan_file(tmp_path, [{**ppo, "expect": "lower", "paper": "lower"}])
    r = confirm.score(confirm.load(path), lambda e: groups({"Vanilla PPO": [0, 1]}), lambda e: KEY)
    assert r["predictions"][0]["verdict"] == "not determinable"
    assert r["predictions"][0]["note"] == "too few finished seeds: Vanilla PPO 2, VAPO 0"


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {
                "id": "z",
                "family": "F9",
                "row": "ppo",
                "measure": "plateau_score",
                "expect": "lower",
                "paper": "lower",
            },
            "family 'F9' is not one of F1",
        ),
        (
            {
                "id": "z",
                "family": "F1",
                "row": "ppo",
                "measure": "plateau_score",
                "expect": "same",
                "paper": "lower",
            },
            "needs its equivalence margin",
        ),
        (
            {
                "id": "z",
                "family": "F1",
                "measure": "plateau_score",
                "expect": "lower",
                "paper": "lower",
            },
            "either row or contrast",
        ),
    ],
)
def test_a_malformed_plan_entry_is_named_in_one_line(tmp_path, entry, message):
    with pytest.raises(confirm.ReportError, match=message) as e:
        confirm.load(plan_file(tmp_path, [entry]))
    assert "\n" not in str(e.value)


def test_the_committed_plan_loads():
    from pathlib import Path

    plan = confirm.load(
        Path(__file__).resolve().parents[2] / "reports/table1-plateau/predictions.yaml"
    )
    assert len(plan.predictions) == 33 and plan.main == "table1-plateau"
    assert {p.counts_for for p in plan.predictions} == {
        None,
        "value_pretraining",
        "decoupled_gae",
        "length_adaptive_gae",
        "clip_higher",
        "token_level_loss",
        "positive_lm_loss",
        "group_sampling",
    }


def test_the_free_task_plan_loads_with_its_families_apart():
    from pathlib import Path

    plan = confirm.load(
        Path(__file__).resolve().parents[2] / "reports/table1-free/predictions.yaml"
    )
    assert len(plan.predictions) == 34 and plan.main == "table1-free"
    assert {f: i["experiment"] for f, i in plan.families.items()} == {
        **{f: "table1-free" for f in ("F1", "F2", "F3", "F4")},
        "F5": "table1-free-lr-low",
        "F6": "table1-free-lr-high",
    }
    # issue 47's rules: the "same" predictions alone in F3; checks by construction count for none
    assert {p.family for p in plan.predictions if p.expect == "same"} == {"F3"}
    assert all(p.expect == "same" for p in plan.predictions if p.family == "F3")
    assert {p.id for p in plan.predictions if p.counts_for is None} >= {"3b", "6m"}
    assert plan.claims == ["vapo_above_dapo", "vapo_above_ppo"] and plan.rank_goal == 0.6


def test_a_finding_is_printed_beside_every_verdict_it_qualifies_and_an_unknown_id_is_refused(
    tmp_path,
):
    g = groups({"VAPO": [1.0, 2.0, 3.0, 4.0], "DAPO": [0.0, 1.2, 1.9, 3.1]})
    path = plan_file(
        tmp_path,
        [
            {
                "id": "2",
                "family": "F1",
                "row": "dapo",
                "measure": "plateau_score",
                "expect": "lower",
                "paper": "lower",
            }
        ],
    )
    plan = confirm.load(path)
    plan.claims = ["vapo_above_dapo"]
    result = confirm.score(plan, lambda e: g, lambda e: KEY)
    found = tmp_path / "findings.yaml"
    found.write_text('findings:\n  "2": at lr 2e-5 only\n')
    confirm.qualify(result, confirm.load_findings(found))
    text = confirm_markdown.to_markdown(result)
    verdict = result["predictions"][0]["verdict"]
    # the table's cell and the claim's line both carry it, and the rules say it came later
    assert f"**{verdict}** (found after the grid: at lr 2e-5 only) |" in text
    assert (
        f"- VAPO scores above DAPO: **{verdict}** (prediction 2; found after the grid: at lr"
        in text
    )
    assert "Found after the grid: not pre-registered" in text
    found.write_text("findings:\n  '7': about nothing\n")
    with pytest.raises(ReportError, match=r"--findings: 7 name no prediction or claim.*has: 2, "):
        confirm.qualify(result, confirm.load_findings(found))
    found.write_text("findings: [a list]\n")
    with pytest.raises(ReportError, match="needs 'findings:' mapping each prediction id"):
        confirm.load_findings(found)


def test_the_tally_counts_outcomes_and_mechanisms_apart_and_the_plateau_rule_reads_every_row(
    tmp_path,
):
    noise = [0.1, -0.2, 0.3, 0.0, -0.1, 0.2]

    def runs(variant, score_offset, entropy, rising=False):
        out = []
        for s, e in enumerate(noise):
            curve = (
                [50, 60, 70, 80, 84 + score_offset + e, 90 + score_offset + e]
                if rising
                else [50, 60, 70, 80, 90 + score_offset + e, 90 + score_offset + e]
            )
            r = run(variant, s, curve)
            r.history["actor/entropy"] = [(step, entropy + e / 100) for step in range(1, 51)]
            out.append(r)
        return out

    g = {
        "VAPO": runs("VAPO", 0.0, 0.50),
        "w/o token_level_loss": runs("w/o token_level_loss", -5.0, 0.50),  # an outcome
        "w/o clip_higher": runs("w/o clip_higher", 0.0, 0.20, rising=True),  # a mechanism
    }
    common = {"family": "F1", "expect": "lower", "paper": "lower"}
    path = plan_file(
        tmp_path,
        [
            {"id": "7", "row": "token_level_loss", "measure": "plateau_score", **common},
            {"id": "C2", "row": "clip_higher", "measure": "entropy", "window": "late", **common},
        ],
    )
    result = confirm.score(confirm.load(path), lambda e: g, lambda e: KEY)
    goal = result["goal"]
    assert goal["moved_outcome"] == ["token_level_loss"]
    assert goal["moved_mechanism"] == ["clip_higher"]
    assert goal["moved"] == ["clip_higher", "token_level_loss"]
    # w/o clip_higher rose 6 points (84 -> 90) between steps 40 and 50; the others are flat
    assert {v: c["flat"] for v, c in result["plateau_rows"].items()} == {
        "VAPO": True,
        "w/o clip_higher": False,
        "w/o token_level_loss": True,
    }
    text = confirm_markdown.to_markdown(result)
    assert "on an outcome (plateau score or learning speed) (a prediction counting for" in text
    assert ": 1 of 2 (token_level_loss)." in text and ": 1 of 2 (clip_higher)." in text
    assert "NOT held by w/o clip_higher (6.0): their plateau scores are scores still moving" in text


def test_the_direct_share_is_read_as_a_percentage_over_the_early_evaluations():
    from vapo_lab.report.predictions import MEASURES

    r = run("VAPO", 0, [10, 20, 30, 40, 50, 60])  # held-out evaluations at steps 0-50
    r.history["rollout/reward"] = [(s, 0.0) for s in range(1, 51)]  # training steps 1-50
    r.history["eval/mode_share_direct"] = [(0, 0.4), (10, 0.3), (20, 0.2), (30, 0.1)]
    # early: the first 20% of the training steps, 1-10: the evaluation at step 10 alone
    assert MEASURES["direct_share"].read(r, "early", KEY) == pytest.approx(30.0)
    # all: steps 10, 20 and 30 (step 0 is before training)
    assert MEASURES["direct_share"].read(r, "all", KEY) == pytest.approx(20.0)


def test_the_plateau_rule_reads_every_row_of_the_other_grids_too(tmp_path):
    flat = groups({"VAPO": [0.0, 1.0]})
    lr = {"VAPO": flat["VAPO"], "DAPO": [run("DAPO", s, [50, 60, 70, 80, 84, 90]) for s in (0, 1)]}
    common = {"measure": "plateau_score", "expect": "lower", "paper": "lower"}
    path = plan_file(
        tmp_path,
        [
            {"id": "1", "family": "F1", "row": "ppo", **common},
            {"id": "L2", "family": "F5", "row": "dapo", **common},
            {"id": "G2", "family": "F6", "row": "dapo", **common},
        ],
        {"F1": {"experiment": "main"}, "F5": {"experiment": "lr"}, "F6": {"experiment": "gone"}},
    )

    def groups_of(name):
        if name == "gone":
            raise confirm.ReportError("experiment 'gone' not found")
        return lr if name == "lr" else flat

    result = confirm.score(confirm.load(path), groups_of, lambda e: KEY)
    # DAPO at the other lr rose 6 points (84 -> 90) over steps 40-50; a missing grid has no rows
    assert {
        e: {v: c["flat"] for v, c in rows.items()} for e, rows in result["plateau_other"].items()
    } == {"lr": {"DAPO": False, "VAPO": True}}
    text = confirm_markdown.to_markdown(result)
    assert "- Plateau rule on every row (its seed-mean" in text  # the main grid's, held
    assert "- Plateau rule on every row of `lr` (its seed-mean" in text
    assert "NOT held by DAPO (6.0): their plateau scores are scores still moving" in text
