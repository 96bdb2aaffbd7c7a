#!/usr/bin/env bash
# KD students of several depths on one mixture, side by side on one GPU (issues 16 and 19: is a deeper
# student worth its laptop cost, and does it read notes it never saw?). One bench/worlds_loo.sh lane per
# depth, all on the every-world mixture `all`: the first depth's lane trains the shared teacher, the
# others start once it is trained (they skip its stage and its evaluations). Each student is scored on
# the mixture's dev split first (MIX_DEV=1: the depth is chosen there), then on unseen notes (notes-s1)
# and the test splits of EVAL_WORLDS. Rows go to RESULTS through bench/worlds_results.py, run once
# after every lane has finished; laptop cost per
# depth is bench/student_depth.py's (docs/benchmarks.md).
#
#   bench/worlds_depths.sh 15 30            # depths (of SmolLM2's 30 layers); default: 15 24 30
#
# WEIGHTS (default: the shipped student's mixture), EVAL_WORLDS (default "factbook notes"), RESULTS
# (default out/results/worlds.json), COMMIT, and what bench/worlds_loo.sh reads.
set -euo pipefail
cd "$(dirname "$0")/.."
depths=("$@")
[ ${#depths[@]} -gt 0 ] || depths=(15 24 30)
source bench/worlds_weights.sh
export WEIGHTS=${WEIGHTS:-$SHIPPED_WEIGHTS}
export DGPO_MINUTES=0 MIX_DEV=1 EVAL_WORLDS=${EVAL_WORLDS:-factbook notes} COLLECT=0
results=${RESULTS:-out/results/worlds.json}
py=${PYTHON:-python3}
out=${WORK_DIR:-out}
mkdir -p "$out/logs" "$(dirname "$results")"
teacher=$out/runs/worlds-teacher-sft-all${MIX_TAG:+-$MIX_TAG}   # worlds_loo.sh names it so
STUDENT_LAYERS=${depths[0]} bash bench/worlds_loo.sh none > "$out/logs/worlds-depth-${depths[0]}.log" 2>&1 &
first=$!
for d in "${depths[@]:1}"; do
  until [ -f "$teacher/summary.json" ]; do   # the first lane's teacher, shared by every depth
    if ! kill -0 "$first" 2> /dev/null; then
      wait "$first" || true
      echo "error: the first lane stopped before its teacher was trained; see $out/logs/worlds-depth-${depths[0]}.log" >&2
      exit 1
    fi
    sleep 10
  done
  EVAL_TEACHER=0 STUDENT_LAYERS=$d bash bench/worlds_loo.sh none > "$out/logs/worlds-depth-$d.log" 2>&1 &
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
[ $failed = 0 ] || { echo "error: a lane failed; see $out/logs/worlds-depth-*.log and worlds-lane-none*.log" >&2; exit 1; }
# once, after every lane: each lane's rows are appended to the same worlds-eval files
"$py" bench/worlds_results.py --eval-dir "$out/worlds-eval" --mix-dir "$out/worlds-mix" \
  --worlds-dir "${WORLDS_DIR:-$out/worlds}" --out "$results"
echo "done: $results"
