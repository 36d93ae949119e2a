"""`vapo-lab report` on runs logged to a temporary MLflow store with metric values chosen here."""

import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from vapo_lab.report import ReportError, make_report

ALL_ON = "none"


def _log(
    client, exp_id, algo, off, seed, evals, status="FINISHED", curves=None, grid="g-1", machine=None
):
    run = client.create_run(
        exp_id,
        tags={
            "algo": algo,
            "components_off": off,
            "seed": str(seed),
            "grid_id": grid,
            "git_commit": "abc123",
            **({"machine": machine} if machine else {}),
        },
    )
    rid = run.info.run_id
    for step, v in evals:
        client.log_metric(rid, "eval/avg_at_4", v, step=step)
    for key, values in (curves or {}).items():
        for step, v in enumerate(values, start=1):
            client.log_metric(rid, key, v, step=step)
    client.set_terminated(rid, status=status)
    return rid


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("table1")


DAPO_OFF = "value_pretraining,decoupled_gae,length_adaptive_gae,positive_lm_loss"
PPO_OFF = (
    "value_pretraining,decoupled_gae,length_adaptive_gae,clip_higher,token_level_loss,"
    "positive_lm_loss,group_sampling"
)


def test_table_numbers_are_the_hand_computed_aggregates(store, tmp_path):
    uri, client, exp = store
    for s, v in enumerate([0.50, 0.56, 0.53]):
        _log(
            client,
            exp,
            "vapo",
            ALL_ON,
            s,
            [(0, 0.40), (10, v)],
            curves={
                "rollout/response_length": [30, 40, 50],
                "rollout/reward": [0.1, 0.2, 0.3],
                "actor/entropy": [0.5, 0.4, 0.3],
            },
        )
    _log(
        client,
        exp,
        "dapo",
        DAPO_OFF,
        0,
        [(0, 0.40), (10, 0.48), (20, 0.46)],
        curves={
            "rollout/response_length": [30, 35, 38],
            "rollout/reward": [0.1, 0.15, 0.2],
            "actor/entropy": [0.5, 0.45, 0.44],
        },
    )
    _log(client, exp, "ppo", PPO_OFF, 0, [(0, 0.40), (10, 0.30)])
    _log(client, exp, "vapo", "clip_higher", 0, [(0, 0.40), (10, 0.52)])
    _log(client, exp, "vapo", "clip_higher", 1, [(0, 0.40), (10, 0.54)])
    _log(client, exp, "vapo", "group_sampling", 0, [(0, 0.40), (4, 0.41)], status="RUNNING")
    rep = make_report("table1", tmp_path / "out", uri)
    rows = {d["variant"]: d for d in rep.table}
    v = rows["VAPO"]
    assert v["seeds"] == 3 and v["mean"] == pytest.approx(53.0)
    # sample std: 3.0
    assert v["std"] == pytest.approx(math.sqrt(((50 - 53) ** 2 + (56 - 53) ** 2 + 0) / 2))
    assert rows["DAPO"]["mean"] == pytest.approx(46.0)  # final, not best (48)
    assert rows["DAPO"]["other_mean"] == pytest.approx(48.0)  # best, in its own column
    assert rows["DAPO"]["delta"] == pytest.approx(-7.0) and rows["DAPO"][
        "paper_delta"
    ] == pytest.approx(-10.0)
    assert rows["w/o clip_higher"]["mean"] == pytest.approx(53.0) and rows["w/o clip_higher"][
        "std"
    ] == pytest.approx(math.sqrt(2))
    assert (
        rows["Vanilla PPO"]["mean"] == pytest.approx(30.0) and rows["Vanilla PPO"]["paper"] == 5.0
    )
    assert (
        rows["w/o group_sampling"]["state"] == "running, step 4"
        and rows["w/o group_sampling"]["mean"] is None
    )
    assert rows["w/o decoupled_gae"]["state"] == "not run"
    # rank agreement over the 4 scored rows: ours PPO 30 < DAPO 46 < w/o CH 53 = VAPO 53; paper
    # 5 < 46 < 50 < 60. Ranks: ours [1, 2, 3.5, 3.5], paper [1, 3, 2, 4]; centred
    # [-1.5, -0.5, 1, 1] and [-1.5, 0.5, -0.5, 1.5]: ρ = 3 / √(4.5·5). τ-b: 4 concordant pairs,
    # 1 discordant (DAPO, w/o CH), 1 tied in ours: 3 / √(5·6).
    assert rep.rank["n"] == 4
    assert rep.rank["spearman"] == pytest.approx(3 / math.sqrt(22.5), abs=1e-6)
    assert rep.rank["kendall"] == pytest.approx(3 / math.sqrt(30), abs=1e-6)
    lo, hi = rep.rank["spearman_ci"]
    assert -1 <= lo <= rep.rank["spearman"] <= hi <= 1
    # 3 seeds: the 95% interval is the seeds' range (test_stats derives why); w/o CH's difference
    # from VAPO, (52, 54) against (50, 56, 53), holds 0: not separable
    assert v["ci"] == pytest.approx((50.0, 56.0), abs=1e-6)
    assert rows["w/o clip_higher"]["separable"] is False and rows["DAPO"]["separable"] is None
    md = (tmp_path / "out" / "table1.md").read_text()
    assert (
        "| VAPO | 53.0 ± 3.0 | [50.0, 56.0] | 3 | +0.0 | reference | 60.0 | +0.0 | 53.0 ± 3.0 |"
        in md
    )
    # one seed: no spread, so no "± 0.0", no interval, separability not determinable
    assert "| DAPO | 46.0 | n=1, no interval | 1 | -7.0 | — | 50.0 | -10.0 | 48.0 |" in md
    assert "± 0.0" not in md and r"\pm 0.0" not in (tmp_path / "out" / "table1.tex").read_text()
    assert "| w/o clip_higher | 53.0 ± 1.4 | [52.0, 54.0] | 2 | +0.0 [" in md and "| no (" in md
    assert "ours: avg@4 best (mean ± std) |" in md.splitlines()[0]
    assert "| w/o decoupled_gae | not run |  | 0 |" in md and "running, step 4" in md
    assert "Spearman ρ = 0.63 [95% interval" in md and "Holm-adjusted over every row tested" in md
    assert r"\toprule" in (tmp_path / "out" / "table1.tex").read_text()
    csv = (tmp_path / "out" / "table1.csv").read_text().splitlines()
    assert csv[0].startswith("variant,mean,std,ci_low,ci_high,seeds")
    assert next(x for x in csv if x.startswith("DAPO,")).startswith("DAPO,46.0000,,,,1,")

    best = make_report("table1", tmp_path / "best", uri, score="best")
    assert {d["variant"]: d for d in best.table}["DAPO"]["mean"] == pytest.approx(48.0)
    assert {d["variant"]: d for d in best.table}["DAPO"]["other_mean"] == pytest.approx(46.0)


