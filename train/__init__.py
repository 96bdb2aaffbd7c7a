"""GPU training stage (KD, DGPO/PPO/GRPO). Installed as `dgpo_edge.train`; see docs/training.md, docs/rl.md."""
