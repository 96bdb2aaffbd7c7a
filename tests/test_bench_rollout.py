"""bench/rollout.py's multi-turn row (`--turns`) on CPU with a tiny model: the shape of an RL
rollout at the paper's shape, a growing prefix and a fresh decode call each turn."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_rollout_support as support  # noqa: E402
from test_rollout_support import tiny_model  # noqa: E402

from dgpo_edge import protocol  # noqa: E402


@pytest.fixture(scope="module")
def bench(bench_script):
    return bench_script("rollout")


@pytest.fixture(scope="module")
def smol_tok(request, tmp_path_factory):
    return support.smol_tok_fixture(request, tmp_path_factory)


def test_turns_grow_the_prefix_by_each_turns_tokens_and_the_feedback(bench, smol_tok):
    model = tiny_model("llama", len(smol_tok), seed=5)
    prefixes = bench.prompts(smol_tok, 4)
    feedback = len(smol_tok.encode(protocol.INVALID_ACTION_FEEDBACK, add_special_tokens=False))
    r = bench.run_turns(model, smol_tok, prefixes, new_tokens=6, turns=3, check_every=4)
    assert r["turns"] == 3 and len(r["turn_walls_s"]) == 3
    assert 0 < r["generated_tokens"] <= 4 * 3 * 6
    lo, hi = r["final_context"]
    # every turn adds the feedback and at least the one token a turn always decodes
    assert lo >= min(map(len, prefixes)) + 3 * (feedback + 1)
    assert hi <= max(map(len, prefixes)) + 3 * (feedback + 6)


def test_turns_with_the_cache_kept_decode_the_same_tokens(bench, smol_tok, monkeypatch):
    # The resumed row is the same work: the same sampled tokens call by call, with the cache kept
    # in every turn after each pass's first.
    from dgpo_edge.train.fast_decode import FastDecoder

    model = tiny_model("llama", len(smol_tok), seed=5)
    prefixes = bench.prompts(smol_tok, 4)
    calls = []
    real = FastDecoder.decode

    def spy(self, rows, *a, resume=False):
        outs = real(self, rows, *a, resume=resume)
        calls.append((resume, [o.ids for o in outs]))
        return outs

    monkeypatch.setattr(FastDecoder, "decode", spy)
    whole = bench.run_turns(model, smol_tok, prefixes, new_tokens=6, turns=3, check_every=4)
    fresh, calls[:] = list(calls), []
    kept = bench.run_turns(model, smol_tok, prefixes, new_tokens=6, turns=3, check_every=4, resume=True)
    assert kept["final_context"] == whole["final_context"]
    # the same tokens call by call: the kept row's extra warm-up passes draw on from the same generator
    assert [ids for _, ids in calls][:3] == [ids for _, ids in fresh][:3]
    assert [r for r, _ in calls] == [False, True, True] * (len(calls) // 3) and not any(r for r, _ in fresh)
    assert kept["resumed_turns"] == 2 and whole["resumed_turns"] == 0
