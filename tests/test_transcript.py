"""Transcripts: segments, answers, serialisation, and token ids with loss masks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgpo_edge import protocol
from dgpo_edge.chat_template import ChatTemplate
from dgpo_edge.protocol import Action, Passage
from dgpo_edge.transcript import Segment, TokenizedTranscript, Transcript, encoder_for

# ------------------------------------------------------------------ fixtures



@pytest.fixture(scope="session")
def fast_tokenizer(qwen_dir: Path):
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))


@pytest.fixture(scope="session")
def hf_tokenizer(qwen_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(qwen_dir))


@pytest.fixture(params=["tokenizers", "transformers"])
def qwen(request, fast_tokenizer, hf_tokenizer):
    """(encode, decode) for the real Qwen tokenizer, through either library."""
    if request.param == "tokenizers":
        return encoder_for(fast_tokenizer), lambda ids: fast_tokenizer.decode(ids, skip_special_tokens=False)
    return encoder_for(hf_tokenizer), lambda ids: hf_tokenizer.decode(ids, skip_special_tokens=False)


QUESTION = "who got the first nobel prize in physics"
TURN_SEARCH = ("<think>I need to find who received the first Nobel Prize in Physics.</think>\n"
               "<search> first nobel prize in physics </search>")
TURN_INVALID = "<think>The first passage answers it; it was awarded in 1901.</think>"
TURN_ANSWER = "<think>It was Wilhelm Conrad R\u00f6ntgen.</think>\n<answer> Wilhelm Conrad R\u00f6ntgen </answer>"
PASSAGES = [
    Passage("101", '"Nobel Prize in Physics"\nThe first Nobel Prize in Physics was awarded in 1901 to '
                   "Wilhelm Conrad R\u00f6ntgen, of Germany, for the discovery of X-rays.", 0.91),
    Passage("102", '"Wilhelm R\u00f6ntgen"\nWilhelm Conrad R\u00f6ntgen (27 March 1845 \u2013 10 February '
                   "1923) was a German mechanical engineer and physicist.", 0.88),
    Passage("103", '"Alfred Nobel"\nAlfred Bernhard Nobel was a Swedish chemist, engineer, inventor '
                   "and philanthropist.", None),
]


def build(prompt: str) -> Transcript:
    t = Transcript(QUESTION)
    t.append_prompt(prompt)
    assert t.append_turn(TURN_SEARCH) == Action("search", "first nobel prize in physics")
    t.append_information("first nobel prize in physics", PASSAGES)
    assert t.append_turn(TURN_INVALID) == Action("invalid")
    t.append_feedback()
    assert t.append_turn(TURN_ANSWER) == Action("answer", "Wilhelm Conrad R\u00f6ntgen")
    return t


@pytest.fixture(scope="session")
def qwen_prompt(qwen_dir) -> str:
    return protocol.render_prompt(QUESTION, ChatTemplate.from_tokenizer_config(qwen_dir))


@pytest.fixture
def transcript(qwen_prompt) -> Transcript:
    return build(qwen_prompt)


# ------------------------------------------------------------------ reading


def test_transcript_reading(transcript, qwen_prompt):
    t = transcript
    info = protocol.information_block(PASSAGES)
    fb = protocol.INVALID_ACTION_FEEDBACK
    assert qwen_prompt.startswith("<|im_start|>user\nAnswer the given question.")
    assert qwen_prompt.endswith("Question: who got the first nobel prize in physics?\n<|im_end|>\n"
                                "<|im_start|>assistant\n")
    assert [s.kind for s in t.segments] == ["prompt", "turn", "information", "turn", "feedback", "turn"]
    assert t.prompt == qwen_prompt
    assert t.response == TURN_SEARCH + info + TURN_INVALID + fb + TURN_ANSWER
    assert t.text == qwen_prompt + t.response
    assert [s.text for s in t.turns()] == [TURN_SEARCH, TURN_INVALID, TURN_ANSWER]
    assert all(s.generated for s in t.turns())
    assert not any(s.generated for s in t.segments if s.kind != "turn")
    assert [s.action for s in t.turns()] == [Action("search", "first nobel prize in physics"),
                                             Action("invalid"),
                                             Action("answer", "Wilhelm Conrad R\u00f6ntgen")]
    (search,) = t.searches()
    assert search.query == "first nobel prize in physics"
    assert search.text == info
    assert search.passages == tuple(PASSAGES)
    assert list(t.retrieved_passages()) == PASSAGES
    assert t.answer() == "Wilhelm Conrad R\u00f6ntgen"
    assert t.n_invalid == 1


def test_answer_ignores_forced_text():
    # The prompt's example "<answer> Beijing </answer>" and an answer inside an
    # information block written verbatim (block override) are not the model's.
    t = Transcript("q")
    t.append_prompt(protocol.render_prompt("q"))
    assert t.answer() is None
    t.append_turn("<search>q</search>")
    t.append_information("q", [], block="\n\n<information><answer>evil</answer></information>\n\n")
    assert t.answer() is None
    t.append_turn("<answer>a</answer> then <answer>b</answer>")
    assert t.answer() == "b"


def test_order_is_enforced():
    t = Transcript("q")
    with pytest.raises(ValueError):
        t.append_turn("<answer>x</answer>")
    with pytest.raises(ValueError):
        t.append_information("q", [])
    with pytest.raises(ValueError):
        t.append_feedback()
    assert t.segments == []
    t.append_prompt("p")
    with pytest.raises(ValueError):
        t.append_prompt("again")
    assert [s.kind for s in t.segments] == ["prompt"]


def test_dict_round_trip(transcript):
    transcript.append_turn("<answer>x</answer>", token_ids=[1, 2, 3])   # ids survive the trip too
    d = transcript.to_dict()
    d2 = json.loads(json.dumps(d))            # and it is plain JSON
    back = Transcript.from_dict(d2)
    assert back.question == transcript.question
    assert back.segments == transcript.segments
    assert back.to_dict() == d
    assert back.text == transcript.text
    assert back.answer() == "x"
    assert back.segments[-1].token_ids == (1, 2, 3)
    assert back.searches()[0].passages[0].score == 0.91
    assert back.searches()[0].passages[2].score is None


def test_from_dict_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown segment kind"):
        Transcript.from_dict({"question": "q", "segments": [{"kind": "prompt", "text": "p"},
                                                            {"kind": "tool", "text": "x"}]})


# ------------------------------------------------------------------ a hand-checkable encoder


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_tokenize_with_character_encoder():
    t = Transcript("q")
    t.append_prompt("ab")
    t.append_turn("cd")
    t.append_information("q", [], block="e")
    tok = t.tokenize(chars)
    assert tok.ids == [97, 98, 99, 100, 101]
    assert tok.mask == [0, 0, 1, 1, 0]
    assert tok.prompt_length == 2

    t.append_turn("fg", token_ids=[7])           # sampled ids are kept as given
    t.append_feedback()
    tok = t.tokenize(chars)
    fb = protocol.INVALID_ACTION_FEEDBACK
    assert tok.ids == [97, 98, 99, 100, 101, 7] + [ord(c) for c in fb]
    assert tok.mask == [0, 0, 1, 1, 0, 1] + [0] * len(fb)


def test_tokenize_edge_cases():
    assert Transcript("q").tokenize(chars) == TokenizedTranscript([], [])
    t = Transcript("q")
    t.append_prompt("ab")
    assert t.tokenize(chars).prompt_length == 2       # no turn yet: all of it is prompt
    t.append_turn("", token_ids=[])
    assert t.tokenize(chars).mask == [0, 0]
    assert TokenizedTranscript([5, 6], [1, 1]).prompt_length == 0


def test_encoder_for_callable_is_used_as_is():
    assert encoder_for(chars) is chars


# ------------------------------------------------------------------ the real Qwen tokenizer


def test_encoder_for_agrees_across_libraries(fast_tokenizer, hf_tokenizer, transcript):
    fast, hf = encoder_for(fast_tokenizer), encoder_for(hf_tokenizer)
    for s in transcript.segments:
        assert fast(s.text) == hf(s.text)
        assert all(isinstance(i, int) for i in hf(s.text))
    # special tokens written in the text are recognised, and nothing is added
    im_start = fast_tokenizer.token_to_id("<|im_start|>")
    assert fast("<|im_start|>") == hf("<|im_start|>") == [im_start]
    assert fast("") == hf("") == []


def test_tokenize_with_qwen(qwen, transcript):
    encode, decode = qwen
    tok = transcript.tokenize(encode)
    assert len(tok.ids) == len(tok.mask)
    assert set(tok.mask) == {0, 1}
    assert decode(tok.ids) == transcript.text
    assert tok.prompt_length == len(encode(transcript.prompt))
    assert tok.ids[:tok.prompt_length] == encode(transcript.prompt)

    generated = [i for i, m in zip(tok.ids, tok.mask) if m]
    forced = [i for i, m in zip(tok.ids, tok.mask) if not m]
    assert decode(generated) == "".join(s.text for s in transcript.turns())
    assert decode(forced) == "".join(s.text for s in transcript.segments if not s.generated)

    # segment by segment: each run of the mask is exactly one segment's own ids
    pos = 0
    for s in transcript.segments:
        ids = encode(s.text)
        assert tok.ids[pos:pos + len(ids)] == ids
        assert tok.mask[pos:pos + len(ids)] == [int(s.generated)] * len(ids)
        pos += len(ids)
    assert pos == len(tok.ids)


def test_sampled_ids_are_kept_even_when_not_canonical(qwen):
    encode, decode = qwen
    par, is_ = encode("Par"), encode("is")
    assert encode("<answer> Paris </answer>") != encode("<answer> Par") + encode("is </answer>")
    sampled = encode("<answer> Par") + is_ + encode(" </answer>")   # "Paris" as two tokens
    assert len(par) == 1 and len(is_) == 1

    t = Transcript("q")
    t.append_prompt("<|im_start|>user\nq?<|im_end|>\n<|im_start|>assistant\n")
    t.append_turn("<answer> Paris </answer>", token_ids=sampled)
    tok = t.tokenize(encode)
    assert tok.ids[tok.prompt_length:] == sampled
    assert tok.mask[tok.prompt_length:] == [1] * len(sampled)
    assert decode(tok.ids) == t.text
    assert t.answer() == "Paris"


# Boundaries, measured with the Qwen2 BPE (pre-tokenizer regex shared by Qwen2, 2.5 and 3):
# a boundary agrees when whole-text encoding gives the same ids as encoding the two
# segments apart. Only generated-then-forced boundaries can disagree here, because the
# pre-tokenizer glues a punctuation run to the newlines after it (">\n\n" is one token).
AGREEING_BOUNDARIES = [
    ("prompt -> turn", "<|im_start|>assistant\n", "<think>x</think>\n<search>q</search>"),
    ("information -> turn", "\n\n<information>Doc 1(Title: \"T\") x</information>\n\n", "<think>y</think>"),
    ("information -> plain-text turn", "x</information>\n\n", "The answer"),
    ("feedback -> turn", protocol.INVALID_ACTION_FEEDBACK, "<think>retry</think>"),
    ("turn ending in a word -> feedback", "I am not sure", protocol.INVALID_ACTION_FEEDBACK),
    ("turn ending in </think> (an added token) -> feedback", "<think>hmm</think>",
     protocol.INVALID_ACTION_FEEDBACK),
    ("</answer> -> end of turn token", "<answer>x</answer>", "<|im_end|>"),
]

DISAGREEING_BOUNDARIES = [
    # the search boundary: ">" + "\n\n" as two tokens apart, ">\n\n" as one token whole
    ("turn ending in </search> -> information", "<search>q</search>",
     protocol.information_block(PASSAGES[:1])),
    # any '>' glues the same way (e.g. "</think>" for a tokenizer where it is plain text)
    ("turn ending in '>' -> feedback", "<answer>x</answer>", protocol.INVALID_ACTION_FEEDBACK),
    ("turn ending in punctuation -> feedback", "Let me think.", protocol.INVALID_ACTION_FEEDBACK),
    # the documented counterexample: "\n" + "\n" apart, "\n\n" whole
    ("turn ending in newline -> feedback", "<think>hmm</think>\n", protocol.INVALID_ACTION_FEEDBACK),
]


@pytest.mark.parametrize("name, left, right", AGREEING_BOUNDARIES, ids=[b[0] for b in AGREEING_BOUNDARIES])
def test_boundaries_where_segments_and_whole_text_agree(qwen, name, left, right):
    encode, decode = qwen
    assert encode(left) + encode(right) == encode(left + right)


@pytest.mark.parametrize("name, left, right", DISAGREEING_BOUNDARIES,
                         ids=[b[0] for b in DISAGREEING_BOUNDARIES])
def test_boundaries_where_segments_and_whole_text_differ(qwen, name, left, right):
    encode, decode = qwen
    t = Transcript("q")
    t.append_prompt("<|im_start|>assistant\n")
    t.append_turn(left)
    t.segments.append(Segment("feedback" if right.startswith("\nMy") else "information", right))
    tok = t.tokenize(encode)
    whole = encode(t.text)
    assert tok.ids != whole
    assert decode(tok.ids) == decode(whole) == t.text
    # the segment-wise ids are what training masks and KV-cache reuse rely on
    assert tok.ids == encode(t.prompt) + encode(left) + encode(right)


def test_newline_counterexample_token_counts(fast_tokenizer):
    encode = encoder_for(fast_tokenizer)
    nl, nlnl = encode("\n"), encode("\n\n")
    assert len(nl) == 1 and len(nlnl) == 1
    assert encode("x\n") + encode("\nMy") != encode("x\n\nMy")
    assert encode("x\n\nMy") == encode("x") + nlnl + encode("My")


def test_full_transcript_whole_text_differs_only_at_glued_boundaries(qwen, transcript):
    # The realistic transcript has one glued boundary (</search> -> "\n\n<information>"):
    # whole-text encoding is one token shorter there; everything else lines up.
    encode, decode = qwen
    tok = transcript.tokenize(encode)
    whole = encode(transcript.text)
    assert decode(whole) == decode(tok.ids) == transcript.text
    assert len(whole) == len(tok.ids) - 1
