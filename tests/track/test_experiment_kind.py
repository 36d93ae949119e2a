"""Experiments vapo-lab logs to open in MLflow 3's model-training view (runs table, metric charts),
not its GenAI view: they carry ``mlflow.experimentKind = custom_model_development``."""

import gzip
import json

from mlflow.tracking import MlflowClient

from vapo_lab.track import MlflowTracker
from vapo_lab.track.export import FORMAT, import_runs

KIND = "mlflow.experimentKind"


def _kind(uri, name):
    return MlflowClient(uri).get_experiment_by_name(name).tags.get(KIND)


def _start(uri, tmp_path, name):
    t = MlflowTracker(uri, name, spool_dir=tmp_path / "spool")
    t.start("r", {}, {})
    t.finish()


def test_a_new_experiment_is_a_model_training_one(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _start(uri, tmp_path, "grid")
    assert _kind(uri, "grid") == "custom_model_development"


def test_an_older_experiment_without_a_kind_gets_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("old")
    assert _kind(uri, "old") is None
    _start(uri, tmp_path, "old")
    assert _kind(uri, "old") == "custom_model_development"


def test_a_kind_the_user_set_is_kept(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("mine", tags={KIND: "genai_development"})
    _start(uri, tmp_path, "mine")
    assert _kind(uri, "mine") == "genai_development"


def test_imported_runs_land_in_a_model_training_experiment(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = tmp_path / "runs.json.gz"
    run = {
        "run_id": "a" * 32,
        "run_name": "r",
        "status": "FINISHED",
        "start_time": 1,
        "end_time": 2,
        "tags": {},
        "params": {},
        "metrics": {"eval/avg_at_4": [[0, 1, 0.5]]},
    }
    with gzip.open(path, "wt") as f:
        json.dump({"format": FORMAT, "experiment": "table1", "runs": [run]}, f)
    assert import_runs(path, uri) == ("table1", 1)
    assert _kind(uri, "table1") == "custom_model_development"


def test_the_server_says_how_to_open_the_training_view():
    from vapo_lab.track.server import ui_hint

    hint = ui_hint("http://127.0.0.1:5000")
    assert (
        "'Model training'" in hint
        and "http://127.0.0.1:5000/#/experiments/<id>?workflowType=machine_learning" in hint
    )
