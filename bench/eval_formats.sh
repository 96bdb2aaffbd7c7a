#!/usr/bin/env bash
# FactbookQA dev EM through the agent for each export format of SmolLM2-135M, evaluated in parallel
# shards (one thread each), so a many-core machine does in minutes what takes hours on two cores.
#
#   bench/eval_formats.sh [N] [JOBS] [FORMATS]
#
# N: the first N dev questions of the default bundle (default 60); JOBS: evaluations running at once
# (default: the number of cores); FORMATS: any of default f16 q8_0 q4_0 q4_k_m onnx-int4 (default all;
# `default` is the bundle's own Q4_1 GGUF). Missing formats are built first from the bundle's GGUF
# (`model from-gguf --as qwen2`, then `export gguf` / `export onnx`). Each format's questions run
# as shards of SHARD questions (default 10) with `dgpo-edge eval --bundle DEFAULT --model FORMAT
# --threads 1`, every shard resumable; resume with the same SHARD, which decides the shard of each
# question. Smaller shards keep all cores busy to the end when a format's questions are slow.
# Once a format's shards are complete they are merged and its report written to
# out/eval-formats/FORMAT/report.md (rerunning `eval` over the N questions skips them all).
# PYTHON: the interpreter with dgpo-edge[edge,onnx,export,train] (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-60}; JOBS=${2:-$(nproc)}; FORMATS=${3:-"default f16 q8_0 q4_0 q4_k_m onnx-int4"}
SHARD=${SHARD:-10}
py=${PYTHON:-python3}
W=out/eval-formats
read -r bundle gguf < <("$py" -c 'from dgpo_edge.bundle.default import ensure_default_bundle as e
b = e(); print(b.path, b.model_path)')
mkdir -p $W/fmt $W/shards

model_path() {  # where a format's export lives (nothing for the bundle's own model)
  case $1 in default) ;; onnx-int4) echo "$W/fmt/smollm2-onnx-int4" ;; *) echo "$W/fmt/smollm2-$1.gguf" ;; esac
}
model_args() {  # the --model argument of a format
  [ "$1" = default ] || echo "--model $(model_path "$1")"
}

# Build what is missing (each export writes its output only when complete).
if [ "$FORMATS" != default ] && [ ! -d $W/fmt/ckpt ]; then
  "$py" -m dgpo_edge model from-gguf "$gguf" --as qwen2 --out $W/fmt/ckpt
fi
for f in $FORMATS; do
  m=$(model_path "$f")
  if [ -z "$m" ] || [ -e "$m" ]; then continue; fi
  case $f in
    onnx-int4) "$py" -m dgpo_edge export onnx $W/fmt/ckpt --out "$m" --precision int4 ;;
    *) "$py" -m dgpo_edge export gguf $W/fmt/ckpt --out "$m" --quant "$f" ;;
  esac
done

# Shards of SHARD questions, each named dev.jsonl in a folder of its own: predictions are keyed by
# the file's stem and the question id, so the shards' predictions merge into one dev run.
total=$(wc -l < "$bundle/data/dev.jsonl"); (( N <= total )) || N=$total
mkdir -p $W/first && head -n "$N" "$bundle/data/dev.jsonl" > $W/first/dev.jsonl
shards=$(( (N + SHARD - 1) / SHARD ))
for ((k = 0; k < shards; k++)); do
  mkdir -p $W/shards/$k && sed -n "$((k * SHARD + 1)),$((k * SHARD + SHARD))p" $W/first/dev.jsonl > $W/shards/$k/dev.jsonl
done
for f in $FORMATS; do
  for ((k = 0; k < shards; k++)); do
    # A finished shard is skipped here: starting `eval` only to skip its questions costs seconds each.
    done_k=0; p=$W/runs/$f/$k/predictions.jsonl; [ ! -f $p ] || done_k=$(wc -l < $p)
    (( done_k < $(wc -l < $W/shards/$k/dev.jsonl) )) || continue
    echo "$f $k $(model_args "$f") --data $W/shards/$k/dev.jsonl --out $W/runs/$f/$k"
  done
done > $W/jobs.txt
mkdir -p $W/logs
echo "$(wc -l < $W/jobs.txt) unfinished shards of $SHARD questions, $JOBS at a time"
run_shard() {  # run_shard FORMAT K EVAL-ARGS...
  local f=$1 k=$2; shift 2
  "$py" -m dgpo_edge eval --bundle "$bundle" --threads 1 "$@" > /dev/null 2> $W/logs/$f-$k.log \
    || echo "shard $k of $f failed: see $W/logs/$f-$k.log"
}
while read -r f k rest; do
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || true; done
  # shellcheck disable=SC2086
  run_shard "$f" "$k" $rest &
done < $W/jobs.txt
wait

for f in $FORMATS; do
  done_n=$(cat $W/runs/$f/*/predictions.jsonl 2>/dev/null | wc -l || true)
  if [ "$done_n" -ne "$N" ]; then echo "$f: $done_n of $N questions (rerun to continue)"; continue; fi
  rm -rf $W/$f && mkdir -p $W/$f
  for ((k = 0; k < shards; k++)); do cat $W/runs/$f/$k/predictions.jsonl; done > $W/$f/predictions.jsonl
  cp $W/runs/$f/0/run.json $W/$f/
  # shellcheck disable=SC2046
  "$py" -m dgpo_edge eval --bundle "$bundle" $(model_args "$f") --data $W/first/dev.jsonl --out $W/$f \
    > /dev/null 2> $W/logs/$f-report.log
  echo "$f: $(grep -m1 '^| dev |' $W/$f/report.md)"
done
