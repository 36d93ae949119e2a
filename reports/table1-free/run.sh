#!/usr/bin/env bash
# Issue 47's grids in their pre-registered order (predictions.md). Rerun unchanged after an
# interruption: finished runs are skipped, interrupted ones resume from their checkpoints.
#   ROOT=/work/grids/free bash reports/table1-free/run.sh   (ROOT: runs, MLflow store, caches)
# Runs `vapo-lab` from PATH (the pinned copy's venv, see resume.sh) with the grid files beside it.
set -uo pipefail
ROOT=${ROOT:?set ROOT to the folder for runs, the MLflow store and caches (outside the work tree)}
HERE=$(cd "$(dirname "$0")/../.." && pwd)  # the copy whose experiments/ this runs
cd "$ROOT"
common=(launcher.local.workers=2 "output_dir=$ROOT/runs" "tracking.uri=sqlite:///$ROOT/mlflow.db")
run() { echo "== $(date -u +%FT%TZ) $*"; vapo-lab sweep "$HERE/experiments/$1.yaml" "${@:2}" "${common[@]}" || echo "== $1 ended with status $?"; }
run table1-free --seeds 5
run table1-free-lr-low
run table1-free-lr-high
run table1-free
echo "== $(date -u +%FT%TZ) done"
