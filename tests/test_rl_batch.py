"""train/rl/batch.py: micro-batches by length compute less padding and the same values."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
from dgpo_edge.train.rl.batch import StepBatch, by_length, computed_positions, cut_width  # noqa: E402


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


def test_rounded_widths_are_multiples_within_the_batch():
    # ppo.pad_to_multiple: a micro-batch keeps its longest row + 1 columns rounded up to the multiple,
    # never more than the batch holds, and its own sub-batches round the same way.
    batch = _batch([5, 11, 4, 30])                               # width 31
    batch.multiple = 8
    assert cut_width(batch.attention_mask, torch.tensor([0, 2]), 8) == 8     # 6 -> 8
    assert cut_width(batch.attention_mask, torch.tensor([1]), 8) == 16       # 12 -> 16
    assert cut_width(batch.attention_mask, torch.tensor([3]), 8) == 31       # 32, cut to the batch
    assert cut_width(batch.attention_mask, torch.tensor([1]), 1) == 12
    sub = batch.rows(torch.tensor([0, 1]))
    assert sub.input_ids.shape == (2, 16) and sub.multiple == 8
    assert torch.equal(sub.attention_mask[:, 12:], torch.zeros(2, 4, dtype=torch.long))


def test_pack_rounds_the_width_up_and_pads_with_masked_columns():
    from dgpo_edge.train.rl.batch import pack

    class R:  # the fields pack reads from a Rollout
        def __init__(self, n):
            self.token_ids, self.loss_mask, self.logprobs, self.score = [1] * n, [0] + [1] * (n - 1), [0.0] * n, 1.0

    plain, rounded = pack([R(5), R(9)], [0, 1], 0, "cpu"), pack([R(5), R(9)], [0, 1], 0, "cpu", multiple=8)
    assert plain.input_ids.shape == (2, 10) and rounded.input_ids.shape == (2, 16) and rounded.multiple == 8
    assert torch.equal(rounded.attention_mask[:, :10], plain.attention_mask)
    assert int(rounded.attention_mask[:, 10:].sum()) == 0 and int(rounded.mask[:, 10:].sum()) == 0


def test_pack_places_every_field_of_every_row_and_refuses_ragged_rollouts():
    """pack flattens each field of all rollouts into one array and scatters it into the padded
    tensors: every row gets its own values, whatever the lengths; fields of unequal length refuse."""
    import random

    from dgpo_edge.train.rl.batch import pack

    class R:  # the fields pack reads from a Rollout
        def __init__(self, ids, mask, logprobs, score=0.0):
            self.token_ids, self.loss_mask, self.logprobs, self.score = ids, mask, logprobs, score

    rng = random.Random(0)
    rows = []
    for n in (7, 1, 12, 3, 12, 5):
        rows.append(R([rng.randrange(1000) for _ in range(n)], [0] + [rng.choice([0, 1]) for _ in range(n - 1)],
                      [-rng.random() for _ in range(n)], float(n % 2)))
    batch = pack(rows, list(range(len(rows))), pad_id=-7, device="cpu", multiple=4)
    assert batch.input_ids.shape == (6, 16)
    for i, r in enumerate(rows):
        n = len(r.token_ids)
        assert batch.input_ids[i, :n].tolist() == r.token_ids and batch.input_ids[i, n:].eq(-7).all()
        assert batch.attention_mask[i].tolist() == [1] * n + [0] * (16 - n)
        assert batch.mask[i, :n].tolist() == r.loss_mask and not batch.mask[i, n:].any()
        torch.testing.assert_close(batch.sample_logp[i, :n], torch.tensor(r.logprobs, dtype=torch.float32))
    assert batch.scores.tolist() == [r.score for r in rows]
    with pytest.raises(ValueError, match="no rollouts"):
        pack([], [], 0, "cpu")
    rows[2].logprobs = rows[2].logprobs[:-1]
    with pytest.raises(ValueError, match="12 ids, 12 mask values and 11 log-probs"):
        pack(rows, list(range(len(rows))), 0, "cpu")
