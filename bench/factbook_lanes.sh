#!/usr/bin/env bash
# FactbookQA RL rows side by side on the GPUs of one machine, until a deadline, then test EM:
# the whole of bench/factbook_rows.sh in one command, for one lease.
#
#   bench/factbook_lanes.sh MINUTES LANE [LANE...]
#   bench/factbook_lanes.sh 20 "0=dgpo:0,ppo:0,dgpo:1,ppo:1" "1=dgpo:2,ppo:2,grpo:0"
#   bench/factbook_lanes.sh 25 "0=kd_jsd:0+kd_reverse_kl:0,dgpo_no_cold_start:0" "1=dgpo:0,dgpo:0:b01"
#
# A LANE is GPU=METHOD:SEED[:VARIANT][,...] (or [+...]): the rows of a lane run at once on that GPU (small
# students leave most of a card idle; four FactbookQA runs on one H200 gave 2.1x the steps of
# one). Rows joined by + run one after another instead (kd_jsd:0+kd_reverse_kl:0: rows too large
# to share a card with each other). A VARIANT names overrides given in the environment, VARIANT_<name>, for that row alone, and
# tags its run (bench/factbook_rows.sh's TAG): with VARIANT_b01="teacher.beta=0.01", dgpo:0:b01
# trains out/runs/rl-dgpo-b01-s0. A row whose variant sets teacher.path= (kd.teacher= for a KD-loss row)
# out/runs/RUN/checkpoints/... where
# RUN is another row's run here waits until that run has finished (or skips, if it failed), so DGPO
# on another GPU can learn from the teacher PPO trains: "0=teacher_ppo:0:t100+dgpo:0:rlt" "1=dgpo:1:rlt".
# MINUTES counts from now; every row is stopped then (each resumes from its last checkpoint
# if the command is run again on the same machine), and every run with a checkpoint is evaluated
# on the test split, the runs shared out over the lanes' GPUs: out/eval/lanes-test.jsonl.
# On a lent machine held for at most 30 minutes, MINUTES must also leave out what the lease had
# already held when this command started (a machine's start can take several minutes of it).
# Every RL row also evaluates the whole test split every 50 steps while it trains (data.report), and
# a KD-loss row (kd_jsd:0, ...) at its end: out/runs/{rl,kd}-*/report.jsonl, collected into
# out/eval/lanes-reports.jsonl when the rows stop, are the numbers to take home when the lease may
# end before the final evaluations.
# First, unless SKIP_PREP=1: `start`, then `teacher` on the first lane's GPU, beside the PPO, GRPO
# and kd_sft rows (the teacher-free ones start at once; DGPO, its ablations and the KD-loss rows wait
# for the teacher).
# Once the teacher is trained, the references (REFS, default "teacher kd base": the teacher, the KD
# start, the pruned base; REFS="" skips them) are evaluated on the test and dev splits on the first
# lane's GPU, beside its rows: out/eval/lanes-ref.jsonl.
# MICRO_BATCH: the RL rows' micro-batch. Unset, it is the configs' 32 for a row alone on its card
# and 16 for rows that share one: a 24-layer row peaked at 53-66 GB at 32 (H200, 2026-11-28), so
# two on a 140 GB card ran out of memory, where 16 peaked at 37 GB. The micro-batch changes only
# how a mini-batch's gradient is accumulated, not what it computes. An RL row that still runs out of
# GPU memory resumes from its last checkpoint at half its micro-batch (logged), once the card has
# OOM_FREE_GB (40) free, up to OOM_RESUMES (3) times, while time is left (another job on the card,
# a worlds lane's teacher say, may hold the memory for minutes). (The first lane's rows count as sharing only with each other, not with the teacher that
# trains there first: a row there that meets the teacher's peak is what the resume is for.)
# START, TAG and STEPS pass through to bench/factbook_rows.sh; ROW_ARGS adds overrides
# to every RL row (e.g. "optim.lr=1e-4"), KD_ARGS to every KD-loss row; LIMIT evaluates only the first N questions of each split (the references' dev too); EVAL_LAST=0
# skips the last-checkpoint evaluations after the deadline (the runs' reports hold test EM already).
# PACK="RUN..." then writes each named run's last checkpoint (an RL or KD run folder under out/runs,
# checkpoints/last) as Q8_0 GGUF pieces that a device call can return (bench/factbook_rows.sh pack:
# out/pack/RUN.q8_0.gguf.partNN + sha256), for the laptop; at most 10 minutes each.
# A row that fails stops the rows chained after it (+). The command's status is 1 when a row, the
# teacher, the references or a last evaluation failed (out/logs/lanes.failed names them); what the
# deadline stopped has not failed.
# Logs: out/logs/lanes-*.log and out/logs/rl-*.log; out/logs/lanes.done once everything has ended.
set -uo pipefail
cd "$(dirname "$0")/.."
minutes=${1:?usage: bench/factbook_lanes.sh MINUTES GPU=METHOD:SEED[:VARIANT][,|+...] ...}; shift
[ $# -gt 0 ] || { echo "error: give at least one lane, e.g. 0=dgpo:0,ppo:0" >&2; exit 2; }
deadline=$(( $(date +%s) + minutes * 60 ))
left() { echo $(( deadline - $(date +%s) )); }
# A job's status: ended well, or stopped by the deadline (timeout's 124, or 137 when it had to be
# killed) - it resumes from its checkpoint next time, so that is not a failure.
ok_or_deadline() { [ "$1" = 0 ] || [ "$1" = 124 ] || { [ "$1" = 137 ] && [ "$(left)" -le 0 ]; }; }
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a out/logs/lanes.log; }
rows=bench/factbook_rows.sh
mkdir -p out/logs out/eval
gpus=()
spec_re='[a-z_]+:[0-9]+(:[a-z0-9_]+)?'
methods=" ppo dgpo grpo dgpo_grpo dgpo_all_rollouts dgpo_no_cold_start teacher_ppo kd_forward_kl kd_reverse_kl kd_jsd kd_seqkd kd_sft "
seen=" "
chain_re="$spec_re(\\+$spec_re)*"
chains=()   # "GPU SPEC[+SPEC...]", every row checked before anything runs
declare -A sharing   # GPU -> how many chains run on it at once
declare -A made_by   # run folder (out/runs/NAME) -> the row here that trains it, as logs and lanes.failed name it
run_of() {  # METHOD SEED [VARIANT]: the run folder bench/factbook_rows.sh trains for that row (its naming)
  local tag=${TAG:-}
  [ -z "${3:-}" ] || tag=${TAG:+$TAG-}$3
  TAG=$tag bash $rows name "$1" "$2"
}
for lane in "$@"; do
  [[ $lane =~ ^[0-9]+=$chain_re(,$chain_re)*$ ]] || { echo "error: bad lane '$lane' (GPU=METHOD:SEED[:VARIANT][+...],...)" >&2; exit 2; }
  gpus+=("${lane%%=*}")
  IFS=, read -ra lane_chains <<< "${lane#*=}"
  for chain in "${lane_chains[@]}"; do chains+=("${lane%%=*} $chain"); done
  sharing[${lane%%=*}]=$(( ${sharing[${lane%%=*}]:-0} + ${#lane_chains[@]} ))
  IFS=,+ read -ra specs <<< "${lane#*=}"
  for spec in "${specs[@]}"; do
    IFS=: read -r method seed variant <<< "$spec"
    [[ $methods == *" $method "* ]] || { echo "error: lane '$lane': unknown method $method (one of:$methods)" >&2; exit 2; }
    [[ $seen != *" $spec "* ]] || { echo "error: row $spec is given twice (both would train one run folder)" >&2; exit 2; }
    seen+="$spec "
    made_by[$(run_of "$method" "$seed" "$variant")]="$method${variant:+-$variant} s$seed"
    [ -z "$variant" ] || [ -n "$(printenv "VARIANT_$variant")" ] \
      || { echo "error: lane '$lane': row $spec needs its overrides in VARIANT_$variant" >&2; exit 2; }
  done
done

for ref in ${REFS-}; do   # the references bench/factbook_rows.sh eval knows by name
  case $ref in teacher|kd|base) ;; *) echo "error: REFS: unknown reference $ref (teacher, kd, base)" >&2; exit 2 ;; esac
done

# The teacher trains on the first lane's GPU while the rows that need none (ppo, grpo, kd_sft) already run;
# the others wait for it. Runs are compared at equal steps (report.jsonl), not at equal wall time.
teacher_state=out/logs/lanes-teacher.state
failed=out/logs/lanes.failed   # what failed (rows, the teacher, an evaluation): the status is then 1
rm -f $teacher_state $failed out/logs/lanes.done
if [ "${SKIP_PREP:-0}" != 1 ]; then
  log "start"; bash $rows start > out/logs/lanes-start.log 2>&1 || { log "start failed (out/logs/lanes-start.log)"; exit 1; }
  # which KD student the rows start from (its digest names the merged start), for the record
  log "$(grep -m1 -e '^KD start:' -e '^note: no KD adapter' out/logs/lanes-start.log || echo 'KD start: not reported')"
  log "teacher"
  ( if CUDA_VISIBLE_DEVICES=${gpus[0]} timeout "$(left)" bash $rows teacher > out/logs/lanes-teacher.log 2>&1; then
      echo ok; else echo failed; echo teacher >> $failed; fi \
      > $teacher_state
    l=$(left)
    read -ra refs <<< "${REFS-teacher kd base}"
    if [ "$(cat $teacher_state)" = ok ] && [ "$l" -gt 60 ] && [ ${#refs[@]} -gt 0 ]; then
      log "evaluating the references"
      CUDA_VISIBLE_DEVICES=${gpus[0]} timeout "$l" bash $rows eval out/eval/lanes-ref.jsonl test,dev "${refs[@]}" \
        > out/logs/lanes-ref.log 2>&1
      status=$?
      log "references evaluated (status $status)"
      ok_or_deadline $status || echo "references" >> $failed
    fi ) &
else
  echo ok > $teacher_state
fi

wait_for_teacher() {  # 0 once the teacher is trained; 1 if it failed or the deadline is near
  until [ -s $teacher_state ]; do sleep 5; [ "$(left)" -gt 60 ] || return 1; done
  [ "$(cat $teacher_state)" = ok ] || { log "teacher failed (out/logs/lanes-teacher.log)"; return 1; }
}

# A variant's teacher.path=out/runs/RUN/checkpoints/... may name the run of a row on another lane (DGPO
# on GPU 1 from the PPO teacher that GPU 0 trains): the row waits until that run has finished, since
# its checkpoints/best exists from the run's first evaluation on and changes until the end.
wait_for_run() {  # RUN: 0 once it has finished, at once when no row here trains it; 1 if it failed or time is short
  local by=${made_by[$1]:-}
  [ -n "$by" ] || return 0
  until [ -f "out/runs/$1/summary.json" ]; do
    if grep -qxF "$by" $failed 2>/dev/null || [ "$(left)" -le 60 ]; then return 1; fi
    sleep 5
  done
}

free_gb() {  # GPU: its free memory in whole GB, nothing when nvidia-smi cannot say
  local mib; mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i "$1" 2>/dev/null | head -1)
  [[ $mib =~ ^[0-9]+$ ]] && echo $(( mib / 1024 ))
}
wait_for_memory() {  # GPU ROW: 0 once the card has OOM_FREE_GB (40) free, or cannot say; 1 if time runs short first
  local free said=
  while free=$(free_gb "$1") && [ -n "$free" ] && [ "$free" -lt "${OOM_FREE_GB:-40}" ]; do
    [ -n "$said" ] || { log "gpu $1: $2 waits for ${OOM_FREE_GB:-40} GB free (${free} GB now)"; said=1; }
    [ "$(left)" -gt 120 ] || return 1
    sleep "${OOM_POLL_S:-10}"
  done
  [ "$(left)" -gt 120 ]
}
train_row() {  # GPU MICRO_BATCH SECONDS LOG METHOD SEED [k=v...]: one row's trainer (TAG from the caller)
  local gpu=$1 micro=$2 seconds=$3 logfile=$4; shift 4
  # TERM at the deadline, KILL 30 s later for a row that does not stop (stuck in CUDA, say)
  CUDA_VISIBLE_DEVICES=$gpu MICRO_BATCH=$micro timeout -k 30 --signal=TERM "$seconds" bash $rows row "$@" > "$logfile" 2>&1
}
run_row() {  # GPU METHOD SEED [VARIANT]
  local row="$2${4:+-$4} s$3" extra=() tag=${TAG:-} l args
  case $2 in ppo|grpo|kd_sft) ;; *) wait_for_teacher || { log "skip $row: no teacher"; return; } ;; esac
  if [ -n "${4:-}" ]; then read -ra extra <<< "$(printenv "VARIANT_$4")"; tag=${TAG:+$TAG-}$4; fi
  local arg
  for arg in "${extra[@]}"; do
    [[ $arg =~ ^(teacher\.path|kd\.teacher)=(.*/)?runs/([^/]+)/checkpoints/ ]] || continue
    wait_for_run "${BASH_REMATCH[3]}" || { log "skip $row: its teacher ${BASH_REMATCH[3]} did not finish"; return; }
  done
  l=$(left)
  [ "$l" -gt 60 ] || { log "skip $row: $l s left"; return; }
  case $2 in kd_*) args=${KD_ARGS:-} ;; *) args=${ROW_ARGS:-} ;; esac   # the two trainers take other keys
  local micro=${MICRO_BATCH:-$([ "${sharing[$1]}" -gt 1 ] && echo 16 || echo 32)} rl=1 about
  local logfile="out/logs/rl-$2${tag:+-$tag}-s$3.log" status
  case $2 in kd_*) rl=0 ;; esac   # a KD row's batch is its config's; the micro-batch is the RL rows'
  about=$([ $rl = 1 ] && echo " (micro-batch $micro)")
  log "gpu $1: $row for up to $l s$about"
  # shellcheck disable=SC2086 # args is a list of overrides
  TAG=$tag train_row "$1" "$micro" "$l" "$logfile" "$2" "$3" $args "${extra[@]}"
  status=$?
  log "gpu $1: $row ended (status $status)"
  # Out of GPU memory (a neighbour's peak can meet this row's, or another job's on the card): again
  # from its checkpoint at half the micro-batch, once the card has OOM_FREE_GB free (a lease on
  # 2026-11-29 lost two rows that resumed at once beside two teachers that ended minutes later),
  # up to OOM_RESUMES times; each try's log kept beside the next one's.
  local tries=0
  while [ $rl = 1 ] && ! ok_or_deadline $status && grep -q "OutOfMemoryError" "$logfile" \
      && [ $tries -lt "${OOM_RESUMES:-3}" ] && [ "$micro" -gt 4 ] && wait_for_memory "$1" "$row"; do
    tries=$(( tries + 1 )); micro=$(( micro / 2 )); l=$(left); mv "$logfile" "${logfile%.log}.oom$tries.log"
    log "gpu $1: $row ran out of GPU memory; resumed from its last checkpoint at micro-batch $micro for up to $l s"
    # shellcheck disable=SC2086
    TAG=$tag train_row "$1" "$micro" "$l" "$logfile" "$2" "$3" $args "${extra[@]}"
    status=$?
    log "gpu $1: $row ended (status $status)"
  done
  ok_or_deadline $status || { echo "$row" >> $failed; return 1; }
}
# A row that fails stops its chain: the rows after it may need what it makes (teacher_ppo, then
# DGPO from that teacher), and the status of the whole command is then 1.
for todo in "${chains[@]}"; do
  read -r gpu chain <<< "$todo"
  IFS=+ read -ra specs <<< "$chain"
  ( for i in "${!specs[@]}"; do
      IFS=: read -r method seed variant <<< "${specs[$i]}"
      run_row "$gpu" "$method" "$seed" "$variant" && continue
      rest=("${specs[@]:$((i + 1))}")
      [ ${#rest[@]} -eq 0 ] || log "gpu $gpu: not started after $method s$seed failed: ${rest[*]}"
      break
    done ) &
done
wait

# What the runs evaluated while training (test EM every 50 steps), then test EM of every run that
# left a checkpoint (and the KD start and the teacher), over the GPUs.
reported=()
for f in out/runs/rl-*/report.jsonl out/runs/kd-*/report.jsonl; do [ -f "$f" ] && reported+=("$(basename "$(dirname "$f")")"); done
[ ${#reported[@]} -gt 0 ] && bash $rows reports out/eval/lanes-reports.jsonl "${reported[@]}" | tee -a out/logs/lanes.log
for run in ${PACK:-}; do
  if [ -d "out/runs/$run/checkpoints/last" ]; then
    timeout 600 bash $rows pack "$run" > "out/logs/lanes-pack-$run.log" 2>&1; log "packed $run (status $?)"
  else log "not packed: $run has no checkpoint"; fi
done
finish() {  # status 1 when something failed (out/logs/lanes.failed lists it)
  [ -s $failed ] || exit 0
  log "failed: $(paste -sd, $failed) (out/logs/lanes-*.log, out/logs/rl-*.log)"; exit 1
}
if [ "${EVAL_LAST:-1}" = 0 ]; then log "done"; touch out/logs/lanes.done; finish; fi
# the teacher only when it trained, and last
names=(kd)
for d in out/runs/rl-*/checkpoints/last out/runs/kd-*/checkpoints/last; do
  [ -d "$d" ] && names+=("$(basename "$(dirname "$(dirname "$d")")")"); done
[ "$(cat $teacher_state 2>/dev/null)" = ok ] && names+=(teacher)
log "evaluating ${names[*]}"
for i in "${!gpus[@]}"; do
  share=()
  for j in "${!names[@]}"; do (( j % ${#gpus[@]} == i )) && share+=("${names[$j]}"); done
  [ ${#share[@]} -gt 0 ] || continue
  ( CUDA_VISIBLE_DEVICES=${gpus[$i]} bash $rows eval out/eval/lanes-test.jsonl test "${share[@]}" \
      > "out/logs/lanes-eval-$i.log" 2>&1 || { echo "evaluation on gpu ${gpus[$i]}" >> $failed
                                                log "evaluation on gpu ${gpus[$i]} failed (out/logs/lanes-eval-$i.log)"; } ) &
done
wait
grep -h " EM " out/logs/lanes-eval-*.log | tee -a out/logs/lanes.log
touch out/logs/lanes.done
finish
