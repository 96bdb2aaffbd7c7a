"""Reinforcement learning of a search agent: `train ppo | dgpo | grpo` (docs/rl.md).

config (RLConfig and its loader), math (pure tensor functions: rewards, GAE, the DGPO teacher
term), models (policy head, critic, frozen teacher), batch (rollouts to tensors), deepspeed (two
engines under ZeRO-2), loop (the trainer and `run_rl`, the command's entry point).
"""
