"""Passages never become control tokens: forced text is encoded with special tokens read as text.

Every special or added token of the real Qwen tokenizer (../shared, through
`tokenizers` and transformers) and of SmolLM2 (its GGUF on llama.cpp, and the
transformers tokenizer training extracts from it), written into a passage,
must come out as the ids of its characters: in `engine.encode_text`, in
`Transcript.tokenize` and in what the agent feeds the engine.
"""

from __future__ import annotations

import unicodedata

import pytest
from engine_fakes import ListRetriever, ScriptedEngine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgpo_edge import protocol
from dgpo_edge.agent import Agent
from dgpo_edge.protocol import Passage
from dgpo_edge.tokens import added_token_strings, batch_encoder, plain_batch_encoder, plain_encoder
from dgpo_edge.transcript import Transcript, encoder_for

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Any text before, between and after the tokens. llama.cpp does not give back unassigned code
# points (U+40000 decodes as three U+FFFD) or some C0 controls (a trailing \x16 is dropped), with
# special tokens or without, so the round-trip checks leave those out.
AROUND = st.text(st.characters(exclude_categories=("Cs", "Cn", "Cc")), max_size=12)


@pytest.fixture(scope="module")
def qwen_fast(qwen_dir):
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def qwen_hf(qwen_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen_dir))


