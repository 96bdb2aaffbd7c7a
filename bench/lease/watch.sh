#!/usr/bin/env bash
# On the GPU machine, a watch call: wait, print where the lease's jobs stand, and bring back the small
# results (the lanes' evaluations, bench/worlds_loo.sh's as worlds-eval.WORLD.jsonl, per-run metrics, dev evaluations and reports, bench/rl_cost.py's runs, and any
# JSON, JSON lines or log a job wrote under out/results/ (a lease's rows.jsonl stayed behind before), e.g. bench/rollout.py --out out/results/rollout.json) as
# $OUT/results.tgz, which a call returns (at most 8 files of 16 MiB), and each KD adapter in out/pack as
# $OUT/NAME-adapter.tgz.
#   bash bench/lease/watch.sh SECONDS    # about SECONDS (and the packing of results every 60 s): sooner once out/logs/lease.done exists
# A log with a Python traceback is named on a line starting with "!!" (a row out of GPU memory, say).
# Issue the next watch the moment one returns: a machine with no call in flight goes back after 30 s,
# with everything on it. Editing code here while a lease runs means no call is in flight: a lease
# on 2026-11-28 was lost that way mid-run (three KD students and two benchmark runs). Write the
# code before the lease, or have a helper keep issuing watch calls meanwhile. Each call also copies
# the checkout again, and only processes started after it see the new code.
# The wait ends early once out/logs/lease.done exists (a lease's work script touches it as its last step):
# a machine held past the end of its work is device time spent on nothing (a lease on 2026-12-01 held
# nearly 5 minutes so, of a 30-minute budget, waiting out a 300-second watch). On a machine that holds no
# lease work (no out/logs: a new one, lent after the lease's went back) it exits 3 at once.
cd "$(dirname "$0")/../.." || exit 1
wait_s=${1:?usage: bench/lease/watch.sh SECONDS}
[[ $wait_s =~ ^[0-9]+$ ]] || { echo "error: SECONDS '$wait_s': whole seconds" >&2; exit 2; }
# The results are also brought every 60 s while waiting: a call cut short (its limit is the device
# time left, less than SECONDS near a lease's end) returns what is under $OUT, and so the latest results.
bring_results() {  # $OUT/results.tgz made anew (written beside it, then renamed: a call cut mid-write keeps the last)
  [ -n "${OUT:-}" ] || return 0
  r=$(mktemp -d)/results; mkdir -p "$r"
  cp out/eval/*.jsonl out/results/*.json out/results/*.jsonl out/results/*.log out/bench-rl-cost/results.json "$r/" 2>/dev/null
  for f in out/worlds-eval/*.jsonl; do [ -f "$f" ] && cp "$f" "$r/worlds-eval.$(basename "$f")"; done
  for d in out/runs/* out/bench-rl-cost/run-*; do
    for f in metrics.csv eval.csv report.jsonl summary.json; do [ -f "$d/$f" ] && cp "$d/$f" "$r/$(basename "$d").$f"; done
  done
  tar czf "$OUT/.results.tgz" -C "$(dirname "$r")" results && mv "$OUT/.results.tgz" "$OUT/results.tgz"
  rm -rf "$(dirname "$r")"
}
# A machine with no out/logs was never set up: the lease's machine went back (30 s with no call in
# flight, e.g. a watcher started a minute after the work's call) and this call was lent a new, bare
# one. Waiting there spends device time on nothing (2 x 300 s on 2026-12-02), so say so at once.
if [ ! -d out/logs ]; then
  echo "!! no lease work on this machine (no out/logs): the lease's machine went back and this call started a new one; give it back"
  exit 3
fi
for (( left = 10#$wait_s; left > 0; left -= 5 )); do
  [ -e out/logs/lease.done ] && { echo "the lease's work is done (out/logs/lease.done)"; break; }
  (( (10#$wait_s - left) % 60 != 0 )) || bring_results
  sleep $(( left < 5 ? left : 5 ))
done
date; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
tail -n 20 out/logs/lanes.log 2>/dev/null
for f in out/logs/rl-*.log out/logs/worlds-*.log out/results/*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 2 "$f" | cut -c1-300; }; done
# a job that died says so on a line of its own, not only in a tail that scrolls by (an RL row's
# try that ran out of memory, kept as *.oomN.log when it was resumed, is not named again)
for f in $(grep -l "^Traceback" out/logs/*.log out/results/*.log 2>/dev/null | grep -v "\.oom[0-9]*\.log$"); do
  echo "!! $f: $(grep -E "^[A-Za-z_.]+(Error|Exception)" "$f" | tail -n 1 | cut -c1-200)"; done
[ -n "${OUT:-}" ] || exit 0
bring_results
# KD adapters that bench/worlds_loo.sh PACK=1 left in out/pack, one file each: a 24-layer LoRA r=32 is about
# 15 MiB; a 30-layer one (about 18.6 MiB) is over a call's 16 MiB limit and would not come back.
# The file's name keeps only letters, digits, '.', '_' and '-': a device call leaves out a file named
# otherwise (a DGPO variant's run, worlds-dgpo-lora-all-24l+lr5e5, comes back as ..._lr5e5-adapter.tgz;
# the folder inside keeps its name).
for d in out/pack/*-adapter; do
  name=$(basename "$d")
  [ -d "$d" ] && tar czf "$OUT/${name//[^A-Za-z0-9._-]/_}.tgz" -C out/pack "$name"
done
ls -l "$OUT"
