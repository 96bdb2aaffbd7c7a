"""Decoder layers through torch.compile, for the training passes (RL's `ppo.compile`, SFT's and KD's
`model.compile`).

Why: in the RL update most of the GPU time that is not a matrix product is elementwise work
(RMSNorm, SiLU gating, dtype casts around the float32 residual stream under bf16 autocast),
each a separate kernel reading and writing [tokens, hidden] tensors. Inductor fuses them; the
math is the same up to float rounding.

How, and what a first attempt taught (2026-11-28, on an H200: `layer.compile()` on every layer
hit torch._dynamo's recompile limit of 8 inside RL and the step got slower):
- every layer shares one code object, so every guard variant counts against one limit. A layer
  called with a KV cache guards on its integer `layer_idx` (one graph per layer), so calls with
  a cache run eagerly here: they are decoding, not training passes;
- the remaining variants (grad on or off, train or eval mode) are few; the limit is raised so
  they never push a layer back to eager;
- `dynamic=True`: sequence lengths change with every micro-batch.

Compile after every copy of a model is made: a deep copy of a compiled layer keeps calling the
original layer's forward (and its weights). train/rl/loop.py compiles once the critic, the frozen
copies and the rollout copy exist.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

# Keyword names transformers versions give a layer's KV cache (5.17: past_key_values, 5.24: cache).
CACHE_KWARGS = ("past_key_values", "cache", "layer_past")
RECOMPILE_LIMIT = 32


def decoder_layers(model: Any) -> list:
    """The transformer blocks of a model, under any wrapping (DDP, adapters, the critic's body)."""
    if model is None:
        return []
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def compile_decoder_layers(model: Any) -> int:
    """Route every decoder layer's cache-free calls through torch.compile; returns how many layers."""
    layers = decoder_layers(model)
    if layers:
        import torch._dynamo

        config = torch._dynamo.config   # the limit's name before torch 2.7: cache_size_limit
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    for layer in layers:
        if not getattr(layer, "_dgpo_compiled", False):
            layer.forward = _cache_free_compiled(layer.forward)   # an instance attribute: this layer only
            layer._dgpo_compiled = True
    return len(layers)


def compile_models(models: list, knob: str) -> None:
    """compile_decoder_layers on each model (None skipped), with a warning for one that has no decoder
    layer: `knob` (the config key that asked) then changes nothing, and the user should know."""
    for model in models:
        if model is not None and compile_decoder_layers(model) == 0:
            print(f"warning: {knob} found no *DecoderLayer in {type(model).__name__}; it runs eagerly", flush=True)


def _cache_free_compiled(forward: Callable) -> Callable:
    compiled = torch.compile(forward, dynamic=True)

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(name) is not None for name in CACHE_KWARGS):
            return forward(*args, **kwargs)
        return compiled(*args, **kwargs)

    return run