def test_figures_have_the_expected_panels_and_series(store, tmp_path):
    uri, client, exp = store
    for s in range(2):
        _log(
            client,
            exp,
            "vapo",
            ALL_ON,
            s,
            [(0, 0.4), (5, 0.5), (10, 0.6)],
            curves={
                "rollout/response_length": [30, 40],
                "rollout/reward": [0.1, 0.2],
                "actor/entropy": [0.5, 0.4],
            },
            machine="CPU B (AVX512), torch 1, python 3",
        )
    _log(
        client,
        exp,
        "dapo",
        DAPO_OFF,
        0,
        [(0, 0.4), (5, 0.45), (10, 0.55)],
        curves={
            "rollout/response_length": [30, 33],
            "rollout/reward": [0.1, 0.12],
            "actor/entropy": [0.5, 0.49],
        },
        machine="CPU A (AVX2), torch 1, python 3",
    )
    rep = make_report("table1", tmp_path / "out", uri)
    for name in ("figure1.png", "figure1.pdf", "figure2.png", "figure2.pdf", "index.md"):
        assert (tmp_path / "out" / name).stat().st_size > 1000, name
    assert rep.figure2 == {
        k: {"VAPO": 2, "DAPO": 2}
        for k in ("rollout/response_length", "rollout/reward", "actor/entropy")
    }
    # VAPO's final 60 -> target 54: VAPO first reaches it at step 10, DAPO (55) at step 10 too
    assert rep.figure1["VAPO"] == {"final": pytest.approx(60.0), "reach_90": 10}
    assert rep.figure1["DAPO"]["reach_90"] == 10
    index = (tmp_path / "out" / "index.md").read_text()
    assert "![Figure 2](figure2.png)" in index and "abc123" in index and "g-1" in index
    assert "Ran on: CPU A (AVX2), torch 1, python 3; CPU B (AVX512), torch 1, python 3." in index
    # the bands say what they are, in Figure 2's and Figure 1's text
    assert (
        index.count(
            "Shaded: min–max over seeds at each point, which with 2 or 3 seeds is also the 95% "
            "percentile-bootstrap interval of the mean; a variant with one seed has no band."
        )
        == 2
    )
    std = make_report("table1", tmp_path / "std", uri, band="std")
    assert (
        "Shaded: mean ± 1 sample std over seeds at each point; a variant"
        in (tmp_path / "std" / "index.md").read_text()
    )
    assert std.figure1 == rep.figure1
    ci = make_report("table1", tmp_path / "ci", uri, band="ci")
    assert (
        "Shaded: the 95% percentile-bootstrap interval of the mean over seeds at each point; a "
        "variant" in (tmp_path / "ci" / "index.md").read_text()
    )
    assert ci.figure1 == rep.figure1
    with pytest.raises(ReportError, match="--band iqr: choose one of minmax, std, ci"):
        make_report("table1", tmp_path / "iqr", uri, band="iqr")


