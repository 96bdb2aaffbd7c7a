#!/usr/bin/env bash
# Table 1 from the 24-layer KD student (docs/benchmarks.md, "Table 1 from the 24-layer KD student" and
# the sections after it): every lease's rows, named by method and seed, with the paired intervals,
# written to bench/results/factbook_table1_24l.json (OUT= to write elsewhere) and printed as markdown.
#   bench/table1_24l.sh
# Each lease's rows file is labelled (rlt/, abl/) so that its runs join the table only by name:
#   2a0234c  PPO, DGPO (SFT teacher), PPO on the teacher: 4 x H200, 2026-11-28
#   193732f  PPO on the teacher again, DGPO from it (rlt/): 2 x H200, 2026-11-29
#   b22c911  the teacher again, DGPO with the teacher term on every rollout, KD with reverse KL and
#            SeqKD (abl/): 1 x H200, 2026-11-29
#   1be926d  the teacher again, the sft row (kd_sft), KD with forward KL and GKD-JSD in the FactbookQA
#            recipe, GRPO to 50 steps, DGPO seed 1 again (to 176 steps: its third seed at 150) (fill/):
#            1 x H200, 2026-11-29
#   b854d46  GRPO seeds 1 and 2 to 50 steps, DGPO without cold start (seed 0; to 150 steps, test EM at 50
#            and 100), DGPO seed 1 again (to 113 steps) beside a teacher trained again (nc/): 1 x H200, 2026-11-29
#   4c6714e  DGPO with the teacher term on every rollout, seeds 1 and 2, and DGPO seed 1 again, to 100 steps
#            (the deadline stopped them at 128-135), beside a teacher trained again (ab2/): 2 x H200, 2026-11-29
#   245528f  DGPO without cold start, seeds 1 and 2 (to 113 and 111 steps: test EM at 50 and 100), beside a
#            teacher trained again (nc2/): 1 x H200, 2026-12-02
# PYTHON (.venv/bin/python when there is one, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
r=bench/results
"$py" bench/table1.py $r/factbook_rows_2a0234c.jsonl rlt=$r/factbook_rows_193732f.jsonl abl=$r/factbook_rows_b22c911.jsonl \
  fill=$r/factbook_rows_1be926d.jsonl nc=$r/factbook_rows_b854d46.jsonl ab2=$r/factbook_rows_4c6714e.jsonl \
  nc2=$r/factbook_rows_245528f.jsonl \
  --rl-step 200 --as base=base --as kd=kd --as teacher=teacher \
  --as rl100-teacher_ppo-s0=teacher_ppo --as rl200-teacher_ppo-s0=teacher_ppo_200steps \
  --as rl100-dgpo-s0=dgpo_100steps@0 --as rl100-dgpo-s1=dgpo_100steps@1 --as rl100-dgpo-s2=dgpo_100steps@2 \
  --as rl100-ppo-s0=ppo_100steps@0 --as rl100-ppo-s1=ppo_100steps@1 --as rl100-ppo-s2=ppo_100steps@2 \
  --as rl150-dgpo-s0=dgpo_150steps@0 --as rl150-dgpo-s2=dgpo_150steps@2 \
  --as rl150-ppo-s0=ppo_150steps@0 --as rl150-ppo-s1=ppo_150steps@1 --as rl150-ppo-s2=ppo_150steps@2 \
  --as rlt/rl100-teacher_ppo-t100-s0=teacher_ppo_rerun \
  --as rlt/rl100-dgpo-rlt-s0=dgpo_ppo_teacher_100steps@0 --as rlt/rl100-dgpo-rlt-s1=dgpo_ppo_teacher_100steps@1 \
  --as rlt/rl150-dgpo-rlt-s0=dgpo_ppo_teacher_150steps@0 --as rlt/rl150-dgpo-rlt-s1=dgpo_ppo_teacher_150steps@1 \
  --as abl/teacher=teacher_b22c911 --as abl/rl200-dgpo_all_rollouts-s0=dgpo_all_rollouts@0 \
  --as abl/rl100-dgpo_all_rollouts-s0=dgpo_all_rollouts_100steps@0 \
  --as abl/rl150-dgpo_all_rollouts-s0=dgpo_all_rollouts_150steps@0 \
  --as abl/kd-reverse_kl-s0-step525=kd_reverse_kl --as abl/kd-seqkd-s0-step498=kd_seqkd \
  --as fill/teacher=teacher_1be926d --as fill/kd-sft-s0-step525=sft \
  --as fill/kd-forward_kl-s0-step525=kd_forward_kl --as fill/kd-jsd-s0-step525=kd_jsd \
  --as fill/rl50-grpo-g50-s0=grpo@0 --as fill/rl150-dgpo-s1=dgpo_150steps@1 \
  --as fill/rl100-dgpo-s1=dgpo_rerun_100steps@1 \
  --as nc/rl50-grpo-g50-s1=grpo@1 --as nc/rl50-grpo-g50-s2=grpo@2 \
  --as nc/rl50-dgpo_no_cold_start-s0=dgpo_no_cold_start_50steps@0 \
  --as nc/rl100-dgpo_no_cold_start-s0=dgpo_no_cold_start_100steps@0 \
  --as nc/rl50-dgpo-s1=dgpo_rerun2_50steps@1 --as nc/rl100-dgpo-s1=dgpo_rerun2_100steps@1 \
  --as ab2/rl100-dgpo_all_rollouts-s1=dgpo_all_rollouts_100steps@1 \
  --as ab2/rl100-dgpo_all_rollouts-s2=dgpo_all_rollouts_100steps@2 --as ab2/rl100-dgpo-s1=dgpo_rerun3_100steps@1 \
  --as nc2/rl50-dgpo_no_cold_start-s1=dgpo_no_cold_start_50steps@1 \
  --as nc2/rl50-dgpo_no_cold_start-s2=dgpo_no_cold_start_50steps@2 \
  --as nc2/rl100-dgpo_no_cold_start-s1=dgpo_no_cold_start_100steps@1 \
  --as nc2/rl100-dgpo_no_cold_start-s2=dgpo_no_cold_start_100steps@2 \
  --pair dgpo:ppo --pair dgpo:kd --pair ppo:kd --pair dgpo:teacher --pair dgpo:teacher_ppo --pair teacher_ppo:teacher \
  --pair ppo:teacher --pair dgpo_100steps:ppo_100steps --pair dgpo_100steps:kd --pair ppo_100steps:kd \
  --pair dgpo_ppo_teacher_100steps:ppo_100steps --pair dgpo_ppo_teacher_100steps:kd \
  --pair dgpo_ppo_teacher_100steps:dgpo_100steps --pair dgpo_ppo_teacher_150steps:ppo_150steps \
  --pair dgpo_ppo_teacher_150steps:kd --pair dgpo_ppo_teacher_150steps:dgpo_150steps \
  --pair dgpo_ppo_teacher_100steps:teacher_ppo_rerun --pair teacher_ppo_rerun:teacher \
  --pair dgpo_all_rollouts:dgpo --pair dgpo_all_rollouts:ppo --pair dgpo_all_rollouts:kd \
  --pair dgpo_all_rollouts:teacher_b22c911 --pair dgpo_all_rollouts_100steps:dgpo_100steps \
  --pair dgpo_all_rollouts_150steps:dgpo_150steps --pair kd_seqkd:kd --pair kd_reverse_kl:kd \
  --pair kd_seqkd:teacher_b22c911 --pair teacher_b22c911:teacher \
  --pair dgpo_150steps:ppo_150steps --pair dgpo_150steps:kd --pair ppo_150steps:kd --pair sft:kd --pair kd_forward_kl:kd --pair kd_seqkd:kd_forward_kl \
  --pair sft:kd_forward_kl --pair sft:teacher_1be926d --pair kd_forward_kl:teacher_1be926d \
  --pair grpo:ppo --pair grpo:dgpo --pair grpo:kd --pair grpo:dgpo_all_rollouts \
  --pair dgpo_rerun_100steps:dgpo_100steps --pair teacher_1be926d:teacher \
  --pair dgpo_no_cold_start_100steps:kd --pair dgpo_rerun2_100steps:dgpo_rerun_100steps \
  --pair dgpo_rerun2_100steps:dgpo_100steps --pair grpo:ppo_150steps --pair grpo:dgpo_150steps \
  --pair dgpo_all_rollouts_100steps:ppo_100steps --pair dgpo_all_rollouts_100steps:kd \
  --pair dgpo_rerun3_100steps:dgpo_rerun2_100steps --pair grpo:dgpo_all_rollouts_100steps \
  --pair dgpo_all_rollouts_100steps:dgpo_rerun3_100steps \
  --per-seed --out "${OUT:-$r/factbook_table1_24l.json}"
