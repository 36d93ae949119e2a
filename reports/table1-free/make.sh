#!/usr/bin/env bash
# Makes issue 47's reports in this folder from the grids' MLflow store, once every grid is complete:
#   ROOT=/work/grids/free bash reports/table1-free/make.sh
# It refuses while any cell of run.sh's grids is unfinished (asked of the pinned copy's vapo-lab in
# $ROOT/venv, which ran them), reads a consistent copy of the store (the grids' own is left as it
# is), writes the learning-rate grids' reports into lr-low/ and lr-high/ (described; the plan's
# families F5 and F6 score them), then the main report scored with predictions.yaml, and prints
# the core-hours the runs took (from the runs files). Every figure's band is the 95% bootstrap
# interval of the mean over the seeds (--band ci).
set -euo pipefail
ROOT=${ROOT:?set ROOT to the folder run.sh ran in}
HERE=$(cd "$(dirname "$0")" && pwd)
declare -A FOLDER=([table1-free-lr-low]=lr-low [table1-free-lr-high]=lr-high)

source "$HERE/../make-lib.sh"
require_complete table1-free table1-free-lr-low table1-free-lr-high
uri=$(store_copy)

for grid in "${!FOLDER[@]}"; do
  out="$HERE/${FOLDER[$grid]}"
  vapo-lab report --experiment "$grid" --tracking-uri "$uri" --score plateau --band ci \
    --out "$out" --save-runs "$out/runs.json.gz"
  printf 'score: plateau\nband: ci\n' > "$out/remake.yaml"
done
vapo-lab report --experiment table1-free --tracking-uri "$uri" --score plateau --band ci \
  --out "$HERE" --predictions "$HERE/predictions.yaml" --save-runs "$HERE/runs.json.gz"
printf 'score: plateau\nband: ci\nalso: [lr-low/runs.json.gz, lr-high/runs.json.gz]\n' \
  > "$HERE/remake.yaml"
# from the exports: the cells ran on several machines, so no one run folder holds them all
python "$HERE/../table1-plateau/core_hours.py" "$HERE/runs.json.gz" "$HERE"/lr-*/runs.json.gz
