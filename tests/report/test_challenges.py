"""The challenges figure (``report.challenges``): drawn from the measures a task logs, its numbers
the means over seeds worked out by hand, absent for runs that log none of them."""

import pytest

from vapo_lab.registry.table1 import row_name
from vapo_lab.report.challenges import challenge_lines, figure_challenges
from vapo_lab.report.collect import RunData


def _run(variant, seed, history):
    return RunData(f"{variant}-{seed}", variant, seed, "FINISHED", {}, history)


def test_the_figure_draws_the_logged_measures_with_means_over_seeds(tmp_path):
    vapo, no_vp = row_name("vapo"), row_name("value_pretraining")
    groups = {
        vapo: [
            _run(vapo, 0, {"eval/response_length": [(0, 30.0), (20, 50.0)],
                           "eval/mode_share_direct": [(0, 0.3), (20, 0.1)],
                           "diag/value_bias/000_007": [(1, -0.02), (2, 0.0)]}),
            _run(vapo, 1, {"eval/response_length": [(0, 34.0), (20, 54.0)],
                           "diag/value_bias/000_007": [(1, -0.04), (2, 0.02)]}),
        ],
        no_vp: [
            _run(no_vp, 0, {"eval/response_length": [(0, 30.0), (20, 40.0)],
                            "diag/value_bias/000_007": [(1, -0.2), (2, -0.1)]}),
        ],
        "DAPO": [_run("DAPO", 0, {"eval/response_length": [(0, 30.0), (20, 44.0)]})],
    }  # fmt: skip
    paths, info = figure_challenges(groups, tmp_path)
    assert sorted(p.name for p in paths) == ["challenges.pdf", "challenges.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    # the held-out length: the mean over seeds at its first and last eval, unsmoothed
    assert info["eval/response_length"] == {
        vapo: (0, 32.0, 20, 52.0),
        no_vp: (0, 30.0, 20, 40.0),
        "DAPO": (0, 30.0, 20, 44.0),
    }
    # the value bias: an EMA (α 0.2) of the per-step means, critic runs only
    s0, first, s1, last = info["diag/value_bias/000_007"][vapo]
    assert (s0, s1) == (1, 2) and first == pytest.approx(-0.03)
    assert last == pytest.approx(0.2 * 0.01 + 0.8 * -0.03)
    assert info["diag/value_bias/000_007"][no_vp][3] == pytest.approx(0.2 * -0.1 + 0.8 * -0.2)
    assert "DAPO" not in info["diag/value_bias/000_007"]
    assert info["eval/mode_share_direct"] == {vapo: (0, 0.3, 20, 0.1)}  # one seed logged it
    assert challenge_lines(info)[0] == (
        "- (a) held-out response length (`eval/response_length`): VAPO 32.0 at step 0 → 52.0 at "
        f"step 20; {no_vp} 30.0 at step 0 → 40.0 at step 20; DAPO 30.0 at step 0 → 44.0 at step 20"
    )
    # measures no run logged: no panel
    assert set(info) == {
        "eval/response_length",
        "eval/mode_share_direct",
        "diag/value_bias/000_007",
    }


def test_runs_without_the_direct_answer_share_get_no_figure(tmp_path):
    # the embedded default's runs log the held-out length and (critic runs) the value bias, but
    # their task has no answer-at-once mode: its reports stay as committed
    vapo = row_name("vapo")
    history = {
        "eval/avg_at_4": [(0, 0.2), (80, 0.4)],
        "eval/response_length": [(0, 9.0), (80, 8.0)],
        "diag/value_bias/000_007": [(1, -0.1), (2, 0.0)],
    }
    assert figure_challenges({vapo: [_run(vapo, 0, history)]}, tmp_path) == ([], {})
    assert not list(tmp_path.iterdir())
