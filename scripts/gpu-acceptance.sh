#!/usr/bin/env bash
# vapo-lab's acceptance run on one GPU, from a bare checkout, in at most 8 minutes, in this order:
#   install  the carried wheels (scripts/wheels, offline) and vapo-lab itself (editable)
#   a.       the GPU tests: pytest -m gpu (the vLLM ones skip where vLLM is absent, with their reason)
#   f.       vapo-lab bench generate: the built-in sampler against HF generate on a random
#            Qwen2.5-0.5B-shaped model built once on the GPU, 32 and 128 rows x 128 and 512 new
#            tokens, as many settings as its time allows; HF eager first (a ratio before any
#            compile), then static cache + torch.compile where it works. It runs before b: last,
#            it had only what b-e left it, too little for a compile (c's summary has the run's
#            per-stage table)
#   b.       the embedded default, full length, on the GPU: held-out gain beside the CPU's, s/step
#   c.       trainer.strategy=fsdp with N = 1 (NCCL) on a random Qwen2.5-0.5B-shaped model, task=math,
#            3 steps: peak GPU memory beside `vapo-lab plan`'s figure, tokens/s
#   d.       vapo-lab eval aime24 --samples 32 on b's checkpoint
#   e.       the chunked log-prob pass (one layer) at T = 20,480 with V = 152,064: peak GPU memory
#            beside the plan's figure for it
# Each step has its own time limit inside the whole's; a failing step is recorded with its last log
# lines and the next one runs. The table is printed and written as Markdown to
# $OUT/gpu-acceptance.md (with the whole log and the rows as JSON lines beside it), or, where OUT is
# unset, to docs/gpu-runs/<date>-<device>.md (a --cpu run: to its scratch folder).
#
#   bash scripts/gpu-acceptance.sh          # on a GPU machine; exits 1 with one line where none is
#   bash scripts/gpu-acceptance.sh --cpu    # the same steps on CPU, shortened: at most 10 min, 2 cores
#
# On this workplace's device tool: run(command="VAPO_COMMIT=<sha> bash scripts/gpu-acceptance.sh",
# carry=["scripts/wheels"]) after `bash scripts/gpu-wheels.sh` here (docs/gpu-runs/README.md).
# Environment: OUT, PYTHON (default python3), VAPO_COMMIT (the commit to name where the tree
# travels without .git), ACCEPTANCE_WORK (scratch folder; default a new one under /tmp).
# Exit status: 0 every step ok; 1 no CUDA GPU (without --cpu); 2 bad arguments; 3 a step failed.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
HELPER="$REPO/scripts/acceptance.py"
WHEELS="$REPO/scripts/wheels"
MATH_DATA="$REPO/vapo_lab/data/math500.jsonl"
INVOCATION="bash scripts/gpu-acceptance.sh $*"
MODE=gpu
export PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

usage() {
  echo "usage: bash scripts/gpu-acceptance.sh [--cpu]   (on a CUDA machine; --cpu: the shortened CPU run)" >&2
  exit 2
}

