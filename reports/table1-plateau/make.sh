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

source "$HERE/../make-lib.sh"
require_complete "${GRIDS[@]}"
uri=$(store_copy)

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
