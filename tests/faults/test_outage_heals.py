"""A tracking server killed for good during a 2-cell grid, then started again: real processes.

Before issue 49 both cells finished and spooled every metric, but the grid's console said nothing
(the warnings were only in the cell logs), the store kept both cells RUNNING at step 1, and
resubmitting the grid said "nothing to submit" without sending the spools. Now the console shows
each cell's tracking warning, and the resubmission completes the cells' runs (every step once)
and ends them and the parent FINISHED. Slow: `pytest -m slow tests/faults`.
"""

import json
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.launch.conftest import SMALL
from vapo_lab.track.server import MlflowServer

from .test_services import _free_port, _wait_for

pytestmark = pytest.mark.slow

GRID = (
    "name: outage\nseeds: [0]\ncells:\n  - {name: vapo, algo: vapo}\n  - {name: dapo, algo: dapo}\n"
)


def _train_steps(path):
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {json.loads(x)["step"] for x in lines if x.strip() and "rollout/reward" in x}


def test_a_grid_s_outage_is_told_on_its_console_and_healed_by_resubmission(tmp_path):
    port = _free_port()
    server_store = tmp_path / "server-store"
    srv = MlflowServer("127.0.0.1", port, server_store).__enter__()
    (tmp_path / "g.yaml").write_text(GRID)
    args = [
        *[o for o in SMALL if not o.startswith(("trainer.total_steps", "trainer.eval_every"))],
        "trainer.total_steps=30",
        "trainer.eval_every=30",
        "launcher.local.workers=2",
        f"tracking.uri={srv.url}",
    ]
    sweep = [sys.executable, "-m", "vapo_lab.cli", "sweep", "g.yaml", *args]
    proc = subprocess.Popen(
        sweep, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:

        def metrics_files():
            return list((tmp_path / "runs" / "grids").glob("*/runs/*/metrics.jsonl"))

        _wait_for(
            lambda: (
                len(metrics_files()) == 2
                and all(len(_train_steps(f)) >= 2 for f in metrics_files())
            ),
            "two steps of both cells",
        )
        srv.stop()  # for good, while both cells run
        out, err = proc.communicate(timeout=1800)
    finally:
        proc.kill()
        srv.stop()
    assert proc.returncode == 0, err[-3000:]
    # the console: each cell's finish, and under it its tracking warning
    told = [ln for ln in err.splitlines() if ln.startswith("    tracking: MLflow at ")]
    assert len(told) == 2 and all("did not take all of run" in ln for ln in told), err

    srv = MlflowServer("127.0.0.1", port, server_store).__enter__()
    try:
        client = MlflowClient(srv.url)
        runs = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
        assert {r.info.status for r in runs} == {"RUNNING"}  # what the outage left
        again = subprocess.run(sweep, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "answers again: 3 run(s)" in again.stderr and "nothing to submit (2 finished" in (
            again.stderr
        )
        runs = client.search_runs([client.get_experiment_by_name("outage").experiment_id])
        assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3
        for r in runs:
            if r.data.tags.get("kind") == "grid":
                continue
            local = _train_steps(metrics_files_of(tmp_path, r.data.tags["cell_key"]))
            steps = [m.step for m in client.get_metric_history(r.info.run_id, "rollout/reward")]
            assert sorted(steps) == sorted(local) == list(range(1, 31))  # every step, once
    finally:
        srv.stop()


def metrics_files_of(root, key):
    (path,) = (root / "runs" / "grids").glob(f"*/runs/{key}/metrics.jsonl")
    return path
