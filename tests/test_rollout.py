"""Batched multi-turn rollouts (train/rollout.py, decoding.py, fast_decode.py) on CPU.

Real tokenizers (SmolLM2's from its GGUF; Qwen's from ../shared), tiny real
models, a real BM25 store. The memorizer (test_rollout_support.py) is a
2-layer model trained to search and answer, so stop strings, retrieval and
scoring are exercised for real.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_rollout_support as support  # noqa: E402
import torch  # noqa: E402
from dgpo_edge.train.decoding import PlainDecoder, RolloutSampling, StopScanner, sample_next  # noqa: E402
from dgpo_edge.train import fast_decode  # noqa: E402
from dgpo_edge.train.fast_decode import FastDecoder  # noqa: E402
from dgpo_edge.train.rollout import RolloutConfig, evaluate_em, generate_rollouts, observation_blocks  # noqa: E402
from test_rollout_support import EPISODES, tiny_model  # noqa: E402

from dgpo_edge import protocol  # noqa: E402
from dgpo_edge.protocol import ProtocolConfig  # noqa: E402
from dgpo_edge.retrieval.base import Retriever  # noqa: E402
from dgpo_edge.transcript import encoder_for  # noqa: E402

QUESTIONS = [e[0] for e in EPISODES]      # the memorizer knows the first one only
GOLDS = [[e[1]] for e in EPISODES]
KNOWN_Q, KNOWN_GOLD, KNOWN_QUERY = EPISODES[0][0], EPISODES[0][1], EPISODES[0][2]
# Varied lengths, so left padding really happens.
RANDOM_QS = ["Who wrote it", "What is the tallest mountain of the whole wide world",
             "When did the long and complicated war end", "Why"]


@pytest.fixture(scope="module")
def smol_tok(request, tmp_path_factory):
    return support.smol_tok_fixture(request, tmp_path_factory)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    r = support.bm25_retriever(tmp_path_factory.mktemp("bm25"))
    yield r
    r.close()


@pytest.fixture(scope="module")
def memorized(smol_tok, retriever, request, tmp_path_factory):
    return support.memorized_fixture(smol_tok, retriever, request, tmp_path_factory)


class CountingRetriever(Retriever):
    """A real retriever that also records every batched call."""

    def __init__(self, inner: Retriever):
        self.inner, self.calls = inner, []

    def search(self, queries, k=3):
        self.calls.append(list(queries))
        return self.inner.search(queries, k)


@pytest.fixture(scope="module")
def random_llama(smol_tok):
    return tiny_model("llama", len(smol_tok), seed=5)


def _fwd_logprobs(model, ids, temperature=1.0):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return [0.0] + lp[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()


def _cfg(**kw):
    proto = {k: kw.pop(k) for k in list(kw) if k in ProtocolConfig.__dataclass_fields__}
    return RolloutConfig(protocol=ProtocolConfig(**proto), **kw)


def _sig(rollouts):
    return [(r.token_ids, r.loss_mask, r.transcript.text) for r in rollouts]


# --- pieces -------------------------------------------------------------------------

def test_stop_scanner_keeps_the_completing_token_and_drops_eos(smol_tok):
    scanner = StopScanner(smol_tok, protocol.STOP_STRINGS, {smol_tok.eos_token_id})
    ids = smol_tok.encode("<think> x </think>\n<search> q </search>\n\nmore text", add_special_tokens=False)
    row = scanner.start(100)
    row.feed(ids, [0.0] * len(ids))
    out = row.output()
    text = smol_tok.decode(out.ids)
    assert out.finish == "stop" and "</search>" in text and "more" not in text
    assert not smol_tok.decode(out.ids[:-1]).endswith("</search>")   # cut right at the completing token
    row = scanner.start(100)
    row.feed([ids[0], smol_tok.eos_token_id, ids[1]], [-1.0, -2.0, -3.0])
    assert (row.output().ids, row.output().logprobs, row.output().finish) == ([ids[0]], [-1.0], "eos")
    row = scanner.start(2)
    row.feed(ids, [0.0] * len(ids))
    assert (row.output().ids, row.output().finish) == (ids[:2], "length")


def _scan_token_by_token(tok, stops, eos, ids, lps, max_new):
    """The stop rule, one token at a time (the specification the block scanner must match)."""
    tail, text, out, out_lp = max(len(s) for s in stops), "", [], []
    for tid, lp in zip(ids, lps):
        if tid in eos:
            return out, out_lp, "eos"
        out.append(tid)
        out_lp.append(lp)
        window = text + tok.decode([tid], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        text = window[-tail:]
        if any(s in window for s in stops):
            return out, out_lp, "stop"
        if len(out) >= max_new:
            return out, out_lp, "length"
    return out, out_lp, None


def test_stop_scanner_blocks_match_the_token_by_token_rule(smol_tok):
    """Random streams rich in stop-string fragments, fed in random chunks: same ids, log-probs, finish."""
    import random

    rng = random.Random(0)
    eos = {smol_tok.eos_token_id}
    pool = sorted({i for text in ("</search>", "</answer>", "</", ">", ">\n", "search>", "answer", "<search>",
                                  " </", "think", "x", " Paris", "\n\n")
                   for i in smol_tok.encode(text, add_special_tokens=False)} | eos)
    scanner = StopScanner(smol_tok, protocol.STOP_STRINGS, eos)
    finishes = set()
    for trial in range(300):
        n = rng.randint(1, 60)
        ids = [rng.choice(pool) if rng.random() < 0.7 else rng.randrange(len(smol_tok)) for _ in range(n)]
        lps = [-rng.random() for _ in ids]
        max_new = rng.randint(1, 70)
        row, k = scanner.start(max_new), 0
        while k < n:
            step = rng.randint(1, 16)
            row.feed(ids[k:k + step], lps[k:k + step])
            k += step
        want = _scan_token_by_token(smol_tok, protocol.STOP_STRINGS, eos, ids, lps, max_new)
        got = row.output()
        assert (got.ids, got.logprobs) == (want[0], want[1]), trial
        assert got.finish == (want[2] or "length"), trial
        finishes.add(got.finish)
    assert finishes == {"stop", "eos", "length"}


def test_sample_next_logprobs_greedy_and_nucleus():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.0, 0.0]])
    tok, lp = sample_next(logits, RolloutSampling(greedy=True, temperature=2.0))
    assert tok.tolist() == [0, 1]
    assert torch.allclose(lp, torch.log_softmax(logits / 2.0, -1)[[0, 1], [0, 1]])
    # top_p small keeps only the most likely token, whatever the noise says.
    noise = torch.rand((2, 4), generator=torch.Generator().manual_seed(0))
    for _ in range(5):
        tok, _ = sample_next(logits, RolloutSampling(top_p=0.05), noise)
        assert tok.tolist() == [0, 1]
        noise = torch.rand((2, 4))
    # Sampling follows the distribution: token 1 of row 2 has p = e^3 / (e^3 + 3) ~ 0.87.
    g = torch.Generator().manual_seed(1)
    draws = [sample_next(logits, RolloutSampling(), torch.rand((2, 4), generator=g))[0][1].item() for _ in range(400)]
    assert 0.80 < draws.count(1) / 400 < 0.94


# --- episodes ------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["plain", "fast"])
def test_memorized_agent_searches_reads_and_answers(memorized, smol_tok, retriever, engine):
    counting = CountingRetriever(retriever)
    rs = generate_rollouts(memorized, smol_tok, QUESTIONS, GOLDS, counting, _cfg(greedy=True, engine=engine))
    known = rs[0]
    assert (known.answer, known.score, known.n_searches, known.n_invalid, known.finish) == \
        (KNOWN_GOLD, 1.0, 1, 0, "answer")
    assert [s.kind for s in known.transcript.segments] == ["prompt", "turn", "information", "turn"]
    assert known.transcript.segments[1].text.endswith(f"<search> {KNOWN_QUERY} </search>")
    assert known.transcript.searches()[0].passages[0].title == "Freedonia"
    # One batched retriever call per round, holding every row that searched in it.
    assert counting.calls[0][0] == KNOWN_QUERY
    assert sum(map(len, counting.calls)) == sum(r.n_searches for r in rs)
    assert len(counting.calls) <= 4
    encode = encoder_for(smol_tok)
    for r in rs:
        tok = r.transcript.tokenize(encode)
        assert (tok.ids, tok.mask) == (r.token_ids, r.loss_mask)    # segment-wise ids, as the agent's
        assert smol_tok.decode(r.token_ids) == r.transcript.text
        # Mask 1 exactly on the turns' sampled ids.
        turn_ids = [i for s in r.transcript.turns() for i in s.token_ids]
        assert [i for i, m in zip(r.token_ids, r.loss_mask) if m] == turn_ids
        assert r.prompt_length == len(encode(r.transcript.prompt))
        assert r.score == float(r.answer is not None and r.answer == r.golds[0])


class HostileRetriever(Retriever):
    """One passage holding SmolLM2's control-token strings, then the real retriever's (an episode
    shows the first top-k)."""

    BAD = protocol.Passage("bad", '"Repo <filename>"\nnotes <file_sep> <gh_stars>10 <|endoftext|><|im_start|>')

    def __init__(self, inner: Retriever):
        self.inner = inner

    def search(self, queries, k=3):
        return [[self.BAD, *ps] for ps in self.inner.search(queries, k)]


def test_rollout_observations_never_hold_control_tokens(memorized, smol_tok, retriever):
    special = {smol_tok.convert_tokens_to_ids(t) for t in smol_tok.all_special_tokens} | set(range(17))
    rs = generate_rollouts(memorized, smol_tok, [KNOWN_Q], [[KNOWN_GOLD]], HostileRetriever(retriever),
                           _cfg(greedy=True, max_searches=1))
    r = rs[0]
    assert "<file_sep> <gh_stars>10" in r.transcript.searches()[0].text  # escape_tags leaves these alone
    forced = [i for i, m in zip(r.token_ids[r.prompt_length:], r.loss_mask[r.prompt_length:]) if not m]
    assert forced and not set(forced) & special
    assert r.transcript.tokenize(encoder_for(smol_tok)).ids == r.token_ids
    assert smol_tok.decode(r.token_ids) == r.transcript.text


@pytest.mark.parametrize("engine", ["plain", "fast"])
def test_logprobs_equal_a_forward_pass_over_the_episode(memorized, random_llama, smol_tok, retriever, engine):
    cfg = _cfg(temperature=0.7, seed=3, engine=engine, max_turn_tokens=24, max_searches=1)
    for model, qs in ((memorized, QUESTIONS[:2]), (random_llama, RANDOM_QS[:2])):
        for r in generate_rollouts(model, smol_tok, qs, None, retriever, cfg):
            ref = _fwd_logprobs(model, r.token_ids, temperature=0.7)
            for lp, want, m in zip(r.logprobs, ref, r.loss_mask):
                assert (lp == 0.0) if not m else abs(lp - want) < 1e-4


def test_fast_engine_equals_plain_engine_token_for_token(random_llama, memorized, smol_tok, retriever):
    for model, qs in ((random_llama, RANDOM_QS), (memorized, QUESTIONS)):
        for sampling in ({"greedy": True}, {"temperature": 1.0, "seed": 11}):
            got = [generate_rollouts(model, smol_tok, qs, None, retriever,
                                     _cfg(engine=e, max_turn_tokens=20, max_searches=1, check_every=7,
                                          **sampling))
                   for e in ("plain", "fast")]
            assert _sig(got[0]) == _sig(got[1])
            for a, b in zip(*got):
                assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0) < 1e-4


@pytest.mark.parametrize("engine", ["plain", "fast"])
def test_batched_equals_one_by_one_greedy(random_llama, smol_tok, retriever, engine):
    cfg = _cfg(greedy=True, engine=engine, max_turn_tokens=16, max_searches=1)
    batched = generate_rollouts(random_llama, smol_tok, RANDOM_QS, None, retriever, cfg)
    alone = [generate_rollouts(random_llama, smol_tok, [q], None, retriever, cfg)[0] for q in RANDOM_QS]
    assert _sig(batched) == _sig(alone)
    split = generate_rollouts(random_llama, smol_tok, RANDOM_QS, None, retriever, replace(cfg, batch_size=3))
    assert _sig(split) == _sig(batched)


def test_seed_reproduces_and_differs(random_llama, smol_tok, retriever):
    cfg = _cfg(temperature=1.0, seed=7, max_turn_tokens=12, max_searches=1)
    a = generate_rollouts(random_llama, smol_tok, RANDOM_QS, None, retriever, cfg)
    b = generate_rollouts(random_llama, smol_tok, RANDOM_QS, None, retriever, cfg)
    c = generate_rollouts(random_llama, smol_tok, RANDOM_QS, None, retriever, replace(cfg, seed=8))
    assert _sig(a) == _sig(b)
    assert _sig(a) != _sig(c)


# --- budgets ----------------------------------------------------------------------------

def test_turn_budget_and_invalid_feedback(random_llama, smol_tok, retriever):
    rs = generate_rollouts(random_llama, smol_tok, RANDOM_QS[:2], None, retriever,
                           _cfg(greedy=True, max_turn_tokens=5, max_searches=2))
    for r in rs:
        turns = r.transcript.turns()
        assert len(turns) == 3 and all(len(t.token_ids) <= 5 for t in turns)
        # Random text is no action: feedback after each turn but the final one.
        assert [s.kind for s in r.transcript.segments] == ["prompt", "turn", "feedback", "turn", "feedback", "turn"]
        assert r.n_invalid == 3 and r.finish == "final" and r.score == 0.0


def test_final_turn_does_not_search(memorized, smol_tok):
    # max_searches=0: the only turn is the final one; its search is not executed.
    rs = generate_rollouts(memorized, smol_tok, [KNOWN_Q], [[KNOWN_GOLD]], None, _cfg(greedy=True, max_searches=0))
    for r in rs:
        assert [s.kind for s in r.transcript.segments] == ["prompt", "turn"]
        assert r.transcript.turns()[0].action.kind == "search"
        assert (r.n_searches, r.finish, r.answer, r.score) == (0, "final", None, 0.0)


def test_total_and_observation_budgets(memorized, smol_tok, retriever):
    encode = encoder_for(smol_tok)
    prompt_len = len(encode(protocol.render_prompt(KNOWN_Q, smol_tok)))
    rs = generate_rollouts(memorized, smol_tok, [KNOWN_Q], [[KNOWN_GOLD]], retriever,
                           _cfg(greedy=True, max_total_tokens=prompt_len + 10))
    # The cut turn is invalid (feedback follows), then the total budget ends the episode.
    assert rs[0].finish == "budget" and rs[0].n_generated == 10 and rs[0].prompt_length == prompt_len
    assert [s.kind for s in rs[0].transcript.segments] == ["prompt", "turn", "feedback"]
    rs = generate_rollouts(memorized, smol_tok, [KNOWN_Q], [[KNOWN_GOLD]], retriever,
                           _cfg(greedy=True, max_obs_tokens=24))
    info = rs[0].transcript.searches()[0]
    assert len(encode(info.text)) <= 24 and info.text.endswith("</information>\n\n")


def test_a_block_memory_kept_across_calls_changes_nothing_but_the_counting(memorized, smol_tok, retriever):
    # RL holds one observation_blocks for the run: the second step's observations of passages seen
    # in the first are remembered, and every rollout is the one a fresh memory gives.
    cfg = _cfg(greedy=True, max_obs_tokens=24)
    blocks = observation_blocks(smol_tok)
    first = generate_rollouts(memorized, smol_tok, [KNOWN_Q] * 2, [[KNOWN_GOLD]] * 2, retriever, cfg, blocks=blocks)
    misses = blocks.misses
    again = generate_rollouts(memorized, smol_tok, [KNOWN_Q], [[KNOWN_GOLD]], retriever, cfg, blocks=blocks)
    fresh = generate_rollouts(memorized, smol_tok, [KNOWN_Q], [[KNOWN_GOLD]], retriever, cfg)
    assert misses >= 1 and blocks.hits >= 2 and blocks.misses == misses
    assert _sig(again) == _sig(fresh) == _sig(first[:1])
    assert [s.text for s in again[0].transcript.segments] == [s.text for s in fresh[0].transcript.segments]


def test_observation_blocks_fit_a_round_through_the_batch_encoder(smol_tok, retriever):
    # RL fits a round's new observations together: the batched counter must agree with the
    # per-text one (the block is then the one information_block builds alone).
    blocks = observation_blocks(smol_tok)
    plain = encoder_for(smol_tok).plain
    results = retriever.search([KNOWN_QUERY, "tallest mountain", KNOWN_QUERY], 3)
    texts = [protocol.format_docs(r) for r in results]
    assert blocks.encode_many(texts) == [plain(t) for t in texts]
    assert blocks.count_many(texts) == [len(plain(t)) for t in texts]
    blocks.prefetch(results, 24)
    assert blocks.misses == 2
    assert [blocks(r, 24) for r in results] == [protocol.information_block(r, 24, blocks.count_tokens) for r in results]
    assert blocks.hits == 3 and blocks.misses == 2


def test_batched_observations_give_the_rollouts_each_episode_builds_alone(memorized, smol_tok, retriever):
    # The rollouts' batched fitting and encoding of a round's blocks against blocks without a batch
    # encoder (each episode fits and encodes its own): the same ids, masks and transcripts.
    cfg = _cfg(greedy=True, max_obs_tokens=24)
    batched = observation_blocks(smol_tok)
    alone = protocol.InformationBlocks(batched.count_tokens)
    assert batched.encode_many is not None and alone.encode_many is None
    one = generate_rollouts(memorized, smol_tok, QUESTIONS, GOLDS, retriever, cfg, blocks=batched)
    two = generate_rollouts(memorized, smol_tok, QUESTIONS, GOLDS, retriever, cfg, blocks=alone)
    assert sum(r.n_searches for r in one) >= 1 and _sig(one) == _sig(two)


def test_evaluate_em_is_greedy(memorized, smol_tok, retriever):
    examples = [{"question": KNOWN_Q, "golden_answers": [KNOWN_GOLD]}] * 2
    res = evaluate_em(memorized, smol_tok, examples, retriever, _cfg(temperature=5.0, seed=1))
    assert res["n"] == 2 and res["em"] == 1.0 and res["searches"] == 1.0 and res["invalid"] == 0.0


def test_fast_engine_grows_its_cache_across_calls(random_llama, smol_tok):
    eng = FastDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, (), check_every=4, length_bucket=16)
    plain = PlainDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, ())
    g = RolloutSampling(greedy=True)
    for prefixes, new in (([[5, 6, 7]], 3), ([[1] * 40, [2, 3]], 30), ([[9]], 2)):
        got = eng.decode(prefixes, [new] * len(prefixes), g, None)
        want = plain.decode(prefixes, [new] * len(prefixes), g, None)
        assert [o.ids for o in got] == [o.ids for o in want]
        assert all(len(o.ids) == new for o in got)


def _turns(engine, turns, sampling, resume):
    """Play `turns` = [(kept rows, appended tokens, max_new per row), ...] as an episode loop does:
    each turn's prefixes are the kept rows' last prefix + its output + the appended tokens."""
    gen = torch.Generator(device=engine.model.device).manual_seed(3)
    prefixes, outs = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17], [18]], []
    for t, (keep, extra, new) in enumerate(turns):
        if t:
            prefixes = [prefixes[i] + outs[i].ids + extra[j] for j, i in enumerate(keep)]
        outs = engine.decode(prefixes, new, sampling, gen, **({"resume": True} if resume and t else {}))
        yield prefixes, outs


# Four turns: every row, then rows dropping out (so the cache rows are gathered), budgets that
# differ per row (so each row's unused slots differ), and appended blocks of several lengths.
TURNS = [(None, None, [6, 3, 8, 1]),
         ([0, 1, 2, 3], [[40, 41], [42], [43, 44, 45, 46, 47], [48]], [5, 7, 2, 4]),
         ([0, 2, 3], [[50], [51, 52, 53], [54, 55]], [9, 1, 6]),
         ([1, 2], [[60, 61, 62], [63]], [4, 8])]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", ["resume", "grow", "chunked", "eos"])
@pytest.mark.parametrize("sampling", [RolloutSampling(greedy=True), RolloutSampling(temperature=1.0)])
def test_resumed_turns_equal_the_plain_engine_over_whole_prefixes(random_llama, smol_tok, monkeypatch, sampling,
                                                                  case, device):
    # With resume=True the fast engine prefills only what each row appended, over the cache of its
    # earlier turns; the tokens and log-probs are the plain engine's, which reads every whole prefix
    # again. "grow": a bucket too short for the later turns, which then prefill whole instead;
    # "chunked": the resumed prefill one row at a time; "eos": rows that end on an end-of-sequence
    # id (not kept). On a GPU: CUDA graphs (batch padding, the warm-up) and the CUDA defaults.
    if device == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("the CUDA-graph engine needs a GPU")
        random_llama = copy.deepcopy(random_llama).to("cuda")
    eos = ()
    if case == "eos":   # a token the first turn samples early in a row: as EOS it ends rows mid-turn
        plain = PlainDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, ())
        eos = (next(_turns(plain, TURNS, sampling, False))[1][0].ids[2],)
    eng = FastDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, eos, check_every=4,
                      length_bucket=16 if case == "grow" else 128, prefill_elements=1 if case == "chunked" else 1 << 26)
    prefilled = []
    real = eng._prefill
    monkeypatch.setattr(eng, "_prefill", lambda ids, *a: prefilled.append(ids.shape[1]) or real(ids, *a))
    plain = PlainDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, eos)
    whole, finishes = [], []
    for (prefixes, got), (same, want) in zip(_turns(eng, TURNS, sampling, True), _turns(plain, TURNS, sampling, False)):
        assert prefixes == same
        assert [(o.ids, o.finish) for o in got] == [(o.ids, o.finish) for o in want]
        assert all(abs(a - b) < 1e-4 for g, w in zip(got, want) for a, b in zip(g.logprobs, w.logprobs))
        whole.append(max(map(len, prefixes)))
        finishes += [o.finish for o in got]
    if case == "grow":   # the cache grew, and the turns that needed it prefilled their whole prefixes
        assert eng._alloc_shape[1] > 16 and any(p == w for p, w in zip(prefilled[1:], whole[1:]))
        # ...to the length resuming needed: within a few more episodes of this shape every later turn resumes
        for _ in range(4):
            prefilled.clear()
            for (_, got), (_, want) in zip(_turns(eng, TURNS, sampling, True), _turns(plain, TURNS, sampling, False)):
                assert [o.ids for o in got] == [o.ids for o in want]
            if prefilled[1:] == [6, 4, 4]:
                break
        assert prefilled[1:] == [6, 4, 4]
    else:                # the later turns prefilled the appended tokens and the last sampled one
        assert prefilled[1:] == [6, 4, 4] if case != "eos" else all(p < w for p, w in zip(prefilled[1:], whole[1:]))
    if case == "eos":
        assert "eos" in finishes


def test_a_prefix_that_does_not_extend_the_last_call_is_prefilled_whole(random_llama, smol_tok):
    eng = FastDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, (), check_every=4, length_bucket=16)
    plain = PlainDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, ())
    g = RolloutSampling(greedy=True)
    first = eng.decode([[5, 6, 7], [8, 9]], [4, 4], g, None)
    # Row 1 is edited (not an extension), so the call cannot keep the cache; the answer is the same.
    prefixes = [[5, 6, 7] + first[0].ids + [30], [8, 2] + first[1].ids + [31]]
    assert [o.ids for o in eng.decode(prefixes, [5, 5], g, None, resume=True)] == \
        [o.ids for o in plain.decode(prefixes, [5, 5], g, None)]
    assert eng._kept.start == max(map(len, prefixes))   # prefilled from column 0
    # A resumed call with rows out of the last call's order falls back the same way.
    swapped = [prefixes[1] + [1], prefixes[0] + [2]]
    assert [o.ids for o in eng.decode(swapped, [3, 3], g, None, resume=True)] == \
        [o.ids for o in plain.decode(swapped, [3, 3], g, None)]


@pytest.mark.parametrize("sampling", [{"greedy": True}, {"temperature": 1.0}])
def test_rollouts_with_the_cache_kept_between_turns_are_the_same_rollouts(memorized, smol_tok, retriever, sampling,
                                                                        monkeypatch):
    # The memorizer searches, reads the observation and answers: real multi-turn episodes. Sampled,
    # an episode may answer in its first turn, so seeds are tried until one goes on past it (a search,
    # or an invalid turn answered with feedback); every seed tried must agree.
    matched = []
    real = fast_decode._match
    monkeypatch.setattr(fast_decode, "_match", lambda *a: matched.append(real(*a)) or matched[-1])
    for seed in range(11, 21):
        cfg = _cfg(engine="fast", check_every=5, seed=seed, **sampling)
        base = generate_rollouts(memorized, smol_tok, QUESTIONS, None, retriever, replace(cfg, reuse_cache=False))
        assert not matched                 # the whole prefill never tries to resume
        kept = generate_rollouts(memorized, smol_tok, QUESTIONS, None, retriever, replace(cfg, reuse_cache=True))
        assert _sig(kept) == _sig(base)
        for a, b in zip(base, kept):
            assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0) < 1e-4
        if max(r.n_searches + r.n_invalid for r in kept) > 0:
            break
    else:
        pytest.fail("no episode went on past its first turn in ten seeds")
    assert matched and all(m is not None for m in matched)   # every later turn resumed the kept cache
    if sampling.get("greedy"):
        assert kept[0].n_searches == 1     # the memorizer's greedy episode searches, reads and answers


# --- the real Qwen vocabulary --------------------------------------------------------------

@pytest.mark.shared
def test_qwen_tokenizer_fast_equals_plain_and_logprobs(qwen_dir, retriever):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen_dir))
    model = tiny_model("qwen2", len(tok), seed=2)
    cfg = _cfg(temperature=1.0, seed=4, max_turn_tokens=16, max_searches=1)
    got = [generate_rollouts(model, tok, RANDOM_QS, None, retriever, replace(cfg, engine=e))
           for e in ("plain", "fast")]
    assert _sig(got[0]) == _sig(got[1])
    r = got[1][0]
    assert r.transcript.prompt.startswith("<|im_start|>") and r.transcript.prompt.endswith("assistant\n")
    ref = _fwd_logprobs(model, r.token_ids)
    assert all(abs(lp - w) < 1e-4 for lp, w, m in zip(r.logprobs, ref, r.loss_mask) if m)


# Compiled sampling (fused_sampling=True) is the default on CUDA only: torch.compile takes minutes
# on a CPU, so the GPU test below covers it.
@pytest.mark.parametrize("attention,lm_head,fused,layers", [
    ("matmul", "model", False, "model"), ("sdpa", "transposed", False, "model"), ("sdpa", "model", False, "functional"),
    ("sdpa", "model", True, "model"), ("sdpa", "model", True, "compiled")])
def test_fast_engine_variants_equal_the_plain_engine(random_llama, smol_tok, attention, lm_head, fused, layers):
    # Every speed option (attention kernel, LM-head layout, compiled sampling, the layers as
    # train/fast_layers.py's functions, eager or compiled) draws the plain engine's tokens and
    # log-probs, greedy and sampled, across calls of changing shape.
    if fused:
        if not torch.cuda.is_available():
            pytest.skip("compiled sampling and layers are tested on a GPU (torch.compile on CPU takes minutes)")
        random_llama = copy.deepcopy(random_llama).to("cuda")
    eng = FastDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, (), check_every=4, length_bucket=16,
                      attention=attention, lm_head=lm_head, fused_sampling=fused, layers=layers)
    plain = PlainDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, ())
    for sampling in (RolloutSampling(greedy=True), RolloutSampling(temperature=1.0)):
        for prefixes, new in (([[5, 6, 7], [8, 9]], 12), ([[1] * 20, [2, 3], [4]], 9)):
            got, want = (e.decode(prefixes, [new] * len(prefixes), sampling,
                                  torch.Generator(device=random_llama.device).manual_seed(7))
                         for e in (eng, plain))
            assert [o.ids for o in got] == [o.ids for o in want]
            assert all(abs(a - b) < 1e-4 for g, w in zip(got, want) for a, b in zip(g.logprobs, w.logprobs))


def test_functional_layers_equal_the_modules_on_qwen2(smol_tok):
    # Qwen2 layers have q/k/v biases (Llama's have none): the functions must use them.
    model = tiny_model("qwen2", len(smol_tok), seed=5)
    with torch.no_grad():  # initialised to zero: give the biases values that change the tokens
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))
    mods, funcs = (FastDecoder(model, smol_tok, protocol.STOP_STRINGS, (), check_every=4, length_bucket=16,
                               layers=layers) for layers in ("model", "functional"))
    prefixes = [[5, 6, 7], [8, 9], [1] * 11]
    for sampling in (RolloutSampling(greedy=True), RolloutSampling(temperature=1.0)):
        got, want = (e.decode(prefixes, [10] * 3, sampling, torch.Generator().manual_seed(3)) for e in (funcs, mods))
        assert [o.ids for o in got] == [o.ids for o in want]
        assert all(abs(a - b) < 1e-5 for g, w in zip(got, want) for a, b in zip(g.logprobs, w.logprobs))


def test_compiled_or_eager_falls_back_for_good_after_a_failed_compile(monkeypatch):
    # The compiled sampler and layers are optimisations only: a build whose compiler fails runs eagerly.
    from dgpo_edge.train import fast_layers

    calls = []

    def broken(*args):
        calls.append("compiled")
        raise RuntimeError("no compiler toolchain")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: broken)
    double = fast_layers.compiled_or_eager(lambda x: 2 * x)
    assert [double(3), double(4)] == [6, 8] and calls == ["compiled"]   # tried once, then eager


def test_fast_engine_auto_options_resolve_by_device(random_llama, smol_tok):
    # auto: compiled layers and the transposed LM head on CUDA only; on a CPU the modules, unchanged.
    eng = FastDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, ())
    assert eng._kernels is None and eng.lm_head == "model"
    gelu = copy.deepcopy(random_llama)
    gelu.config.hidden_act = "gelu"
    assert FastDecoder(gelu, smol_tok, protocol.STOP_STRINGS, (), layers="auto")._kernels is None
    with pytest.raises(ValueError, match="SiLU MLPs"):
        FastDecoder(gelu, smol_tok, protocol.STOP_STRINGS, (), layers="functional")
    # LoRA-injected projections: the functions would read the base weights only, so never theirs
    from dgpo_edge.train import fast_layers
    from dgpo_edge.train.config import LoRASection
    from dgpo_edge.train.lora import apply_lora

    assert fast_layers.supported(random_llama)
    lora = apply_lora(copy.deepcopy(random_llama), LoRASection(r=4))
    assert not fast_layers.supported(lora)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        FastDecoder(lora, smol_tok, protocol.STOP_STRINGS, (), layers="functional")


def test_fast_engine_rejects_unknown_options(random_llama, smol_tok):
    with pytest.raises(ValueError, match="layers must be one of"):
        FastDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, (), layers="fused")
    with pytest.raises(ValueError, match="attention must be one of"):
        FastDecoder(random_llama, smol_tok, protocol.STOP_STRINGS, (), attention="flash")


@pytest.mark.parametrize("which", ["smollm2", "qwen2"])
def test_turn_texts_decode_as_the_tokenizer_does_row_by_row(which, request):
    """A round's turns decoded in one call of the fast tokenizer's backend give, row for row, what
    `tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)` gives:
    special and added tokens, byte pieces of split characters and empty turns included."""
    import random

    from transformers import AutoTokenizer

    from dgpo_edge.train import rollout
    from dgpo_edge.train.rollout import turn_texts

    tok = (request.getfixturevalue("smol_tok") if which == "smollm2"
           else AutoTokenizer.from_pretrained(request.getfixturevalue("qwen_dir")))
    rng = random.Random(0)
    text = "<think> Zürich — 東京 </think>\n<search> coastline </search> <|im_end|> Ω"
    rows = [tok.encode(text, add_special_tokens=False), [], [tok.eos_token_id]]
    rows += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 60))] for _ in range(40)]
    want = [tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in rows]
    assert turn_texts(tok, rows) == want and want[0] == text
    assert rollout._plain_fast_decode(type(tok))   # these take the one-call path

    class RowByRow:   # a tokenizer without a Rust backend takes the per-row path
        def decode(self, ids, **kwargs):
            return tok.decode(ids, **kwargs)

    assert turn_texts(RowByRow(), rows[:5]) == want[:5]

    class OwnDecode(type(tok)):   # a subclass with its own _decode is decoded through it
        def _decode(self, token_ids, **kwargs):
            return "own:" + super()._decode(token_ids, **kwargs)

    own = copy.copy(tok)
    own.__class__ = OwnDecode
    assert turn_texts(own, rows[:5]) == ["own:" + w for w in want[:5]]
