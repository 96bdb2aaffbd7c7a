"""`train ppo|dgpo|grpo` under DeepSpeed ZeRO-2: the actor and the critic as two DeepSpeed engines.

accelerate lets one Accelerator hold only one DeepSpeed model, so each engine gets its own
Accelerator: the first is built with one DeepSpeedPlugin per model (separate objects, both
from the launch's DeepSpeed config), the second shares that state, and each prepares its model
while its plugin is the selected one. Each Accelerator then saves and loads only its own engine
(checkpoints/last/state/actor, state/critic).

A mini-batch is several micro-batches whose losses are already weighted by their token share,
so the engine must neither step after every backward (as `Accelerator.backward` does under
DeepSpeed) nor divide by its accumulation count: the loop marks the last micro-batch as the
accumulation boundary itself and steps once (DeepSpeed clips to `gradient_clipping` there).

ZeRO-3 is refused: the rollout engine reads the actor's whole weights in place, and ZeRO-3
holds shards. Under ZeRO-2 every rank keeps whole weights (with bf16 on, DeepSpeed trains them
in bf16).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from dgpo_edge.errors import InputError


def deepspeed_launch() -> bool:
    """Whether `accelerate launch` set this run up for DeepSpeed."""
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def make_rl_accelerators(config: Any) -> tuple[Any, Any]:
    """(actor's Accelerator, critic's): the same one outside DeepSpeed; under DeepSpeed one each
    (the critic's is None without a critic), after refusing any stage but ZeRO-2 before any model loads."""
    from accelerate.utils import DeepSpeedPlugin

    from ..plumbing import make_accelerator

    if not deepspeed_launch():
        acc = make_accelerator(config)
        return acc, acc
    names = ("actor", "critic") if config.uses_critic else ("actor",)
    plugins = {name: DeepSpeedPlugin() for name in names}   # each reads the launch's config anew
    stage = int(plugins["actor"].zero_stage)
    if stage != 2:
        raise InputError(f"train {config.algorithm} supports DeepSpeed ZeRO-2 only, not ZeRO-{stage}: the rollout "
                         "engine reads the actor's whole weights in place; launch with "
                         "train/configs/accelerate-zero2.yaml (or DDP: accelerate-ddp.yaml)")
    accumulate = micro_batches(config, int(os.environ.get("WORLD_SIZE", "1")))[1]
    actor = make_accelerator(config, deepspeed_plugins=plugins, accumulate=accumulate)
    critic = make_accelerator(config, accumulate=accumulate) if config.uses_critic else None
    return actor, critic


def micro_batches(config: Any, world: int) -> tuple[int, int]:
    """(rows per micro-batch, micro-batches per mini-batch) on one process, as the update loop cuts them."""
    per_mini = max(1, config.ppo.mini_batch // world)   # _check_sizes refuses a remainder
    micro = min(config.ppo.micro_batch, per_mini)
    return micro, -(-per_mini // micro)


def prepare(acc: Any, name: str, model: Any, optimizer: Any, config: Any) -> tuple[Any, Any]:
    """`acc.prepare(model, optimizer)` under plugin `name`, its "auto" batch settings filled first."""
    from ..plumbing import fill_deepspeed_autos

    world = acc.num_processes
    micro, accumulate = micro_batches(config, world)
    acc.state.select_deepspeed_plugin(name)
    sizes = SimpleNamespace(batch_size=micro, grad_accum=accumulate, grad_clip=config.optim.grad_clip)
    fill_deepspeed_autos(acc, sizes, world)
    return acc.prepare(model, optimizer)


def backward(engine: Any, loss: Any, last: bool) -> None:
    """Accumulate one micro-batch's (already token-share weighted) loss; `last` ends the mini-batch,
    where the engine reduces the gradients over processes."""
    engine.set_gradient_accumulation_boundary(last)
    engine.backward(loss, scale_wrt_gas=False)


def step(engine: Any) -> float:
    """Clip (DeepSpeed's gradient_clipping), optimizer step, zero the gradients; returns the global
    gradient norm before clipping."""
    engine.step()
    norm = engine.get_global_grad_norm()
    return float("nan") if norm is None else float(norm.item() if hasattr(norm, "item") else norm)