def test_empty_and_missing_experiments_name_the_fix(store, tmp_path):
    uri, client, exp = store
    with pytest.raises(ReportError, match="no training runs yet.*vapo-lab ablate --table1"):
        make_report("table1", tmp_path / "o", uri)
    with pytest.raises(ReportError, match="no experiment 'nope'.*vapo-lab ablate"):
        make_report("nope", tmp_path / "o", uri)
    _log(client, exp, "vapo", ALL_ON, 0, [(0, 0.4)])
    with pytest.raises(ReportError, match="--variants GRPO: not in experiment"):
        make_report("table1", tmp_path / "o", uri, variants=["GRPO"])


def test_cli_report_prints_the_table(store, tmp_path):
    from typer.testing import CliRunner

    from vapo_lab.cli import app

    uri, client, exp = store
    _log(client, exp, "vapo", ALL_ON, 0, [(0, 0.4), (10, 0.5)])
    _log(client, exp, "dapo", DAPO_OFF, 0, [(0, 0.4), (10, 0.45)])
    r = CliRunner().invoke(app, ["report", "--tracking-uri", uri, "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert (
        "| VAPO | 50.0 | n=1, no interval | 1 |" in r.output
        and Path(tmp_path / "r" / "index.md").is_file()
    )
    r = CliRunner().invoke(app, ["report", "--tracking-uri", uri, "--experiment", "nope"])
    assert r.exit_code == 1 and "error: no experiment 'nope'" in r.output


def test_a_cell_logged_twice_counts_once(store, tmp_path):
    uri, client, exp = store
    # the same cell (config hash) in two grids: the later finished run counts
    for v in (
        0.30,
        0.50,
    ):
        rid = _log(client, exp, "vapo", ALL_ON, 0, [(0, 0.4), (10, v)])
        client.set_tag(rid, "config_hash", "c0ffee")
    _log(client, exp, "vapo", ALL_ON, 1, [(0, 0.4), (10, 0.70)])
    rows = {d["variant"]: d for d in make_report("table1", tmp_path / "o", uri).table}
    assert rows["VAPO"]["seeds"] == 2 and rows["VAPO"]["mean"] == pytest.approx(60.0)


def test_diagnostics_are_the_hand_computed_aggregates(store, tmp_path):
    """Five training steps: early = step 1, late = step 5 (a fifth of the steps, at least one)."""
    uri, client, exp = store
    bias = {
        "diag/value_bias/000_007": [-0.4, -0.3, -0.2, -0.1, 0.0],
        "diag/value_bias/008_015": [0.2] * 5,
        "diag/value_bias/all": [-0.1] * 5,
    }
    length = {
        "diag/length/count_000_007": [6, 6, 6, 6, 2],
        "diag/length/acc_000_007": [0.5, 0, 0, 0, 1.0],
        "diag/length/count_008_015": [2, 2, 2, 2, 6],
        "diag/length/acc_008_015": [0.0, 0, 0, 0, 0.5],
        "diag/length/correct_mean": [5, 6, 7, 8, 9],
        "diag/length/wrong_mean": [4, 4, 4, 4, 4],
        "gae/lam_policy_mean": [0.9] * 5,
        "gae/lam_policy_zero_frac": [0.0] * 5,
        "actor/clipfrac_low": [0.01] * 5,
        "actor/clipfrac_high": [0.002] * 5,
    }
    for s, shift in enumerate((0.0, 0.2)):  # VAPO seeds 0 and 1: seed 1's early bias is 0.2 higher
        rid = _log(
            client,
            exp,
            "vapo",
            ALL_ON,
            s,
            [(0, 0.4), (5, 0.5)],
            curves={
                **{
                    k: [v + shift if k.endswith("000_007") else v for v in vs]
                    for k, vs in bias.items()
                },
                **length,
            },
        )
        client.log_param(rid, "gae.alpha", "2.5")
        client.log_param(rid, "rollout.max_new_tokens", "16")
    _log(
        client,
        exp,
        "vapo",
        "value_pretraining",
        0,
        [(0, 0.4), (5, 0.45)],
        curves={"diag/value_bias/000_007": [0.5] * 5, "diag/value_bias/all": [0.5] * 5},
    )
    # the advantage gap, logged by w/o length_adaptive_gae only (a step without long responses of
    # both kinds logs none: steps 2-4 here); early = step 1, late = step 5
    rid = _log(client, exp, "vapo", "length_adaptive_gae", 0, [(0, 0.4), (5, 0.45)])
    for step, v in ((1, 0.2), (5, 0.6)):
        client.log_metric(rid, "diag/adv_gap/000_007", v, step=step)
    for step in range(1, 6):
        client.log_metric(rid, "rollout/reward", 0.5, step=step)
    rep = make_report("table1", tmp_path / "out", uri)
    gap = rep.diagnostics["diag_adv_gap"]
    assert gap == {
        "w/o length_adaptive_gae": {
            "early": {"000_007": pytest.approx(0.2)},
            "late": {"000_007": pytest.approx(0.6)},
        }
    }
    for stem in ("diag_value_bias", "diag_adv_gap", "diag_lambda", "diag_length", "diag_clip"):
        assert (tmp_path / "out" / f"{stem}.png").stat().st_size > 1000, stem
        assert (tmp_path / "out" / f"{stem}.pdf").stat().st_size > 1000, stem
    vb = rep.diagnostics["diag_value_bias"]
    assert vb["VAPO"]["early"]["000_007"] == pytest.approx((-0.4 + -0.2) / 2)
    assert vb["VAPO"]["late"]["000_007"] == pytest.approx((0.0 + 0.2) / 2)
    assert vb["VAPO"]["late"]["008_015"] == pytest.approx(0.2)
    assert vb["w/o value_pretraining"]["early"] == {
        "000_007": pytest.approx(0.5),
        "all": pytest.approx(0.5),
    }
    la = rep.diagnostics["diag_length"]["VAPO"]
    # step 1 of both seeds: 12 responses of 0-7 tokens, half correct; late (step 5): 4 short, all
    # correct
    assert la["early"]["000_007"] == {"count": 12.0, "acc": pytest.approx(0.5)}
    assert la["late"]["008_015"] == {"count": 12.0, "acc": pytest.approx(0.5)}
    lam = rep.diagnostics["diag_lambda"]
    # 2 seeds x (26 short + 14 longer) responses; λ(10) = 1 - 1/25
    assert lam["length_share"] == {
        "000_007": pytest.approx(52 / 80),
        "008_015": pytest.approx(28 / 80),
    }
    assert lam["lambda_at"][10] == pytest.approx(0.96) and lam["lambda_at"][5] == pytest.approx(
        0.92
    )
    assert rep.diagnostics["diag_clip"]["VAPO"] == {
        "clipfrac_low": pytest.approx(0.01),
        "clipfrac_high": pytest.approx(0.002),
    }
    index = (tmp_path / "out" / "index.md").read_text()
    assert "![Value bias by token position](diag_value_bias.png)" in index
    # the three figures of per-run means say what their band is; the λ figure pools all seeds
    assert (
        index.count("Lines: mean over seeds of each run's value. Shaded: min–max over seeds") == 4
    )
    assert "| w/o length_adaptive_gae | late | +0.600 |" in index
    assert "| VAPO | early | -0.300 | +0.200 | -0.100 |" in index
    assert "0-7 50% (n=12)" in index


def test_runs_without_diagnostics_say_so(store, tmp_path):
    uri, client, exp = store
    _log(client, exp, "vapo", ALL_ON, 0, [(0, 0.4), (10, 0.5)])
    rep = make_report("table1", tmp_path / "out", uri)
    assert rep.diagnostics == {} and not (tmp_path / "out" / "diag_value_bias.png").exists()
    assert "No run logged the trainer's diagnostics" in (tmp_path / "out" / "index.md").read_text()


def test_a_report_from_a_runs_export_is_the_same_report(store, tmp_path):
    """Export, import into a fresh store, report: the very same files (run ids included)."""
    from vapo_lab.report import report_from_export
    from vapo_lab.track.export import ExportError, export_runs

    uri, client, exp = store
    ids = [
        _log(
            client,
            exp,
            "vapo",
            ALL_ON,
            s,
            [(0, 0.4), (10, v)],
            curves={
                "rollout/response_length": [30, 40],
                "rollout/reward": [0.1, 0.2],
                "actor/entropy": [0.5, 0.4],
                "diag/value_bias/000_007": [0.3, 0.1],
            },
        )
        for s, v in enumerate([0.5, 0.6])
    ]
    _log(client, exp, "dapo", DAPO_OFF, 0, [(0, 0.4), (10, 0.45)], status="RUNNING")
    direct = make_report("table1", tmp_path / "direct", uri)
    assert export_runs(uri, "table1", tmp_path / "runs.json.gz") == 3
    again = report_from_export(tmp_path / "runs.json.gz", tmp_path / "again")
    assert [p.name for p in again.files] == [p.name for p in direct.files]
    for name in ("table1.md", "table1.tex", "table1.csv", "index.md", "report.json"):
        assert (tmp_path / "again" / name).read_text() == (
            tmp_path / "direct" / name
        ).read_text(), name
    assert all(i in (tmp_path / "again" / "index.md").read_text() for i in ids)
    first = (tmp_path / "runs.json.gz").read_bytes()
    export_runs(uri, "table1", tmp_path / "runs.json.gz")
    assert (tmp_path / "runs.json.gz").read_bytes() == first  # same runs, same bytes
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ExportError, match="cannot read runs file .*--save-runs"):
        report_from_export(tmp_path / "bad.json.gz", tmp_path / "x")


