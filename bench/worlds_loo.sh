#!/usr/bin/env bash
# Leave one world out (issue 19), on one GPU: for each held-out world, mix the other worlds by weight
# (`dgpo-edge data mix`), train the teacher (train/configs/worlds-teacher-sft.yaml), the KD student
# (train/configs/worlds-kd.yaml) and, unless DGPO=0, DGPO from that KD student with that teacher
# (train/configs/worlds-dgpo.yaml) on the mixture, then score them on the test split of every world in its
# own folder (bench/factbook_eval.py: BM25 over that world's corpus) and collect the rows in
# bench/results/worlds.json: {"card", "commit", "rows": [{"world", "trained_on", "held_out", "split",
# "n", "em", "model", "mixture"}, ...]}. Finished stages are skipped on a rerun.
#
#   bench/worlds_loo.sh                   # held out: notes, then elements (notes gets an in-mixture row)
#   bench/worlds_loo.sh notes cities      # held out: these, one mixture each
#
# WEIGHTS: relative weights of every world; the held-out one is dropped from its mixture.
# OUT (out), WORLDS_DIR ($OUT/worlds), RESULTS (bench/results/worlds.json), MIX_ARGS (more `data mix`
# options), SFT_ARGS / KD_ARGS / DGPO_ARGS (more key=value overrides), DGPO (0: no RL stage),
# EVAL_LIMIT (first N test questions),
# PREP_STUDENT (1: convert and prune the 15-layer student when absent), SMOL_GGUF, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
held=("$@")
[ ${#held[@]} -gt 0 ] || held=(notes elements)
py=${PYTHON:-python3}
de=("$py" -m dgpo_edge)
out=${OUT:-out}
worlds_dir=${WORLDS_DIR:-$out/worlds}
weights=(${WEIGHTS:-factbook=0.35 cities=0.2 dictionary=0.15 elements=0.15 notes=0.15})
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
card=${card:-cpu}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
done_run() { [ -f "$1/summary.json" ]; }

student=$out/models/smollm2-135m-15l
if [[ ${PREP_STUDENT:-1} == 1 && ! -d $student ]]; then
  gguf=${SMOL_GGUF:-$("$py" -c 'from dgpo_edge.train.models import smollm2_gguf; print(smollm2_gguf())')}
  [ -d "$out/models/smollm2-135m" ] || "${de[@]}" model from-gguf "$gguf" --out "$out/models/smollm2-135m"
  "${de[@]}" model prune "$out/models/smollm2-135m" --keep-layers 15 --out "$student"
fi

for h in "${held[@]}"; do
  mix=$out/worlds-mix/$h-out
  teacher=$out/runs/worlds-teacher-sft-$h-out
  kd=$out/runs/worlds-kd-$h-out
  dgpo=$out/runs/worlds-dgpo-$h-out
  worlds=() args=()
  for w in "${weights[@]}"; do
    name=${w%%=*}
    worlds+=("$name")
    [[ $name == "$h" ]] || args+=(--world "$w")
  done
  [[ " ${worlds[*]} " == *" $h "* ]] || worlds+=("$h")
  data=(data.train="$mix/oracle.jsonl" data.dev="$mix/dev.jsonl" data.retriever="$mix/corpus.jsonl")
  [ -f "$mix/manifest.json" ] || "${de[@]}" data mix "${args[@]}" --hold-out "$h" --worlds-dir "$worlds_dir" \
    --out "$mix" ${MIX_ARGS:-}
  done_run "$teacher" || "${de[@]}" train sft --config train/configs/worlds-teacher-sft.yaml \
    run.out_dir="$teacher" "${data[@]}" ${SFT_ARGS:-}
  done_run "$kd" || "${de[@]}" train kd --config train/configs/worlds-kd.yaml run.out_dir="$kd" \
    model.path="$student" kd.teacher="$teacher/checkpoints/best" "${data[@]}" ${KD_ARGS:-}
  models=(--model "teacher@$h-out=$teacher/checkpoints/best" --model "kd@$h-out=$kd/checkpoints/best")
  if [[ ${DGPO:-1} == 1 ]]; then
    done_run "$dgpo" || "${de[@]}" train dgpo --config train/configs/worlds-dgpo.yaml run.out_dir="$dgpo" \
      model.path="$kd/checkpoints/best" teacher.path="$teacher/checkpoints/best" data.train="$mix/train.jsonl" \
      data.dev="$mix/dev.jsonl" data.retriever="$mix/corpus.jsonl" ${DGPO_ARGS:-}
    models+=(--model "dgpo@$h-out=$dgpo/checkpoints/best")
  fi
  for w in "${worlds[@]}"; do  # every world's own test split, the held-out one included
    "$py" bench/factbook_eval.py --data "$worlds_dir/$w" --splits test --out "$out/worlds-eval/$w.jsonl" \
      "${models[@]}" --card "$card" --commit "$commit" ${EVAL_LIMIT:+--limit "$EVAL_LIMIT"}
  done
done
"$py" bench/worlds_results.py --eval-dir "$out/worlds-eval" --mix-dir "$out/worlds-mix" \
  --out "${RESULTS:-bench/results/worlds.json}"