@pytest.fixture(scope="module")
def smollm2():
    from bundle_helpers import smollm2_gguf

    from dgpo_edge.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(smollm2_gguf(), n_ctx=256, threads=1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def smol_hf(request, tmp_path_factory):
    pytest.importorskip("transformers")
    import test_rollout_support as support

    return support.smol_tok_fixture(request, tmp_path_factory)


def hostile_texts(tokens: list[str]):
    """Text holding one to three of `tokens` among arbitrary characters."""
    parts = st.lists(st.tuples(AROUND, st.sampled_from(tokens)), min_size=1, max_size=3)
    return st.builds(lambda ps, tail: "".join(a + t for a, t in ps) + tail, parts, AROUND)


def every_token_then_hypothesis(check, tokens: list[str]) -> None:
    """`check` each token alone and inside words, then on hypothesis's hostile texts."""
    for t in tokens:
        check(t)
        check(f"Doc 1(Title: x{t}y) a {t}{t} b")
    SETTINGS(given(hostile_texts(tokens))(check))()


def qwen_added(tok) -> tuple[list[str], set[int]]:
    d = tok.get_added_tokens_decoder() if hasattr(tok, "get_added_tokens_decoder") else None
    strings = added_token_strings(tok)
    ids = set(d) if d else {tok.convert_tokens_to_ids(s) for s in strings}
    return strings, ids


# --------------------------------------------------------------------------- the vocabularies

def test_the_vocabularies_hold_the_tokens_the_issue_names(qwen_fast, smollm2):
    qwen, _ = qwen_added(qwen_fast)
    assert {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "<|file_sep|>"} <= set(qwen)
    assert {"<file_sep>", "<filename>", "<gh_stars>", "<|im_start|>", "<|endoftext|>"} <= set(smollm2.added_tokens())
    assert len(smollm2.added_tokens()) == 17


@pytest.mark.parametrize("library", ["tokenizers", "transformers"])
def test_qwen_forced_text_never_yields_an_added_token(library, qwen_fast, qwen_hf):
    tok = qwen_fast if library == "tokenizers" else qwen_hf
    strings, ids = qwen_added(qwen_fast)
    assert len(strings) == len(ids) == 26
    encode = encoder_for(tok)
    decode = lambda x: tok.decode(x, skip_special_tokens=False)  # noqa: E731

    def check(text):
        plain = encode.plain(text)
        assert not set(plain) & ids, text
        assert decode(plain) == unicodedata.normalize("NFC", text)  # Qwen's normalizer is NFC
        assert set(encode(text)) & ids  # the prompt encoder does read them: the check above can fail

    every_token_then_hypothesis(check, strings)


def test_smollm2_gguf_encode_text_never_yields_a_control_token(smollm2):
    strings = smollm2.added_tokens()
    control = set(range(17))  # SmolLM2's specials are ids 0..16

    def check(text):
        ids = smollm2.encode_text(text)
        assert not set(ids) & control, text
        assert smollm2.decode(ids) == text
        assert set(smollm2.encode(text)) & control

    every_token_then_hypothesis(check, strings)


@pytest.mark.parametrize("library", ["tokenizers", "transformers"])
def test_transformers_engine_encode_text_with_the_qwen_tokenizer(library, qwen_dir, qwen_fast, qwen_hf):
    pytest.importorskip("torch")
    from test_rollout_support import tiny_model

    from dgpo_edge.engines.transformers_engine import TransformersEngine

    strings, ids = qwen_added(qwen_fast)
    tok = qwen_fast if library == "tokenizers" else qwen_hf
    engine = TransformersEngine(tiny_model("qwen2", vocab=151_669, layers=1), tokenizer=tok, n_ctx=64)
    text = "Doc 1: " + " and ".join(strings)
    assert set(engine.encode(text)) & ids and not set(engine.encode_text(text)) & ids
    assert engine.decode(engine.encode_text(text)) == text
    assert engine.count_text_tokens(text) == len(engine.encode_text(text))


def test_smollm2_training_tokenizer_reads_passages_as_text(smol_hf, smollm2):
    strings = smollm2.added_tokens()
    assert set(strings) <= set(added_token_strings(smol_hf))
    encode = encoder_for(smol_hf)
    control = {smol_hf.convert_tokens_to_ids(s) for s in strings}

    def check(text):
        assert not set(encode.plain(text)) & control, text
        assert smol_hf.decode(encode.plain(text), skip_special_tokens=False) == text

    every_token_then_hypothesis(check, strings)


def test_plain_encoder_cuts_overlapping_tokens_and_keeps_plain_text_whole():
    seen: list[str] = []

    def spy(text: str) -> list[int]:
        seen.append(text)
        return list(text.encode())

    plain = plain_encoder(spy, ["<reponame>", "<repo_name>", "name>", "x"])  # "x": one char, not cut
    assert bytes(plain("a<reponame>b<repo_name>")).decode() == "a<reponame>b<repo_name>"
    assert all("<reponame>" not in s and "<repo_name>" not in s and "name>" not in s for s in seen)
    seen.clear()
    assert plain("no tokens here, x") == list(b"no tokens here, x") and seen == ["no tokens here, x"]


def test_plain_encoder_keeps_recent_texts_and_hands_out_fresh_lists():
    """The same feedback is forced after every invalid turn: it is encoded once, and a caller that
    extends the list it got changes nothing another caller gets."""
    seen: list[str] = []

    def spy(text: str) -> list[int]:
        seen.append(text)
        return list(text.encode())

    for added in (["<tok>"], []):   # with pieces to cut, and without
        seen.clear()
        plain = plain_encoder(spy, added)
        first = plain("invalid <tok> action")
        first.append(0)
        again = plain("invalid <tok> action")
        assert bytes(again).decode() == "invalid <tok> action" and again is not first
        assert seen == (["invalid <", "tok> action"] if added else ["invalid <tok> action"])   # encoded once
        assert plain("other") == list(b"other") and seen[-1] == "other"
        long = "passage " * 60   # an observation-sized text is encoded every time, not kept
        seen.clear()
        assert plain(long) == plain(long) == list(long.encode()) and seen == [long, long]


@pytest.mark.parametrize("library", ["tokenizers", "transformers"])
def test_plain_batch_encoder_encodes_what_plain_encodes_in_one_call(library, qwen_fast, qwen_hf):
    """The batch encoder the RL rollouts fit and encode observations with gives plain(text) for
    every text, added tokens inside words included, from a single batch-encoder call."""
    tok = qwen_fast if library == "tokenizers" else qwen_hf
    strings, ids = qwen_added(qwen_fast)
    plain = encoder_for(tok).plain
    encode_many, calls = batch_encoder(tok), []
    plain_many = plain_batch_encoder(lambda texts: calls.append(len(texts)) or encode_many(texts), strings)
    texts = ["", "plain text", *(f"Doc 1(Title: x{t}y) a {t}{t} b" for t in strings), protocol.INVALID_ACTION_FEEDBACK]
    encoded = plain_many(texts)
    assert encoded == [plain(t) for t in texts] and not any(set(e) & ids for e in encoded)
    assert len(calls) == 1 and calls[0] > len(texts)          # the pieces, all in one call
    assert batch_encoder(lambda text: [1]) is None             # a bare callable has no batch form


@pytest.mark.parametrize("library", ["tokenizers", "transformers"])
def test_the_batch_encoder_ignores_padding_left_on_by_other_calls(library, qwen_fast, qwen_dir):
    # Padding (or truncation) switched on by an earlier call must not reach the observations' ids.
    if library == "tokenizers":
        tok = type(qwen_fast).from_str(qwen_fast.to_str())   # a copy: the fixture stays as it was
        tok.enable_padding()
    else:
        transformers = pytest.importorskip("transformers")
        tok = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
        tok(["a", "b c d e"], padding=True, truncation=True, max_length=3)
    texts = ["a", "b c d e f g h"]
    assert batch_encoder(tok)(texts) == [encoder_for(tok)(t) for t in texts] == [qwen_fast.encode(t).ids for t in texts]


# --------------------------------------------------------------------------- transcripts and the agent

def test_transcript_tokenize_encodes_observations_and_feedback_as_text(qwen_fast):
    strings, ids = qwen_added(qwen_fast)
    t = Transcript("q")
    t.append_prompt("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    t.append_turn("<search> q </search>")
    raw = "".join(strings)  # the block as a passage could write it, escape_tags bypassed
    t.append_information("q", [], block=f"\n\n<information>{raw}</information>\n\n")
    t.append_turn("<answer> a </answer>")
    tok = t.tokenize(encoder_for(qwen_fast))
    prompt, rest = tok.ids[:tok.prompt_length], tok.ids[tok.prompt_length:]
    assert set(prompt) & ids  # the chat template's own tokens are real
    assert not set(rest) & ids
    assert qwen_fast.decode(tok.ids, skip_special_tokens=False) == t.text


class SpecialScriptedEngine(ScriptedEngine):
    """The byte-level scripted engine with one special token, `<file_sep>` = 300, as a tokenizer has."""

    SPECIAL = "<file_sep>"

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for i, part in enumerate(text.split(self.SPECIAL)):
            out += ([300] if i else []) + list(part.encode("utf-8"))
        return out

    def added_tokens(self) -> list[str]:
        return [self.SPECIAL]


def test_the_agent_feeds_passages_to_the_engine_as_text():
    engine = SpecialScriptedEngine(["<search> peru </search>", "<answer> Lima </answer>"])
    passages = [Passage("1", '"Peru <file_sep> x"\nperu <file_sep><|endoftext|> the capital is Lima')]
    r = Agent(engine, ListRetriever(passages)).answer("What is the capital of Peru?")
    assert r.answer == "Lima" and "<file_sep>" in r.transcript.text
    fed = [i for call in engine.evaluated for i in call]
    assert 300 not in fed
    assert engine.encode(protocol.information_block(passages)).count(300) == 2  # what parsing would give