parse_args() {
  case "${1:-}" in
    "") ;;
    --cpu) MODE=cpu ;;
    *) usage ;;
  esac
  [[ $# -le 1 ]] || usage
}

# Without --cpu, nothing runs on a machine where torch sees no CUDA GPU: one line, exit 1.
require_cuda() {
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "gpu-acceptance: no CUDA GPU visible to $PYTHON's torch: run it on a GPU machine, or pass --cpu" >&2
    exit 1
  fi
}

# Each mode's sizes and limits. GPU: the budget is 470 s, leaving the report its seconds inside 8
# minutes; each step gets at most its limit and what is left (install, a and b-e took 27 + 304 s
# on the H200 run of 2026-11-28: with f's 130 they fit). CPU (2 cores): fewer steps, samples and
# tokens, a small model, 600 s in all.
configure() {
  if [[ $MODE == gpu ]]; then
    DEVICE=cuda BUDGET=470
    LIMIT_INSTALL=40 LIMIT_A=40 LIMIT_B=180 LIMIT_C=150 LIMIT_D=45 LIMIT_E=15 LIMIT_F=130
    F_ARGS=(--device cuda --arch Qwen2.5-0.5B --grid --repeats 1)
    B_EXTRA=()  # the embedded default as shipped: 80 steps, evals at 0, 20, 40, 60, 80
    C_SIZE=full C_DESC="nccl, Qwen2.5-0.5B shape"
    C_EXTRA=(rollout.responses_per_step=32 rollout.group_size=8 rollout.max_new_tokens=128
             trainer.mini_batch_size=16 trainer.max_tokens_per_micro_batch=4096)
    D_ARGS=(--samples 32)
    E_TOKENS=20480
  else
    DEVICE=cpu BUDGET=600
    LIMIT_INSTALL=55 LIMIT_A=45 LIMIT_B=220 LIMIT_C=180 LIMIT_D=60 LIMIT_E=40 LIMIT_F=60
    F_ARGS=(--prompts 2 --samples 4 --max-new-tokens 32 --repeats 1)
    B_EXTRA=(trainer.total_steps=10 trainer.eval_every=10)
    C_SIZE=small C_DESC="gloo, a 2-layer Qwen2"
    C_EXTRA=(rollout.responses_per_step=8 rollout.group_size=4 rollout.max_new_tokens=32
             trainer.mini_batch_size=8 trainer.max_tokens_per_micro_batch=1024)
    D_ARGS=(--samples 2 --max-tokens 32)
    E_TOKENS=512
  fi
  # both: 3 steps, one held-out eval at the start and one at the end, critic built in 1 + 1 steps
  C_EXTRA+=(trainer.total_steps=3 trainer.eval_every=3 task.n_eval=16 rollout.eval_samples=1
            critic.rm_steps=1 critic.rm_batch=16 critic.pretrain.steps=1)
}

# A scratch folder for the runs, caches and logs, outside the checkout.
setup_work() {
  WORK="${ACCEPTANCE_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/vapo-acceptance.XXXXXX")}"
  mkdir -p "$WORK"
  RESULTS="$WORK/results.jsonl" FULL_LOG="$WORK/gpu-acceptance.log"
  : >"$RESULTS"
  : >"$FULL_LOG"
  START=$SECONDS
  DEADLINE=$((SECONDS + BUDGET))
  "$PYTHON" "$HELPER" env >"$WORK/env.json"
}

now() { date +%s.%N; }

# Runs "$@" within the current step's time left: 124 (or 137 once killed) when it runs out.
bounded() {
  local left=$((STEP_END - SECONDS))
  ((left > 0)) || return 124
  timeout --kill-after=15 "$left" "$@"
}

# The CLI as this Python runs it (the console script may be another environment's), and the helper.
# Arrays, not functions: `timeout` runs programs.
VAPO=("$PYTHON" -m vapo_lab.cli)
HELP=("$PYTHON" "$HELPER")
helper() { "${HELP[@]}" "$@"; }

