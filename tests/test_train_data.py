"""Trajectories -> token ids and loss masks (information and feedback tokens never carry loss)."""

from __future__ import annotations

import json

import pytest
from train_helpers import smol_tokenizer_dir, toy_trajectory

from dgpo_edge import protocol
from dgpo_edge.errors import InputError

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_tokenizer_dir(tmp_path_factory))


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _load(path, tok, **kw):
    from dgpo_edge.train.data import load_trajectories

    return load_trajectories(path, tok, **{"max_length": 4096, **kw})


def test_masks_cover_exactly_the_generated_turns(tok, tmp_path):
    row = toy_trajectory("Avalon", "Brightwater")
    row["segments"].insert(1, {"kind": "feedback", "text": protocol.INVALID_ACTION_FEEDBACK})
    (ex,), stats = _load(_write(tmp_path / "t.jsonl", [row]), tok)
    turns = [s["text"] for s in row["segments"] if s["kind"] == "turn"]
    forced = [s["text"] for s in row["segments"] if s["kind"] != "turn"]
    enc = lambda t: tok.encode(t, add_special_tokens=False)
    prompt = protocol.render_prompt(row["question"], tok)
    assert prompt.startswith("<|im_start|>") and "Question: What is the capital of Avalon?" in prompt
    # segment-wise: prompt, turn, feedback, info, turn
    parts = [(enc(prompt), 0), (enc(turns[0]), 1), (enc(forced[0]), 0), (enc(forced[1]), 0), (enc(turns[1]), 1)]
    assert ex.ids == [i for ids, _ in parts for i in ids]
    assert ex.mask == [m for ids, m in parts for _ in ids]
    assert ex.prompt_len == len(enc(prompt))
    assert tok.decode([i for i, m in zip(ex.ids, ex.mask) if m]) == "".join(turns)
    assert "<information>" not in tok.decode([i for i, m in zip(ex.ids, ex.mask) if m])
    assert stats.loss_tokens == sum(ex.mask) and stats.tokens == len(ex.ids)


def test_collate_shifts_the_mask_onto_the_predicting_position(tok, tmp_path):
    from dgpo_edge.train.data import Example, collate

    a = Example("a", [5, 6, 7, 8], [0, 0, 1, 1], 2)
    b = Example("b", [9, 10, 11], [0, 1, 0], 1)
    batch = collate([a, b], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [9, 10, 11, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    # position i predicts token i+1: a's tokens 7, 8 are predicted at 1, 2; b's token 10 at 0
    assert batch["target_mask"].tolist() == [[0, 1, 1, 0], [1, 0, 0, 0]]


def test_sampled_token_ids_are_kept_and_chat_template_is_optional(tok, tmp_path):
    row = toy_trajectory("Borduria", "Szohod")
    text = row["segments"][0]["text"]
    canonical = tok.encode(text, add_special_tokens=False)
    # the same text in other ids, as a sampler may produce: one multi-character token spelled out
    k = next(i for i, t in enumerate(canonical) if len(tok.decode([t])) >= 2)
    spelled = [j for ch in tok.decode([canonical[k]]) for j in tok.encode(ch, add_special_tokens=False)]
    sampled = canonical[:k] + spelled + canonical[k + 1:]
    assert sampled != canonical and tok.decode(sampled) == text
    row["segments"][0]["token_ids"] = sampled
    row["segments"].insert(0, {"kind": "prompt", "text": "ignored: re-rendered for this tokenizer"})
    (ex,), _ = _load(_write(tmp_path / "t.jsonl", [row]), tok, chat_template=False)
    plain = protocol.render_prompt(row["question"], None)
    n = len(tok.encode(plain, add_special_tokens=False))
    assert ex.prompt_len == n and ex.ids[n:n + len(sampled)] == sampled


def test_token_ids_from_another_tokenizer_are_replaced(tok, tmp_path):
    row = toy_trajectory("Carpania", "Lutz")
    row["segments"][0]["token_ids"] = [1, 2, 3]  # decodes to something else
    (ex,), _ = _load(_write(tmp_path / "t.jsonl", [row]), tok, chat_template=False)
    n = len(tok.encode(protocol.render_prompt(row["question"], None), add_special_tokens=False))
    turn = tok.encode(row["segments"][0]["text"], add_special_tokens=False)
    assert ex.ids[n:n + len(turn)] == turn


def test_only_correct_max_length_and_limit(tok, tmp_path):
    rows = [toy_trajectory("Avalon", "Brightwater"), toy_trajectory("Dalmia", "Orsk", answer="Paris"),
            toy_trajectory("Genovia", "Pyrus")]
    path = _write(tmp_path / "t.jsonl", rows)
    examples, stats = _load(path, tok)
    assert [e.id for e in examples] == ["toy-Avalon", "toy-Genovia"] and stats.wrong_answer == 1
    assert len(_load(path, tok, only_correct=False)[0]) == 3
    assert len(_load(path, tok, limit=1)[0]) == 1
    n = len(examples[0].ids)
    with pytest.raises(InputError, match="no usable trajectories.*longer than max_length"):
        _load(path, tok, max_length=n - 1)


@pytest.mark.parametrize("bad, needle", [
    ('{"question": "q", "segments": []}', "segments"),
    ('{"segments": [{"kind": "turn", "text": "x"}]}', "question"),
    ('{"question": "q", "segments": [{"kind": "answer", "text": "x"}]}', "segment 0"),
    ('{"question": "q", "golden_answers": 3, "segments": [{"kind": "turn", "text": "x"}]}', "golden_answers"),
    ('{"question": "q", "segments"', "malformed JSON"),
])
def test_bad_rows_name_file_and_line(tok, tmp_path, bad, needle):
    path = _write(tmp_path / "t.jsonl", [toy_trajectory("Avalon", "Brightwater"), bad])
    with pytest.raises(InputError) as info:
        _load(path, tok)
    assert info.value.line == 2 and info.value.path == str(path) and needle in str(info.value)


def test_batch_order_is_seeded_per_epoch():
    from dgpo_edge.train.data import batch_order

    a = batch_order(10, 3, epoch=0, seed=1)
    assert a == batch_order(10, 3, epoch=0, seed=1)
    assert a != batch_order(10, 3, epoch=1, seed=1)
    assert len(a) == 3 and all(len(b) == 3 for b in a)  # the ragged tail is dropped
    assert len({i for b in a for i in b}) == 9
