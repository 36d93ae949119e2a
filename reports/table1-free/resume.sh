#!/usr/bin/env bash
# Continues issue 47's grids on this machine, whatever it kept of them: the pinned copy and its venv
# (made if missing), the carried runs put back (carry.py restore), run.sh in the background, and a
# loop that carries every run finished since, every 10 minutes, into this checkout's carried/ (commit
# it). Idempotent: with run.sh already running it only says so.
#   bash reports/table1-free/resume.sh          (ROOT, default /work/grids/free: runs, store, caches)
set -euo pipefail
ROOT=${ROOT:-/work/grids/free}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PIN=${PIN:-4d98a38}  # the commit of predictions.md: the code every cell runs

if pgrep -f "$ROOT/src/reports/table1-free/run.sh" > /dev/null; then
  echo "run.sh is already running in $ROOT (log: $ROOT/run.log)"
  exit 0
fi
mkdir -p "$ROOT/src"
[ -f "$ROOT/src/pyproject.toml" ] || git -C "$REPO" archive "$PIN" | tar -x -C "$ROOT/src"
if [ ! -x "$ROOT/venv/bin/vapo-lab" ]; then
  python3 -m venv "$ROOT/venv"
  "$ROOT/venv/bin/pip" install -q -r "$HERE/requirements.lock"
  "$ROOT/venv/bin/pip" install -q --no-deps "$ROOT/src"
fi
# table1-plateau's carry.py with this checkout's vapo_lab, into this folder's carried/
export VAPO_CARRIED="$HERE/carried"
carry() { PYTHONPATH="$REPO" "$ROOT/venv/bin/python" "$REPO/reports/table1-plateau/carry.py" "$@"; }
carry restore "$ROOT"
cd "$ROOT"
PATH="$ROOT/venv/bin:$PATH" ROOT="$ROOT" nohup bash "$ROOT/src/reports/table1-free/run.sh" >> "$ROOT/run.log" 2>&1 &
echo "run.sh started in $ROOT (pid $!; log: $ROOT/run.log)"
if ! pgrep -f "while sleep 600; do carry save" > /dev/null; then
  export -f carry; export REPO ROOT HERE VAPO_CARRIED
  nohup bash -c 'while sleep 600; do carry save "$ROOT"; done' >> "$ROOT/carry.log" 2>&1 &
  echo "carrying finished runs into $HERE/carried every 10 minutes (log: $ROOT/carry.log); commit them"
fi