# The newest run folder under DIR/runs, or nothing.
latest_run() {
  local dir
  dir=$(ls -1dt "$1"/runs/*/ 2>/dev/null | head -n 1)
  echo "${dir%/}"
}

# run_step ID TITLE LIMIT FUNCTION: runs FUNCTION with its output in the step's log, within LIMIT
# seconds and what is left of the whole budget, and records its row. FUNCTION sets STEP_CMD (what
# the report shows) and may write its summary to $SUMMARY (line 1: the result).
run_step() {
  local id=$1 title=$2 limit=$3 fn=$4 rc=0 t0 seconds status log
  local left=$((DEADLINE - SECONDS))
  ((limit <= left)) || limit=$left
  log="$WORK/$id.log" SUMMARY="$WORK/$id.summary" STEP_CMD="" STEP_RESULT=""
  : >"$SUMMARY"
  echo "== $id. $title (at most ${limit} s)"
  if ((limit < 5)); then
    helper record "$RESULTS" --id "$id" --title "$title" --status skipped --result "no time left in the budget"
    return
  fi
  STEP_END=$((SECONDS + limit))
  t0=$(now)
  "$fn" >"$log" 2>&1 || rc=$?
  seconds=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out (${limit} s)" ;;
    *) status="failed (exit $rc)" ;;
  esac
  [[ -s $SUMMARY || -n $STEP_RESULT ]] || STEP_RESULT="no result"
  helper record "$RESULTS" --id "$id" --title "$title" --status "$status" --seconds "$seconds" \
    --command "$STEP_CMD" --result "$STEP_RESULT" --summary "$SUMMARY" --log "$log"
  echo "   $status, $seconds s: $(tail -n 1 "$RESULTS" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin)["result"])')"
  { echo "===== $id. $title: $status, $seconds s"; cat "$log"; } >>"$FULL_LOG"
}

# ---------------------------------------------------------------------------------------- steps
# install: the pinned wheels the machine lacks (offline, no dependency resolution: the pins are
# the whole set), then vapo-lab itself unless this checkout's is already importable.
step_install() {
  local missing=() files=() req name version wheel where
  mapfile -t missing < <(helper missing "$REPO/scripts/gpu-requirements.txt")
  for req in "${missing[@]}"; do
    name=${req%%==*} version=${req##*==}
    wheel=$(find "$WHEELS" -maxdepth 1 -iname "$(echo "$name" | tr -- '-.' '__')-$version-*.whl" 2>/dev/null | head -n 1)
    if [[ -z $wheel ]]; then
      STEP_RESULT="no wheel for $req in scripts/wheels: run scripts/gpu-wheels.sh where PyPI is reachable, carry scripts/wheels"
      echo "$STEP_RESULT"
      return 1
    fi
    files+=("$wheel")
  done
  STEP_CMD="pip install --no-index --no-deps scripts/wheels/<missing>.whl; pip install --no-index --no-deps --no-build-isolation -e ."
  if ((${#files[@]})); then
    "$PYTHON" -m pip install --no-index --no-deps --no-compile --no-cache-dir "${files[@]}" || return
  fi
  where=$("$PYTHON" -c 'import vapo_lab.conf, vapo_lab; print(vapo_lab.__file__)' 2>/dev/null || true)
  if [[ $where == "$REPO"/* ]]; then
    where="already importable from this checkout"
  else
    where=$(install_editable) || return
  fi
  STEP_RESULT="wheels installed: ${missing[*]:-none needed}; vapo-lab $where"
}

# vapo-lab from this checkout, editable: built with the machine's setuptools where it can (nothing
# to fetch), else in pip's isolated build environment from the carried build wheels.
install_editable() {
  local pip=("$PYTHON" -m pip install --no-index --no-deps --no-cache-dir)
  if "${pip[@]}" --no-build-isolation -e "$REPO" >&2; then
    echo "installed editable (the machine's setuptools)"
  else
    echo "the machine's setuptools could not build it: again with scripts/gpu-build-requirements.txt's wheels" >&2
    "${pip[@]}" --find-links "$WHEELS" -e "$REPO" >&2 || return
    echo "installed editable (the carried setuptools and wheel)"
  fi
}

# a: every test file that carries the gpu marker. Not the whole tree: other modules import MLflow
# at the top, which does not travel (scripts/gpu-requirements.txt).
step_gpu_tests() {
  local files=() rc=0
  mapfile -t files < <(cd "$REPO" && grep -rlE 'pytest\.mark\.gpu' tests --include='*.py' | sort)
  if ((${#files[@]} == 0)); then
    STEP_RESULT="no test file carries the gpu marker"
    return 0
  fi
  STEP_CMD="python -m pytest -m gpu -rs -q ${files[*]}"
  (cd "$REPO" && bounded "$PYTHON" -m pytest -m gpu -rs -q -p no:cacheprovider "${files[@]}") >"$WORK/a.pytest" 2>&1 || rc=$?
  cat "$WORK/a.pytest"
  helper pytest-summary "$WORK/a.pytest" >"$SUMMARY"
  ((rc == 5)) && rc=0  # nothing selected is a result, not a failure
  return $rc
}

# b: the embedded default (tiny model, arith, VAPO) on the device, as `vapo-lab train` runs it.
step_default() {
  local dir="$WORK/b" rc=0 args
  mkdir -p "$dir"
  args=(train --quiet "trainer.device=$DEVICE" tracking=none "${B_EXTRA[@]}")
  STEP_CMD="vapo-lab ${args[*]}"
  (cd "$dir" && bounded "${VAPO[@]}" "${args[@]}") || rc=$?
  RUN_B=$(latest_run "$dir")
  if [[ -n $RUN_B ]]; then
    helper train-summary "$RUN_B" >"$SUMMARY" || true
  fi
  return $rc
}

# c: FSDP over one rank (NCCL on CUDA, gloo on CPU) on a random Qwen2.5-0.5B-shaped model saved
# with the embedded tokenizer (no download), on task=math with the shipped MATH-500; the plan is
# told the longest prompt the run will see.
step_fsdp() {
  local dir="$WORK/c" rc=0 prompt gpu_gb args
  local model="$dir/model"
  mkdir -p "$dir"
  args=(model=hf "model.path=$model" task=math "task.train_path=$MATH_DATA" trainer.strategy=fsdp
        trainer.nproc_per_node=1 "trainer.device=$DEVICE" tracking=none "${C_EXTRA[@]}")
  gpu_gb=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["gpu_memory_gb"] or 80)' "$WORK/env.json")
  STEP_CMD="python scripts/acceptance.py make-model MODEL --size $C_SIZE
vapo-lab plan --gpu-memory-gb ${gpu_gb%.*} --prompt-tokens P ${args[*]}
vapo-lab train --quiet ${args[*]}"
  STEP_CMD=${STEP_CMD//"$dir"/WORK}
  STEP_CMD=${STEP_CMD//"$REPO"\//}
  bounded "${HELP[@]}" make-model "$model" --size "$C_SIZE" || return
  prompt=$(bounded "${HELP[@]}" prompt-tokens "$model" "$MATH_DATA") || return
  echo "longest prompt: $prompt tokens"
  (cd "$dir" && bounded "${VAPO[@]}" plan --gpu-memory-gb "$gpu_gb" --prompt-tokens "$prompt" "${args[@]}") >"$dir/plan.txt" || rc=$?
  cat "$dir/plan.txt"
  ((rc == 0)) || return $rc
  (cd "$dir" && bounded "${HELP[@]}" peak "$dir/peak.json" -- train --quiet "${args[@]}") || rc=$?
  helper fsdp-summary "$(latest_run "$dir")" "$dir/peak.json" "$dir/plan.txt" >"$SUMMARY" || true
  return $rc
}

# d: the benchmark evaluation of b's run (its latest checkpoint), as a user would run it.
step_eval() {
  local rc=0 args
  if [[ -z ${RUN_B:-} ]]; then
    STEP_RESULT="no run from step b to evaluate"
    echo "$STEP_RESULT"
    return 1
  fi
  args=(eval aime24 "${D_ARGS[@]}" --model "$RUN_B" --device "$DEVICE" --no-track --quiet --out "$WORK/d")
  STEP_CMD="vapo-lab ${args[*]}"
  STEP_CMD=${STEP_CMD//"$WORK"/WORK}
  bounded "${VAPO[@]}" "${args[@]}" || rc=$?
  if [[ -f "$WORK/d/summary.json" ]]; then
    helper eval-summary "$WORK/d/summary.json" >"$SUMMARY" || true
  fi
  return $rc
}

# e: the chunked log-prob pass's peak memory at E_TOKENS response tokens with Qwen's vocabulary
# (one layer: hidden states into the LM head) beside the plan's figure for it.
step_logprob() {
  local args=(logprob-peak --tokens "$E_TOKENS" --device "$DEVICE")
  STEP_CMD="python scripts/acceptance.py ${args[*]}"
  bounded "${HELP[@]}" "${args[@]}" >"$SUMMARY" || return
  cat "$SUMMARY"
}

# f (run right after a): the side-by-side generation benchmark; each setting's eager result is kept
# before its compile starts and its compiled one as it ends, so a step cut short by its limit still
# reports a ratio for every setting it reached.
step_generate() {
  local rc=0 args=(bench generate "${F_ARGS[@]}" --json "$WORK/f.jsonl")
  STEP_CMD="vapo-lab ${args[*]}"
  STEP_CMD=${STEP_CMD//"$WORK"/WORK}
  bounded "${VAPO[@]}" "${args[@]}" || rc=$?
  helper generate-summary "$WORK/f.jsonl" >"$SUMMARY" || true
  return $rc
}

# ---------------------------------------------------------------------------------------- report
commit() {
  local sha
  if [[ -n ${VAPO_COMMIT:-} ]]; then
    echo "$VAPO_COMMIT"
  elif sha=$(git -C "$REPO" rev-parse --short=12 HEAD 2>/dev/null); then
    # a run of uncommitted code says so: its numbers belong to no commit exactly
    if [[ -n $(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
      sha="$sha (with uncommitted changes)"
    fi
    echo "$sha"
  else
    echo "unknown (no .git here: set VAPO_COMMIT)"
  fi
}

report() {
  local date slug md
  date=$(date -u +%Y-%m-%d)
  slug=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["slug"])' "$WORK/env.json")
  if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT"
    md="$OUT/gpu-acceptance.md"
  elif [[ $MODE == gpu ]]; then
    md="$REPO/docs/gpu-runs/$date-$slug.md"
  else
    md="$WORK/gpu-acceptance.md"  # a CPU run is no GPU run: it stays out of docs/gpu-runs
  fi
  echo
  helper report "$RESULTS" --env "$WORK/env.json" --mode "$MODE" --date "$(date -u '+%Y-%m-%d %H:%M UTC')" \
    --commit "$(commit)" --invocation "$INVOCATION" --total "$((SECONDS - START))" --out "$md"
  if [[ -n ${OUT:-} ]]; then
    cp "$FULL_LOG" "$OUT/gpu-acceptance.log"
    cp "$RESULTS" "$OUT/gpu-acceptance.jsonl"
  fi
  echo
  echo "report: $md; scratch folder (runs, logs): $WORK"
}

main() {
  parse_args "$@"
  [[ $MODE == cpu ]] || require_cuda
  configure
  setup_work
  RUN_B=""
  run_step install "install (offline wheels, editable vapo-lab)" "$LIMIT_INSTALL" step_install
  run_step a "pytest -m gpu" "$LIMIT_A" step_gpu_tests
  run_step f "bench generate: built-in sampler against HF generate" "$LIMIT_F" step_generate
  run_step b "embedded default on $DEVICE" "$LIMIT_B" step_default
  run_step c "fsdp N=1 ($C_DESC), task=math, 3 steps" "$LIMIT_C" step_fsdp
  run_step d "eval aime24 on b's checkpoint" "$LIMIT_D" step_eval
  run_step e "log-prob pass peak, T = $E_TOKENS, V = 152,064" "$LIMIT_E" step_logprob
  report
  if grep -qv '"status": "ok"' "$RESULTS"; then
    exit 3
  fi
}

main "$@"
