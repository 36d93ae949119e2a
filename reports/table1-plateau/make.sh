#!/usr/bin/env bash
# Makes issue 28's reports in this folder from the grids' MLflow store, once every grid is complete:
#   ROOT=/work/grids/v3 bash reports/table1-plateau/make.sh
# It refuses while any cell of run.sh's grids is unfinished (asked of the pinned copy's vapo-lab in
# $ROOT/venv, which ran them), reads a consistent copy of the store (the grids' own is left as it is),
# and writes each setting's sub-report first, then the main report, scored with predictions.yaml.
set -euo pipefail
ROOT=${ROOT:?set ROOT to the folder run.sh ran in}
HERE=$(cd "$(dirname "$0")" && pwd)
GRIDS=(table1-plateau clip-higher-setting group-sampling-setting lr-half lr-double)

for grid in "${GRIDS[@]}"; do
  plan=$(cd "$ROOT" && "$ROOT/venv/bin/vapo-lab" sweep "$ROOT/src/experiments/$grid.yaml" --dry-run \
         launcher.local.workers=2 "output_dir=$ROOT/runs" "tracking.uri=sqlite:///$ROOT/mlflow.db" 2>&1)
  if [[ "$(tail -n 1 <<<"$plan")" != "0 to run on local" ]] || grep -q "running: skip" <<<"$plan"; then
    echo "error: grid $grid is not complete ($(tail -n 1 <<<"$plan")): resubmit run.sh and make the reports when it ends" >&2
    exit 1
  fi
done

copy=$(mktemp -d)/mlflow.db
python - "$ROOT/mlflow.db" "$copy" <<'EOF'
import sqlite3, sys
source = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
with sqlite3.connect(sys.argv[2]) as target:
    source.backup(target)
EOF
uri="sqlite:///$copy"

for grid in "${GRIDS[@]:1}"; do  # the settings and the learning-rate check: described, not scored
  vapo-lab report --experiment "$grid" --tracking-uri "$uri" --score plateau --out "$HERE/$grid" \
    --save-runs "$HERE/$grid/runs.json.gz"
  printf 'score: plateau\n' > "$HERE/$grid/remake.yaml"
done
vapo-lab report --experiment table1-plateau --tracking-uri "$uri" --score plateau --out "$HERE" \
  --predictions "$HERE/predictions.yaml" --save-runs "$HERE/runs.json.gz"
printf 'score: plateau\nalso: [clip-higher-setting/runs.json.gz, group-sampling-setting/runs.json.gz]\n' \
  > "$HERE/remake.yaml"
python "$HERE/core_hours.py" "$ROOT"/runs/grids/*/
