#!/usr/bin/env bash
# Remakes docs/img/mlflow-runs.png and docs/img/mlflow-charts.png: `vapo-lab server` showing a grid's
# experiment on its runs table and on its metric charts, in headless Chromium.
#
# The experiment: the 31 runs of reports/table1-cpu-long (vapo-lab's Table 1 grid, trained on CPU),
# imported into a fresh store by vapo-lab's own importer, which creates the experiment as training
# does. The server binds 127.0.0.1 only and is stopped at the end.
#
# Needs: vapo-lab installed, chromium (Debian: apt-get install chromium), curl.
# Run from the repository root: bash docs/img/make_mlflow_screenshot.sh [PORT]
set -euo pipefail

port=${1:-5077}
url=http://127.0.0.1:$port
work=$(mktemp -d)
server=
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/store"
exp_id=$(python - "$work/store/mlflow.db" <<'PY'
import sys

from mlflow.tracking import MlflowClient

from vapo_lab.track.export import import_runs

uri = f"sqlite:///{sys.argv[1]}"
experiment, _ = import_runs("reports/table1-cpu-long/runs.json.gz", uri)
print(MlflowClient(uri).get_experiment_by_name(experiment).experiment_id)
PY
)

vapo-lab server --host 127.0.0.1 --port "$port" --store "$work/store" &
server=$!
for _ in $(seq 120); do curl -sf "$url/health" >/dev/null && break; sleep 1; done
curl -sf "$url/health" >/dev/null

# workflowType=machine_learning: MLflow 3's UI shows the training view (runs, charts), not GenAI;
# the virtual time lets the JS app fetch the runs and every chart's metric history
shot() {
    chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --user-data-dir="$work/chromium" --window-size=1600,1000 --virtual-time-budget=60000 \
        --screenshot="$1" "$2" 2>/dev/null
}
shot docs/img/mlflow-runs.png "$url/#/experiments/$exp_id/runs?workflowType=machine_learning"
shot docs/img/mlflow-charts.png "$url/#/experiments/$exp_id/runs?workflowType=machine_learning&compareRunsMode=CHART"
ls -l docs/img/mlflow-runs.png docs/img/mlflow-charts.png
