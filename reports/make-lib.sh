# Sourced by a report folder's make.sh: the two steps every grid report takes before
# `vapo-lab report`. Needs ROOT (the folder run.sh ran in: its pinned copy in src/, venv/, runs/ and
# mlflow.db).

# Exits 1, naming the grid, unless every cell of each grid named has finished (asked of the pinned
# copy's vapo-lab, which ran them).
require_complete() {
  local grid plan
  for grid in "$@"; do
    plan=$(cd "$ROOT" && "$ROOT/venv/bin/vapo-lab" sweep "$ROOT/src/experiments/$grid.yaml" --dry-run \
           launcher.local.workers=2 "output_dir=$ROOT/runs" "tracking.uri=sqlite:///$ROOT/mlflow.db" 2>&1)
    if [[ "$(tail -n 1 <<<"$plan")" != "0 to run on local" ]] || grep -q "running: skip" <<<"$plan"; then
      echo "error: grid $grid is not complete ($(tail -n 1 <<<"$plan")): resubmit run.sh (resume.sh) and make the reports when it ends" >&2
      exit 1
    fi
  done
}

# Prints the URI of a consistent copy of the grids' store (theirs is left as it is).
store_copy() {
  local copy
  copy=$(mktemp -d)/mlflow.db
  python - "$ROOT/mlflow.db" "$copy" <<'PY'
import sqlite3, sys
source = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
with sqlite3.connect(sys.argv[2]) as target:
    source.backup(target)
PY
  echo "sqlite:///$copy"
}
