#!/usr/bin/env bash
# Downloads into scripts/wheels/ the pinned wheels that the GPU machines lack
# (scripts/gpu-requirements.txt) and the build tools of vapo-lab's editable install
# (scripts/gpu-build-requirements.txt). Run it here, where PyPI is reachable: the GPU machines reach no network.
#
# scripts/wheels/ is git-ignored (binaries stay out of the history), so it travels to the GPU
# machine only when the device tool's run names it: carry=["scripts/wheels"].
#
#   bash scripts/gpu-wheels.sh                     # wheels for the GPU image's Python (3.12)
#   PYTHON_VERSION=3.11 bash scripts/gpu-wheels.sh # for another Python
#
# Environment: PYTHON (the pip to use, default python3), PYTHON_VERSION (the target's, default
# 3.12: the image's python3 is 3.12.3), WHEELS_DIR (default scripts/wheels).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
DEST="${WHEELS_DIR:-$REPO/scripts/wheels}"
# what vapo-lab needs there, then what builds its editable install where the machine's tools cannot
REQUIREMENTS=("$REPO/scripts/gpu-requirements.txt" "$REPO/scripts/gpu-build-requirements.txt")
# The device tool's limit on what travels (tree + carried paths), MiB; the brief keeps 4 in hand.
TRAVEL_LIMIT_MIB=60

# The pins, one NAME==VERSION a line, comments and blanks dropped.
pins() {
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "${REQUIREMENTS[@]}" | grep -v '^$'
}

# A binary wheel for the target's Python and platform, or a pure-Python one; pip matches each
# manylinux tag exactly, so the usual ones are all named.
download() {
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version "$PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$DEST" "$1"
}

# For a project published as an sdist only: build its wheel here, and keep it only if it is
# pure Python (a compiled one built for this machine's Python could not run there).
build() {
  local req=$1 built
  "$PYTHON" -m pip wheel -qq --no-deps -w "$DEST" "$req"
  built=$(find "$DEST" -maxdepth 1 -iname "$(wheel_glob "$req")" | head -n 1)
  if [[ -z "$built" || "$built" != *-py3-none-any.whl && "$built" != *-py2.py3-none-any.whl ]]; then
    echo "gpu-wheels: $req has no wheel for Python $PYTHON_VERSION and did not build as pure Python" >&2
    return 1
  fi
}

# NAME==VERSION -> the glob of its wheel file (wheel names normalise - and . to _).
wheel_glob() {
  local name=${1%%==*} version=${1##*==}
  name=$(echo "$name" | tr '[:upper:]' '[:lower:]' | tr -- '-.' '__')
  echo "${name}-${version}-*.whl"
}

# Exactly one wheel a pin: two versions of one project stop the whole offline install.
check_one_each() {
  local req n
  for req in $(pins); do
    n=$(find "$DEST" -maxdepth 1 -iname "$(wheel_glob "$req")" | wc -l)
    if [[ "$n" -ne 1 ]]; then
      echo "gpu-wheels: $n wheels for $req in $DEST (want 1)" >&2
      return 1
    fi
  done
}

# bytes -> MiB with two decimals
mib() {
  awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'
}

# The wheels, their sizes and total, and what would travel with the working tree.
report() {
  local total tree
  echo "wheels in ${DEST#"$REPO"/} (Python $PYTHON_VERSION, manylinux x86_64):"
  (cd "$DEST" && ls -l -- *.whl | awk '{printf "  %-60s %9.1f KiB\n", $9, $5 / 1024}')
  total=$(cat "$DEST"/*.whl | wc -c)
  printf 'total: %d wheels, %s MiB\n' "$(ls "$DEST"/*.whl | wc -l)" "$(mib "$total")"
  if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
    # tracked + untracked-not-ignored files: what the device tool sends besides carried paths
    tree=$(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r cat 2>/dev/null | wc -c)
    echo "with the working tree: $(mib $((tree + total))) MiB (limit $TRAVEL_LIMIT_MIB MiB)"
  fi
}

main() {
  local start=$SECONDS req
  mkdir -p "$DEST"
  rm -f "$DEST"/*.whl  # a stale version beside the new one would stop the install there
  for req in $(pins); do
    download "$req" 2>/dev/null || build "$req"
  done
  check_one_each
  report
  echo "took $((SECONDS - start)) s; on the GPU machine: bash scripts/gpu-acceptance.sh (carry scripts/wheels)"
}

main "$@"
