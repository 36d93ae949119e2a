"""A report reads runs exports without a store (``collect.runs_of_export``) exactly as it reads
them imported into MLflow (``import_runs`` then ``load_runs``): the same runs, in the same order,
with the same histories, on the cases where a store could differ from the file."""

import pytest

from vapo_lab.report.collect import CURVE_METRICS, ReportError, load_runs, runs_of_export
from vapo_lab.track.export import import_runs, read_export, write_export

INF = float("inf")
ON = "value_pretraining,decoupled_gae,length_adaptive_gae,clip_higher,token_level_loss"


def _run(rid, start, tags, metrics, status="FINISHED", params=None):
    return {
        "run_id": rid,
        "run_name": rid,
        "status": status,
        "start_time": start,
        "end_time": None if status == "RUNNING" else start + 50,
        "tags": tags,
        "params": params or {},
        "metrics": metrics,
    }


def _cell(algo, seed, config_hash, off="none"):
    return {"algo": algo, "seed": str(seed), "config_hash": config_hash, "components_off": off}


RUNS = [
    # the grid's parent run: not a cell; its command names the submission
    _run("grid", 1000, {"kind": "grid"}, {}, params={"command": "vapo-lab sweep g.yaml"}),
    # one config run twice: the later, FAILED, loses to the earlier FINISHED one
    # (an empty series: nothing logged, so no such metric in a store)
    _run(
        "vapo-old",
        1100,
        _cell("vapo", 0, "h1"),
        {"eval/avg_at_4": [[0, 1, 0.25], [10, 2, 0.5]], "eval/avg_at_8": []},
    ),
    _run("vapo-new", 1200, _cell("vapo", 0, "h1"), {"eval/avg_at_4": [[0, 3, 0.3]]}, "FAILED"),
    # a resumed run logged step 10 twice (the later timestamp wins), a NaN and both infinities
    _run(
        "dapo",
        1300,
        {**_cell("dapo", 0, "h2"), "vapo.source_run_id": "dapo-original"},
        {
            "eval/avg_at_4": [[0, 1, 0.2], [10, 5, 0.4], [10, 9, 0.45]],
            "diag/value_bias/000_007": [[0, 1, float("nan")], [5, 2, INF], [10, 3, -INF]],
            "rollout/reward": [[0, 1, 1], [1, 2, 0.5]],  # an integer value
            "train/loss": [[0, 1, 3.0]],  # neither a curve nor under a read prefix: not read
        },
        params={"gae.lam_policy": "0.95", "lr": "1e-6"},
    ),
    # the same variant and seed under another config: both kept, the later first
    _run("vapo-lr", 1400, _cell("vapo", 0, "h3"), {"eval/avg_at_4": [[0, 1, 0.1]]}, "RUNNING"),
    _run("ppo", 1500, _cell("ppo", 1, "h4", ON), {"gae/lam_policy_mean": [[0, 7, 0.9]]}),
]


def test_an_export_reads_as_its_import_into_a_store(tmp_path):
    path = tmp_path / "runs.json.gz"
    write_export(path, "g", RUNS)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    import_runs(path, uri)
    stored = load_runs(uri, "g", CURVE_METRICS)
    direct = runs_of_export([read_export(path)], "g", "the runs file", CURVE_METRICS)
    assert repr(direct) == repr(stored)  # repr: NaN equals NaN there
    by_id = {r.run_id: r for r in direct}
    assert [r.run_id for r in direct] == ["ppo", "vapo-lr", "dapo-original", "vapo-old"]
    dapo = by_id["dapo-original"]
    assert dapo.history["eval/avg_at_4"] == [(0, 0.2), (10, 0.45)]
    bias = dapo.history["diag/value_bias/000_007"]
    assert bias[0][1] != bias[0][1] and bias[1:] == [
        (5, 1.7976931348623157e308),
        (10, -1.7976931348623157e308),
    ]
    assert "train/loss" not in dapo.history and dapo.params == {"gae.lam_policy": "0.95"}
    assert dapo.tags["grid_commands"] == "vapo-lab sweep g.yaml"
    assert by_id["vapo-lr"].status == "RUNNING" and by_id["vapo-old"].status == "FINISHED"
    assert list(by_id["vapo-old"].history) == ["eval/avg_at_4"]


def test_an_experiment_not_in_the_files_is_named_with_those_there(tmp_path):
    write_export(tmp_path / "a.json.gz", "g", RUNS)
    data = [read_export(tmp_path / "a.json.gz")]
    with pytest.raises(ReportError, match=r"no experiment 'h' in the runs file a \(there: g\)"):
        runs_of_export(data, "h", "the runs file a")
    write_export(tmp_path / "b.json.gz", "e", RUNS[:1])
    with pytest.raises(ReportError, match="experiment 'e' in b has no training runs yet"):
        runs_of_export([read_export(tmp_path / "b.json.gz")], "e", "b")
