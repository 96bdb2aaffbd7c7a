"""`dgpo-edge train ...`: the GPU training stage (SFT, cold-start KD, teacher trajectories, RL).

Each command takes `--config YAML` plus `key=value` overrides of dotted keys
(`optim.lr=2e-5 run.out_dir=out/runs/x`). Multi-GPU: start the same command
under `accelerate launch` (see docs/training.md). torch, transformers and
accelerate are imported only when a command runs.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import typer

from .common import console, needs_extra, stopped_by_ctrl_c, user_errors
from .train_tgo import tgo_command

app = typer.Typer(help="Train a search agent: SFT, cold-start KD, teacher trajectories, PPO/DGPO/GRPO "
                       "(needs the train extra).",
                  no_args_is_help=True)

TRAIN_MODULES = ("torch", "transformers", "accelerate", "yaml")
CONFIG = typer.Option(..., "--config", "-c", help="YAML config (see train/configs/).")
OVERRIDES = typer.Argument(None, metavar="[KEY=VALUE]...", help="Override config keys, e.g. optim.lr=2e-5.")


@app.command("sft")
@needs_extra("train", *TRAIN_MODULES)
@user_errors
def sft(config: Path = CONFIG, overrides: list[str] = OVERRIDES) -> None:
    """Supervised training on trajectories (oracle -> a teacher; teacher trajectories -> SeqKD)."""
    from ..train.config import SFTConfig, load_config
    from ..train.sft import run_sft

    cfg = load_config(SFTConfig, config, overrides or [])
    with _saved_on_interrupt(cfg):
        summary = run_sft(cfg)
    _report(summary, cfg.run.out_dir)


@app.command("kd")
@needs_extra("train", *TRAIN_MODULES)
@user_errors
def kd(config: Path = CONFIG, overrides: list[str] = OVERRIDES) -> None:
    """Cold-start distillation: forward/reverse KL, generalized JSD (GKD) or SeqKD from a teacher."""
    from ..train.config import KDConfig, load_config
    from ..train.kd import run_kd

    cfg = load_config(KDConfig, config, overrides or [])
    with _saved_on_interrupt(cfg):
        summary = run_kd(cfg)
    _report(summary, cfg.run.out_dir)


def _rl(algorithm: str, config: Path, overrides: list[str] | None) -> None:
    from ..train.models import quiet_transformers
    from ..train.rl.loop import run_rl
    from ..train.rl.config import load_rl_config

    quiet_transformers()

    cfg = load_rl_config(algorithm, config, overrides or [])
    with _saved_on_interrupt(cfg):
        summary = run_rl(cfg)
    if os.environ.get("RANK", "0") != "0":
        return
    best = "" if summary["best"] is None else \
        f"; best {summary['best_metric']} {summary['best']:.4f} at step {summary['best_step']}"
    stopped = f"; stopped: {summary['stopped']}" if summary["stopped"] else ""
    console.print(f"{algorithm}: {summary['steps']} steps, {summary['rollouts']:,} rollouts in "
                  f"{summary['elapsed_s']:.1f} s (peak {summary['peak_mem_gb']:.2f} GB){best}{stopped}; "
                  f"metrics in {cfg.run.out_dir}/metrics.csv", highlight=False)


@app.command("ppo")
@needs_extra("train", *TRAIN_MODULES)
@user_errors
def ppo(config: Path = CONFIG, overrides: list[str] = OVERRIDES) -> None:
    """PPO with a critic and GAE on multi-turn search rollouts (reward: exact match)."""
    _rl("ppo", config, overrides)


@app.command("dgpo")
@needs_extra("train", *TRAIN_MODULES)
@user_errors
def dgpo(config: Path = CONFIG, overrides: list[str] = OVERRIDES) -> None:
    """DGPO: PPO where failed rollouts are pulled toward a teacher (beta * KL on their tokens)."""
    _rl("dgpo", config, overrides)


@app.command("grpo")
@needs_extra("train", *TRAIN_MODULES)
@user_errors
def grpo(config: Path = CONFIG, overrides: list[str] = OVERRIDES) -> None:
    """GRPO: group-normalised advantages over several samples per question, no critic (teacher optional)."""
    _rl("grpo", config, overrides)


def _saved_on_interrupt(cfg) -> contextlib.AbstractContextManager[None]:
    """Ctrl-C (`stopped_by_ctrl_c`); outside the training loop the line says what checkpoints/last holds."""
    from ..train.plumbing import last_holds

    return stopped_by_ctrl_c(lambda: last_holds(Path(cfg.run.out_dir) / "checkpoints" / "last", cfg.run.resume))


def _report(summary: dict, out_dir: str) -> None:
    if os.environ.get("RANK", "0") != "0":  # one line per run, not per process
        return
    best = "" if summary["best"] is None else \
        f"; best {summary['best_metric']} {summary['best']:.4f} at step {summary['best_step']}"
    console.print(f"trained {summary['steps']} steps in {summary['elapsed_s']:.1f} s "
                  f"({summary['tokens_per_s']:,.0f} tokens/s, peak {summary['peak_mem_gb']:.2f} GB){best}; "
                  f"checkpoints in {out_dir}/checkpoints/", highlight=False)


# `train tgo` (teacher-generated trajectories) lives in its own module.
app.command("tgo")(tgo_command)
