#!/usr/bin/env bash
# Leave one world out (issue 19). For each held-out world, one lane on its own GPU (lanes side by side,
# GPU i for the i-th world): mix the other worlds by weight (`dgpo-edge data mix`), train the teacher
# (train/configs/worlds-teacher-sft.yaml), the KD student (worlds-kd.yaml) and DGPO from that KD student
# with that teacher (worlds-dgpo.yaml, cut after DGPO_MINUTES; its checkpoints/best is chosen on the
# mixture's dev split), then score each model on the test split of every world in its own folder
# (bench/factbook_eval.py: BM25 over that world's corpus), plus `notes-s1`: a notes world built with
# seed 1, notes nobody trained on. The KD and teacher evaluations run beside DGPO on the same GPU.
# bench/worlds_results.py then writes bench/results/worlds.json: {"card", "commit", "rows": [{"world",
# "corpus", "seed", "trained_on", "held_out", "split", "n", "em", "model", "mixture"}, ...]}.
# Finished stages and evaluations are skipped on a rerun; a cut DGPO run resumes from checkpoints/last.
#
#   bench/worlds_loo.sh                   # held out: notes (GPU 0) and elements (GPU 1)
#   bench/worlds_loo.sh notes cities      # held out: these
#   DGPO_MINUTES=0 bench/worlds_loo.sh none   # every world in: the mixture `all` (a student to ship)
#
# WEIGHTS: relative weights of every world; the held-out one is dropped from its mixture (with every
# NAME@SEED entry of it: `notes@2=0.1` adds the notes world built with seed 2, other people). notes@1
# is refused: seed 1 is notes-s1, the unseen notes every model is scored on.
# DGPO_MINUTES (10, whole minutes; 0: no DGPO), WORK_DIR (out; not OUT, which the GPU machine sets for returned files),
# WORLDS_DIR ($WORK_DIR/worlds), RESULTS
# (bench/results/worlds.json), MIX_ARGS (more `data mix` options), MIX_TAG (appended to the mixture's name and so to
# its runs' and rows': MIX_TAG=records mixes notes-out-records, an experiment beside notes-out in one WORK_DIR),
# SFT_ARGS / KD_ARGS / DGPO_ARGS
# (more key=value overrides), EVAL_LIMIT (first N test questions), PACK (1: the DGPO student as a Q8_0
# GGUF in 15 MiB pieces under out/pack, and the KD adapter copied there, so they can leave a lease:
# bench/factbook_rows.sh pack/unpack), PREP_STUDENT (1: convert and prune
# the student when absent), STUDENT_LAYERS (15, so that the first runs keep their names; the shipped student is 24: the student's depth, of SmolLM2's 30; runs of another
# depth are named ...-LLl, e.g. worlds-kd-notes-out-24l, and their rows kd-24l, dgpo-24l), SMOL_GGUF,
# GPUS (the GPU indices lanes take in turn; default every GPU), PYTHON, COMMIT (recorded in the
# rows; default git's), MIX_DEV (1: each model's EM on the mixture's dev split first, rows in
# worlds-eval/mixture-MIXTURE.jsonl: what a choice between runs, e.g. of STUDENT_LAYERS, is made on),
# EVAL_WORLDS (the worlds whose test splits are scored, besides notes-s1; default every world in
# WEIGHTS), EVAL_TEACHER (0: skip the teacher's evaluations, e.g. in a second lane of another depth on the same
# mixture, started once the first lane's teacher is trained), COLLECT (0: leave the rows in
# worlds-eval/ without writing RESULTS, for a driver that runs several of these at once and collects once),
# KD_ADAPTER (a KD adapter trained at STUDENT_LAYERS, e.g. the 24-layer KD student trained on `all` that
# shipped until ba04eb7, `git archive ba04eb7 dgpo_edge/bundle/shipped/adapter`: the lane's KD student, merged once into $WORK_DIR/models/kd-start-DIGEST as
# bench/factbook_rows.sh names it, instead of training one), DGPO_START (merged; adapter: DGPO trains the KD
# adapter itself, LoRA over the pruned base, so its checkpoints/best/adapter is a student the bundle ships
# and PACK=1 copies it to out/pack; run worlds-dgpo-lora-..., rows dgpo-lora...), DGPO_VARIANTS (names of DGPO
# runs side by side on the lane's GPU, each with the overrides in VARIANT_<name> as in bench/factbook_lanes.sh:
# run worlds-dgpo[-lora]-MIXTURE[-NNl]+NAME, row dgpo[-lora][-NNl]+NAME@MIXTURE; e.g. learning rates to choose
# on the mixture's dev split), DEADLINE (epoch seconds: DGPO stops then, if before DGPO_MINUTES are up),
# PACK_DIR (out/pack: where the adapters are copied; bench/lease/watch.sh brings back what is in out/pack). A lane's KD rows and DGPO runs are named after its
# mixture and depth, not after where its KD student came from: a rerun whose KD student is another
# (KD_ADAPTER given or not, or another adapter) than the one those rows and runs started from is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
held=("$@")
[ ${#held[@]} -gt 0 ] || held=(notes elements)
py=${PYTHON:-python3}
de=("$py" -m dgpo_edge)
out=${WORK_DIR:-out}
worlds_dir=${WORLDS_DIR:-$out/worlds}
weights=(${WEIGHTS:-factbook=0.35 cities=0.2 dictionary=0.15 elements=0.15 notes=0.15})
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
card=${card:-cpu}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}   # "" when unknown, as bench/provenance.py
mkdir -p "$out/logs"
if [[ " ${weights[*]} " == *" notes@1="* ]]; then
  echo "error: WEIGHTS has notes@1, but seed 1 is notes-s1, the notes no model may train on" >&2; exit 2
fi
log() { echo "[$(date +%H:%M:%S)] $*"; }
# (not NNl: worlds-kd-all-24l would then be both the 24-layer run of `all` and the 15-layer one of `all-24l`)
[[ ${MIX_TAG:-x} =~ ^[a-z0-9_]+$ && ! ${MIX_TAG:-x} =~ ^[0-9]+l$ ]] \
  || { echo "error: MIX_TAG '$MIX_TAG': lowercase letters, digits and _, and not a depth like 24l" >&2; exit 2; }

read -ra dgpo_variants <<< "${DGPO_VARIANTS:-}"
for v in "${dgpo_variants[@]}"; do
  [[ $v =~ ^[a-z0-9_]+$ && -n $(printenv "VARIANT_$v") ]] || { echo "error: DGPO_VARIANTS: '$v' needs a name of" \
    "lowercase letters, digits and _, and its overrides in VARIANT_$v" >&2; exit 2; }
done
[[ ${DGPO_START:-merged} =~ ^(merged|adapter)$ ]] \
  || { echo "error: DGPO_START '$DGPO_START': merged or adapter" >&2; exit 2; }
for f in adapter_model.safetensors adapter_config.json; do   # what lora.init_from reads
  if [[ -n ${KD_ADAPTER:-} && ! -f ${KD_ADAPTER:-}/$f ]]; then echo "error: KD_ADAPTER $KD_ADAPTER: no $f there" >&2; exit 2; fi
done
[[ ${DGPO_MINUTES:-10} =~ ^[0-9]+$ ]] || { echo "error: DGPO_MINUTES '$DGPO_MINUTES': whole minutes" >&2; exit 2; }
[[ ${DEADLINE:-0} =~ ^[0-9]+$ ]] || { echo "error: DEADLINE '$DEADLINE': seconds since the epoch (date +%s)" >&2; exit 2; }
pack_dir=${PACK_DIR:-out/pack}

layers=${STUDENT_LAYERS:-15}
student=$out/models/smollm2-135m-${layers}l
tag=$([[ $layers == 15 ]] || echo "-${layers}l")   # the 15-layer runs keep their names
if [[ ${PREP_STUDENT:-1} == 1 && ! -d $student ]]; then
  gguf=${SMOL_GGUF:-$("$py" -c 'from dgpo_edge.train.models import smollm2_gguf; print(smollm2_gguf())')}
  [ -d "$out/models/smollm2-135m" ] || "${de[@]}" model from-gguf "$gguf" --out "$out/models/smollm2-135m"
  "${de[@]}" model prune "$out/models/smollm2-135m" --keep-layers "$layers" --out "$student"
fi
[ -f "$worlds_dir/notes-s1/manifest.json" ] || "${de[@]}" data build notes --seed 1 --out "$worlds_dir/notes-s1"

evaluate() {  # NAME@MIXTURE=DIR: the mixture's dev EM (MIX_DEV=1), then test EM on every world's own corpus
  if [[ ${MIX_DEV:-0} == 1 ]]; then
    "$py" bench/factbook_eval.py --data "$out/worlds-mix/$mixture" --splits dev \
      --out "$out/worlds-eval/mixture-$mixture.jsonl" --model "$1" --card "$card" --commit "$commit" \
      ${EVAL_LIMIT:+--limit "$EVAL_LIMIT"}
    log "eval ${1%%=*} on the mixture's dev split done"
  fi
  for w in notes-s1 ${EVAL_WORLDS:-"${worlds[@]}"}; do
    "$py" bench/factbook_eval.py --data "$worlds_dir/$w" --splits test --out "$out/worlds-eval/$w.jsonl" \
      --model "$1" --card "$card" --commit "$commit" ${EVAL_LIMIT:+--limit "$EVAL_LIMIT"}
    log "eval ${1%%=*} on $w done"
  done
}

# A mixture's runs and evaluation rows are named after it, and a rerun skips what is done. A mixture
# folder that is gone (removed because it was mixed from other WEIGHTS, say) while its runs or rows
# stay would have them reused as if trained on the new one: refuse that.
leftovers() {  # MIXTURE: the runs and evaluation files named after this mixture, one a line
  local d f
  for d in "$out"/runs/worlds-*; do
    [[ $(basename "$d") =~ ^worlds-(teacher-sft|kd|dgpo|dgpo-lora)-$1(-[0-9]+l)?(\+[a-z0-9_]+)?$ ]] && echo "$d"
  done
  for f in "$out"/worlds-eval/*.jsonl; do
    [ -f "$f" ] && grep -q "^{\"method\": \"[^\"]*@$1\"" "$f" && echo "$f"
  done
  return 0
}

mixture_of() {  # HELD_OUT: the mixture's name (none: all)
  if [[ $1 == none ]]; then echo "all${MIX_TAG:+-$MIX_TAG}"; else echo "$1-out${MIX_TAG:+-$MIX_TAG}"; fi
}
kd_start() {  # MIXTURE: the lane's KD student as "MODEL ADAPTER": KD_ADAPTER merged, or the KD run's best
  if [[ -n ${KD_ADAPTER:-} ]]; then
    echo "$out/models/$(bash bench/factbook_rows.sh start-name "$KD_ADAPTER") $KD_ADAPTER"
  else
    echo "$out/runs/worlds-kd-$1$tag/checkpoints/best $out/runs/worlds-kd-$1$tag/checkpoints/best/adapter"
  fi
}
# The KD rows and DGPO runs of a lane are named after its mixture and depth only: a rerun from another KD
# student would skip them as done (or resume DGPO from the other start). Each says where it started.
other_start() {  # MIXTURE: the KD rows and DGPO runs of this lane that started from another KD student
  local f d model adapter
  read -r model adapter <<< "$(kd_start "$1")"
  for f in "$out"/worlds-eval/*.jsonl; do
    [ -f "$f" ] && grep "^{\"method\": \"kd$tag@$1\"" "$f" | grep -qvF "\"model\": \"$model\"" && echo "$f"
  done
  for d in "$out/runs/worlds-dgpo-$1$tag" "$out/runs/worlds-dgpo-$1$tag+"*; do
    [ -f "$d/config.yaml" ] && ! grep -qxF "  path: $model" "$d/config.yaml" && echo "$d"
  done
  for d in "$out/runs/worlds-dgpo-lora-$1$tag" "$out/runs/worlds-dgpo-lora-$1$tag+"*; do
    [ -f "$d/config.yaml" ] && ! grep -qxF "  init_from: $adapter" "$d/config.yaml" && echo "$d"
  done
  return 0
}
for h in "${held[@]}"; do   # before any lane starts
  mixture=$(mixture_of "$h")
  stale=$([ -f "$out/worlds-mix/$mixture/manifest.json" ] || leftovers "$mixture")
  if [ -n "$stale" ]; then
    echo "error: $out/worlds-mix/$mixture has no mixture, but runs or rows of one named $mixture are left" \
      "(made from another build of it?): remove them too, or give this experiment its own MIX_TAG or" \
      "WORK_DIR:" $stale >&2
    exit 2
  fi
  other=$(other_start "$mixture")
  if [ -n "$other" ]; then
    echo "error: these KD rows or DGPO runs of $mixture started from another KD student than this run's" \
      "(${KD_ADAPTER:-the KD run here}): remove them, or give this experiment its own MIX_TAG or WORK_DIR:" $other >&2
    exit 2
  fi
done

pack_adapter() {  # ADAPTER_DIR NAME: copied to PACK_DIR/NAME-adapter, replacing an earlier copy (cp -r would nest in it)
  mkdir -p "$pack_dir" && rm -rf "$pack_dir/$2-adapter" && cp -r "$1" "$pack_dir/$2-adapter"
}

lane() {  # HELD_OUT (none: no world): mix, teacher, KD, then DGPO beside the KD and teacher evaluations
  local h=$1 mixture hold=(--hold-out "$1")
  mixture=$(mixture_of "$h")
  if [[ $h == none ]]; then hold=(); fi
  local mix=$out/worlds-mix/$mixture
  local teacher=$out/runs/worlds-teacher-sft-$mixture kd=$out/runs/worlds-kd-$mixture$tag
  local args=() data=(data.train="$mix/oracle.jsonl" data.dev="$mix/dev.jsonl" data.retriever="$mix/corpus.jsonl")
  worlds=()  # evaluated: each world once (an entry NAME@SEED trains on NAME at another seed)
  for w in "${weights[@]}"; do
    local name=${w%%=*} base; base=${name%%@*}
    [[ " ${worlds[*]} " == *" $base "* ]] || worlds+=("$base")
    [[ $base == "$h" ]] || args+=(--world "$w")
  done
  [[ $h == none || " ${worlds[*]} " == *" $h "* ]] || worlds+=("$h")
  # --keep: a finished mixture is kept, one of other WEIGHTS or MIX_ARGS is refused (its runs would be skipped)
  "${de[@]}" data mix "${args[@]}" "${hold[@]}" --worlds-dir "$worlds_dir" --out "$mix" --keep ${MIX_ARGS:-}
  # The teacher is measured on whole test splits below, so no dev evaluation inside its run.
  [ -f "$teacher/summary.json" ] || "${de[@]}" train sft --config train/configs/worlds-teacher-sft.yaml \
    run.out_dir="$teacher" "${data[@]}" data.dev=null log.progress=false ${SFT_ARGS:-}
  local kd_model kd_adapter
  read -r kd_model kd_adapter <<< "$(kd_start "$mixture")"
  if [[ -n ${KD_ADAPTER:-} ]]; then   # a KD student trained before: merged once, for the evaluations
    [ -d "$kd_model" ] || "${de[@]}" model merge "$student" --adapter "$KD_ADAPTER" --out "$kd_model"
  elif [ ! -f "$kd/summary.json" ]; then
    "${de[@]}" train kd --config train/configs/worlds-kd.yaml run.out_dir="$kd" model.path="$student" \
      kd.teacher="$teacher/checkpoints/last" "${data[@]}" eval.at_start=false log.progress=false ${KD_ARGS:-}
  fi
  # DGPO from the merged KD student (full weights), or (DGPO_START=adapter) training its adapter
  local lora= start=(model.path="$kd_model") variants=()
  if [[ ${DGPO_START:-merged} == adapter ]]; then lora=-lora; start=(model.path="$student" lora.init_from="$kd_adapter"); fi
  variants=("${dgpo_variants[@]}")
  [ ${#variants[@]} -gt 0 ] || variants=("")
  local -A run_of=()   # variant ("": none) -> its DGPO run folder
  for v in "${variants[@]}"; do run_of[${v:-_}]=$out/runs/worlds-dgpo$lora-$mixture$tag${v:++$v}; done
  local minutes=${DGPO_MINUTES:-10} v
  if [[ $minutes != 0 ]]; then  # cut at the time limit (status 124); its best dev checkpoint is evaluated
    local seconds=$(( 10#$minutes * 60 )) left
    if [[ -n ${DEADLINE:-} ]]; then left=$(( 10#$DEADLINE - $(date +%s) )); (( left > seconds )) || seconds=$left; fi
    (( seconds > 0 )) || log "dgpo $h: not started, DEADLINE has passed"
    for v in "${variants[@]}"; do
      local dgpo=${run_of[${v:-_}]} extra=()
      [[ -z $v ]] || read -ra extra <<< "$(printenv "VARIANT_$v")"
      ( [ -f "$dgpo/summary.json" ] || [ "$seconds" -le 0 ] || timeout --signal=TERM "$seconds" "${de[@]}" train dgpo \
          --config train/configs/worlds-dgpo.yaml run.out_dir="$dgpo" "${start[@]}" \
          teacher.path="$teacher/checkpoints/last" data.train="$mix/train.jsonl" data.dev="$mix/dev.jsonl" \
          data.retriever="$mix/corpus.jsonl" eval.at_start=false log.save_every=10 log.progress=false \
          ${DGPO_ARGS:-} "${extra[@]}" || log "dgpo $h${v:++$v}: rc=$?" ) > "$out/logs/$(basename "$dgpo").log" 2>&1 &
    done
  fi
  evaluate "kd$tag@$mixture=$kd_model"
  [[ ${EVAL_TEACHER:-1} == 0 ]] || evaluate "teacher@$mixture=$teacher/checkpoints/last"
  wait
  if [[ ${PACK:-0} == 1 && -z ${KD_ADAPTER:-} ]]; then pack_adapter "$kd_adapter" "$(basename "$kd")"; fi
  for v in "${variants[@]}"; do
    local dgpo=${run_of[${v:-_}]}
    [ -d "$dgpo/checkpoints/best" ] || continue
    evaluate "dgpo$lora$tag${v:++$v}@$mixture=$dgpo/checkpoints/best"
    [[ ${PACK:-0} == 1 ]] || continue
    if [[ -n $lora ]]; then   # the adapter is the student (15 MiB at 24 layers); else GGUF pieces
      pack_adapter "$dgpo/checkpoints/best/adapter" "$(basename "$dgpo")"
    else
      bash bench/factbook_rows.sh pack "$dgpo/checkpoints/best"
    fi
  done
}

gpus=(${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null || true)})
for i in "${!held[@]}"; do  # lane i on the i-th GPU (mod the GPUs there are); all lanes at once
  ( if [[ ${#gpus[@]} -gt 0 ]]; then export CUDA_VISIBLE_DEVICES=${gpus[$(( i % ${#gpus[@]} ))]}; fi
    # named after the held-out world, MIX_TAG and depth, so that lanes of the same held-out world with another MIX_TAG,
    # started beside this one in the same WORK_DIR, keep logs of their own
    lane_log=$out/logs/worlds-lane-${held[$i]}${MIX_TAG:+-$MIX_TAG}$tag.log
    lane "${held[$i]}" > "$lane_log" 2>&1
    log "lane ${held[$i]} done (log: $lane_log)" ) &
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
[ $failed = 0 ] || { echo "error: a lane failed; see $out/logs/worlds-lane-*.log" >&2; exit 1; }
[[ ${COLLECT:-1} == 0 ]] || "$py" bench/worlds_results.py --eval-dir "$out/worlds-eval" --mix-dir "$out/worlds-mix" \
  --worlds-dir "$worlds_dir" --out "${RESULTS:-bench/results/worlds.json}"
