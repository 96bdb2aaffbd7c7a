#!/usr/bin/env bash
# On the GPU machine: calls that bring back a student that `bench/factbook_rows.sh pack` (also
# bench/factbook_lanes.sh PACK=RUN and bench/worlds_loo.sh PACK=1) left in out/pack as 15 MiB pieces.
# A call returns at most 8 files, so a 24-layer Q8_0 student (about 8 pieces and its .sha256) takes two.
#   bash bench/lease/bring.sh NAME        # the calls NAME needs, and the files of each
#   bash bench/lease/bring.sh NAME K      # call K of them (1, 2, ...): its files copied into $OUT
# NAME is what pack named it (the run, e.g. rl-dgpo-s0, or RUN-CHECKPOINT for a checkpoint folder);
# QUANT (q8_0) as given to pack. Here, with every call's files gathered in one folder DIR:
#   bench/factbook_rows.sh unpack DIR NAME    # joins the pieces and checks the sha256
set -euo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: bench/lease/bring.sh NAME [K]}
file=$name.${QUANT:-q8_0}.gguf
per_call=8
files=()
[ -f "out/pack/$file.sha256" ] && files+=("$file.sha256")
while IFS= read -r piece; do files+=("$piece"); done < <(cd out/pack 2>/dev/null && ls "$file".part* 2>/dev/null | sort)
if [ ${#files[@]} -lt 2 ]; then
  echo "error: out/pack holds no pieces of $file (bench/factbook_rows.sh pack $name)" >&2; exit 2
fi
calls=$(( (${#files[@]} + per_call - 1) / per_call ))
if [ -z "${2:-}" ]; then
  for (( k = 1; k <= calls; k++ )); do echo "call $k of $calls: ${files[*]:$(( (k - 1) * per_call )):$per_call}"; done
  exit 0
fi
k=$2
[[ $k =~ ^[0-9]+$ ]] && k=$(( 10#$k )) && (( k >= 1 && k <= calls )) \
  || { echo "error: K must be 1 to $calls for $file" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "error: OUT is not set (the folder a device call returns)" >&2; exit 2; }
for f in "${files[@]:$(( (k - 1) * per_call )):$per_call}"; do cp "out/pack/$f" "$OUT/"; done
ls -l "$OUT"
