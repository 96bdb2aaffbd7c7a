"""The attention mask (and no KV cache) a causal model is given in training passes.

Training batches here are padded on the right (train/data.py `collate`, train/rl/batch.py `pack`).
Under causal attention a real token never sees the padding after it, so such a batch needs no mask:
without one, PyTorch runs its fused causal attention kernel; with one, transformers materialises a
[batch, 1, length, length] mask and attention takes a masked kernel (cuDNN's on an H200), which was
58% of an RL update micro-batch's GPU time at 4,096 tokens (docs/benchmarks.md, "The update,
profiled and trimmed"). Positions are the same either way (they count from 0 in every row), so the
outputs at real positions are the same up to the kernels' rounding; only the padding positions'
outputs, which no loss reads, change.
"""

from __future__ import annotations

import torch


def model_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The attention mask to give a causal model: None when every row is padded on the right only
    (ones, then zeros), since causal attention then gives each real token exactly its row's real
    tokens before it; the mask itself otherwise (left padding, holes)."""
    right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
    return None if right_padded else attention_mask


def last_hidden(body, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A transformer body's last hidden states [B, L, H] in a training or scoring pass.

    use_cache=False: transformers otherwise fills a KV cache on every forward, which no such pass
    reads, and a layer called with a cache cannot go through torch.compile (train/compiled_layers.py).
    """
    return body(input_ids=input_ids, attention_mask=model_mask(attention_mask), use_cache=False).last_hidden_state


def lm_logits(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A causal LM's logits [B, L, V] in a training or scoring pass: `last_hidden`'s mask and no KV cache."""
    return lm(input_ids=input_ids, attention_mask=model_mask(attention_mask), use_cache=False).logits