def test_variant_reads_a_run_by_the_components_it_had():
    from vapo_lab.report.collect import variant_of

    # DAPO as logged with the seven components tagged: its preset's off list, so plain DAPO
    tagged = {
        f"component.{c}": "off"
        for c in ("value_pretraining", "decoupled_gae", "length_adaptive_gae", "positive_lm_loss")
    }
    tagged.update(
        {f"component.{c}": "on" for c in ("clip_higher", "token_level_loss", "group_sampling")}
    )
    off = "value_pretraining,decoupled_gae,length_adaptive_gae,positive_lm_loss"
    assert variant_of({"algo": "dapo", "components_off": off, **tagged}) == "DAPO"
    # a run that lacks a tag for a registered component (logged before it existed) is not read as
    # having turned it back on
    del tagged["component.positive_lm_loss"]
    assert (
        variant_of(
            {"algo": "dapo", "components_off": off.replace(",positive_lm_loss", ""), **tagged}
        )
        == "DAPO"
    )
    assert variant_of({"algo": "vapo", "components_off": "clip_higher"}) == "w/o clip_higher"
    assert (
        variant_of(
            {"algo": "ppo", "components_off": off + ",clip_higher,token_level_loss,group_sampling"}
        )
        == "Vanilla PPO"
    )
    assert (
        variant_of({"algo": "dapo", "components_off": off + ",clip_higher"})
        == "DAPO w/o clip_higher"
    )
