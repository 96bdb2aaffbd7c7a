"""The rollout copy: the actor's current weights, in bf16, as the plain model the fast engine decodes with.

RL samples its episodes from the policy being trained. Decoding straight from the training
weights means fp32 matmuls (the actor trains in fp32 under autocast) and, for a LoRA actor,
every adapted projection computed as base + B @ A on every step of every token. The copy is a
separate model of the same architecture holding W (+ B @ A * scale, merged) in bf16; the fast
engine's CUDA graphs read its parameters in place, so `sync` copies new values into the same
tensors after every optimizer step and the captured graphs stay valid for the whole run.

What it does not change: the PPO ratio. Old log-probs are recomputed by a forward pass of the
training weights over the finished episodes (train/rl/loop.py `_score`), so the ratio on the first
mini-batch of a step is 1 whatever precision sampled the tokens, up to the kernels' rounding (scoring
and the update batch the rows differently); only which tokens are drawn differs, by bf16 rounding of
the logits.

Under DDP each process holds the whole actor, so `sync` reads the unwrapped module; ZeRO-2
shards optimizer state and gradients but not parameters, so the same holds (ZeRO-3, which
shards parameters, is refused by the RL trainer).
"""

from __future__ import annotations

from typing import Any

from .lora import is_lora, merged_state_dict


def wants_copy(choice: str, accelerator: Any) -> bool:
    """Whether a run decodes through a bf16 copy: `choice` (rollout.weights, eval.weights) is
    bf16_copy, or auto in a bf16 run on a GPU; training (or auto elsewhere) decodes the weights."""
    bf16_gpu = accelerator.mixed_precision == "bf16" and accelerator.device.type == "cuda"
    return choice == "bf16_copy" or (choice == "auto" and bf16_gpu)


def _source_state(lm: Any) -> dict:
    """The actor's weights under plain names (LoRA merged in)."""
    if is_lora(lm):
        return merged_state_dict(lm)
    return {k: v.detach() for k, v in lm.state_dict().items()}


class RolloutCopy:
    """A frozen `dtype` copy of `lm` (LoRA merged); `sync(lm)` refreshes it in place."""

    def __init__(self, lm: Any, dtype: Any = None):
        import copy

        import torch

        dtype = dtype or torch.bfloat16
        device = next(lm.parameters()).device
        with torch.device(device):
            plain = type(lm)(copy.deepcopy(lm.config))   # the class without adapters: a fresh module tree
        # Parameters in `dtype`; buffers (the rotary inverse frequencies) stay as built, in fp32.
        for param in plain.parameters():
            param.data = param.data.to(dtype)
        self.model = plain.eval().requires_grad_(False)
        # state_dict tensors share storage with the parameters: copying into them updates the model
        # without moving a parameter (the engine's captured graphs hold their addresses).
        self._targets = self.model.state_dict(keep_vars=False)
        self.sync(lm)

    def sync(self, lm: Any) -> None:
        """Copy the actor's current weights into the copy (cast to its dtype)."""
        import torch

        source = _source_state(lm)
        missing = sorted(set(self._targets) - set(source))
        if missing:
            raise ValueError(f"the actor has no weights for {missing[:3]} (rollout copy of another architecture?)")
        with torch.no_grad():
            for name, target in self._targets.items():
                target.copy_(source[name])
