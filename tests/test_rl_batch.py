"""train/rl/batch.py: micro-batches by length compute less padding and the same values."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
from dgpo_edge.train.rl.batch import StepBatch, by_length, computed_positions  # noqa: E402


def _batch(lengths: list[int]) -> StepBatch:
    b, width = len(lengths), max(lengths) + 1
    attn = torch.zeros((b, width), dtype=torch.long)
    for i, n in enumerate(lengths):
        attn[i, :n] = 1
    ids = torch.arange(b * width).view(b, width) % 97 * attn
    mask = attn.float()
    mask[:, :3] = 0   # a prompt of 3 tokens
    zeros = torch.zeros(b)
    return StepBatch(ids, attn, mask, torch.zeros_like(mask), zeros, zeros.long())


def test_by_length_orders_shortest_first_and_keeps_every_row():
    batch = _batch([9, 3, 7, 3, 12])
    index = torch.tensor([4, 0, 1, 2, 3])
    order = by_length(index, batch.attention_mask)
    assert order.tolist() == [1, 3, 2, 0, 4]   # ties keep their order (stable)
    assert sorted(order.tolist()) == sorted(index.tolist())


def test_bucketing_cuts_the_positions_computed_on_a_mixed_step():
    # Lengths like a FactbookQA step: short direct answers and long two-search episodes, interleaved.
    lengths = [120, 480, 130, 470, 125, 500, 140, 460] * 4
    batch = _batch(lengths)
    rows = torch.arange(len(lengths))
    plain = computed_positions(rows, batch.attention_mask, size=8)
    bucketed = computed_positions(by_length(rows, batch.attention_mask), batch.attention_mask, size=8)
    assert bucketed < 0.7 * plain
    assert bucketed >= sum(lengths)


def test_a_function_of_rows_gives_the_same_values_in_any_micro_batch_order():
    # What _forward_all relies on: each row's result lands in its own row whichever rows it is cut with.
    batch = _batch([5, 11, 4, 9, 7, 3])
    rows = torch.arange(6)

    def run(order: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(batch.mask)
        for i in range(0, 6, 2):
            index = order[i:i + 2]
            sub = batch.rows(index)
            out[index, :sub.input_ids.shape[1]] = sub.input_ids.float().cumsum(-1) * sub.mask
        return out

    assert torch.equal(run(rows), run(by_length(rows, batch.attention_mask)))
