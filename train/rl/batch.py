"""A step's rollouts as tensors, and the per-step choices that must survive a resume.

`pack` turns `Rollout`s into right-padded [B, L] tensors. `step_prompts`
picks the questions of a step and `step_seed` the seeds of its sampling and
shuffling: pure functions of (seed, step, rank), so a run restarted from a
checkpoint draws exactly what an uninterrupted run would have drawn.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data import batch_order
from ..rollout import Rollout


@dataclass
class StepBatch:
    """One process's rollouts of a step, padded on the right."""

    input_ids: torch.Tensor       # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor            # [B, L] float, 1 on generated tokens
    sample_logp: torch.Tensor     # [B, L] log-probs the rollout engine sampled with
    scores: torch.Tensor          # [B] exact match of the final answer
    groups: torch.Tensor          # [B] question index (GRPO's groups)
    multiple: int = 1             # widths are rounded up to a multiple of this (ppo.pad_to_multiple)

    def rows(self, index: torch.Tensor) -> StepBatch:
        """The sub-batch of rows `index`, cut to its own longest row (rounded up to `multiple`)."""
        width = cut_width(self.attention_mask, index, self.multiple)
        cut = lambda t: t[index, :width]  # noqa: E731
        return StepBatch(cut(self.input_ids), cut(self.attention_mask), cut(self.mask), cut(self.sample_logp),
                         self.scores[index], self.groups[index], self.multiple)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def cut_width(attention_mask: torch.Tensor, index: torch.Tensor, multiple: int = 1) -> int:
    """Columns `StepBatch.rows` keeps for the rows `index`: one past the longest row (the terminal
    position of critic.value_mask=reference), rounded up to `multiple`, within the batch's width."""
    return min(round_up(int(attention_mask[index].sum(1).max()) + 1, multiple), attention_mask.shape[1])


def by_length(index: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`index` reordered shortest row first, so micro-batches cut from it hold rows of similar
    length and `StepBatch.rows` trims each to little padding (the rows' results do not depend on
    which micro-batch computes them; only the compute on padding changes)."""
    lengths = attention_mask[index].sum(1)
    return index[torch.argsort(lengths, stable=True)]


def computed_positions(index: torch.Tensor, attention_mask: torch.Tensor, size: int) -> int:
    """Positions a pass over micro-batches of `size` rows of `index`, each cut to its longest row
    (plus the one terminal column `StepBatch.rows` keeps), computes: the cost bucketing lowers."""
    return sum(len(part) * cut_width(attention_mask, part) for part in index.split(size))


def pack(rollouts: Sequence[Rollout], groups: Sequence[int], pad_id: int, device: Any,
         multiple: int = 1) -> StepBatch:
    """Right-padded tensors of `rollouts` (the first token of every row is a prompt token).

    Every row, the longest too, is followed by at least one padding column: the
    critic's value there is that of the terminal state (math.shifted_response_mask).
    The width is rounded up to `multiple` (padding columns, masked out everywhere).
    """
    if not rollouts:
        raise ValueError("no rollouts to pack")
    for r in rollouts:   # the fields are flattened together below: a short one would shift the rows after it
        if not len(r.token_ids) == len(r.loss_mask) == len(r.logprobs):
            raise ValueError(f"a rollout has {len(r.token_ids)} ids, {len(r.loss_mask)} mask values and "
                             f"{len(r.logprobs)} log-probs")
    lengths = torch.tensor([len(r.token_ids) for r in rollouts])
    width = round_up(int(lengths.max()) + 1, multiple)
    b = len(rollouts)
    attn = (torch.arange(width)[None, :] < lengths[:, None]).long()
    real = attn.bool()   # row-major: the positions of row 0, then row 1, ... as flattened below
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.float32)
    logp = torch.zeros((b, width), dtype=torch.float32)
    total = int(lengths.sum())
    ids[real] = _flat(rollouts, "token_ids", np.int64, total)
    mask[real] = _flat(rollouts, "loss_mask", np.float32, total)
    logp[real] = _flat(rollouts, "logprobs", np.float32, total)
    if bool(mask[:, 0].any()):
        raise ValueError("a rollout starts with a generated token; episodes must start with the prompt")
    scores = torch.tensor([r.score for r in rollouts], dtype=torch.float32)
    return StepBatch(ids.to(device), attn.to(device), mask.to(device), logp.to(device), scores.to(device),
                     torch.tensor(list(groups), dtype=torch.long, device=device), multiple)


def _flat(rollouts: Sequence[Rollout], field: str, dtype: Any, count: int) -> torch.Tensor:
    """One field of every rollout, concatenated (`count` values in all), as a tensor. numpy reads
    Python numbers several times faster than torch.tensor does (a paper-shape step packs 3 x 1.4 M)."""
    values = itertools.chain.from_iterable(getattr(r, field) for r in rollouts)
    return torch.from_numpy(np.fromiter(values, dtype=dtype, count=count))


def step_seed(seed: int, step: int, *parts: int) -> int:
    """A seed for one use within a step (rank, epoch, ...), distinct for every combination."""
    value = seed * 1_000_003 + step
    for p in parts:
        value = value * 10_007 + p + 1
    return value % (2**63 - 1)


def step_prompts(n_questions: int, per_step: int, step: int, seed: int, rank: int, world: int) -> list[int]:
    """Indices of the questions this process plays at `step`: the step's slice of a per-epoch
    permutation, split evenly across processes."""
    per_epoch = batch_order(n_questions, per_step, 0, seed)
    steps_per_epoch = len(per_epoch)
    epoch, index = divmod(step, steps_per_epoch)
    rows = batch_order(n_questions, per_step, epoch, seed)[index] if epoch else per_epoch[index]
    share = len(rows) // world
    return rows[rank * share:(rank + 1) * share]
