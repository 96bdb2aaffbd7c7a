"""The episode state machine (dgpo_edge/episode.py) and the two loops that drive it.

The machine on its own, over a byte encoder: every transition, the final-turn rule, the turn,
total and observation budgets, ids / mask / logprobs, misuse. Then the laptop agent and the
training rollout loop over the same scripted model outputs (one byte-level ScriptedEngine
behind both): the same transcript, ids, mask and ending.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from engine_fakes import ListRetriever, ScriptedEngine

from dgpo_edge import protocol
from dgpo_edge.agent import Agent
from dgpo_edge.episode import Episode
from dgpo_edge.protocol import Passage, ProtocolConfig

PASSAGES = [Passage(str(i), f'"Peru {i}"\nThe capital of Peru is Lima, fact {i}.') for i in range(5)]
QUESTION = "What is the capital of Peru"
SEARCH, ANSWER, INVALID = "<search> Peru </search>", "<answer> Lima </answer>", "I am not sure."
PROMPT_LEN = len(protocol.render_prompt(QUESTION).encode("utf-8"))


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def start(**limits) -> Episode:
    return Episode(QUESTION, protocol.render_prompt(QUESTION), encode, ProtocolConfig(**limits))


def turn(e: Episode, text: str, logprobs: bool = False):
    ids = encode(text)
    return e.add_turn(text, ids, [-0.5] * len(ids) if logprobs else None)


# ------------------------------------------------------------------ the machine

def test_search_then_answer():
    e = start()
    assert (e.turn, e.final, e.done) == (0, False, False)
    step = turn(e, f"<think>look</think>\n{SEARCH}")
    assert (step.kind, step.query, e.turn, e.done) == ("search", "Peru", 0, False)
    shown = e.observe("Peru", PASSAGES)
    assert shown == PASSAGES[:3] and e.turn == 1          # top_k passages, a turn used
    step = turn(e, ANSWER)
    assert (step.kind, step.action.content, e.finish, e.done) == ("answer", "Lima", "answer", True)
    assert [s.kind for s in e.transcript.segments] == ["prompt", "turn", "information", "turn"]
    assert e.transcript.segments[2].text == protocol.information_block(PASSAGES[:3])


def test_a_block_built_by_the_caller_is_the_one_observe_builds():
    # Rollouts hand over a round's blocks with their ids (built in batch calls): the same episode.
    mine, given = start(max_obs_tokens=40), start(max_obs_tokens=40)
    for e in (mine, given):
        turn(e, SEARCH)
    mine.observe("Peru", PASSAGES)
    assert given.shown(PASSAGES) == PASSAGES[:3]       # what a caller builds the block for
    text = given.blocks(given.shown(PASSAGES), 40)
    assert given.observe("Peru", PASSAGES, block=(text, encode(text))) == PASSAGES[:3]
    assert (given.ids, given.mask, given.logprobs, given.turn) == (mine.ids, mine.mask, mine.logprobs, mine.turn)
    assert given.transcript.text == mine.transcript.text


def test_invalid_turn_gets_feedback_and_uses_a_turn():
    e = start()
    step = turn(e, INVALID)
    assert step.kind == "invalid" and e.turn == 1 and not e.done
    assert e.transcript.segments[-1].kind == "feedback"
    assert e.transcript.segments[-1].text == protocol.INVALID_ACTION_FEEDBACK
    assert e.ids[-len(encode(protocol.INVALID_ACTION_FEEDBACK)):] == encode(protocol.INVALID_ACTION_FEEDBACK)


@pytest.mark.parametrize("last, kind, finish", [(SEARCH, "final", "final"), (INVALID, "final", "final"),
                                                (ANSWER, "answer", "answer")])
def test_final_turn_does_not_search(last, kind, finish):
    e = start(max_searches=2)
    turn(e, SEARCH)
    e.observe("Peru", PASSAGES)
    turn(e, INVALID)
    assert e.final and e.turn == 2
    n_segments = len(e.transcript.segments)
    assert turn(e, last).kind == kind and e.finish == finish
    assert len(e.transcript.segments) == n_segments + 1    # the turn only: no information, no feedback


def test_zero_searches_means_one_final_turn():
    e = start(max_searches=0)
    assert e.final
    assert turn(e, SEARCH).kind == "final" and e.finish == "final"


def test_turn_and_total_budgets():
    prompt_len = PROMPT_LEN
    e = start(max_turn_tokens=10, max_total_tokens=prompt_len + 25)
    assert e.turn_tokens() == 10                                     # the turn limit
    turn(e, "x" * 10)                                                # invalid: + feedback
    assert e.turn_tokens() == 0 and e.finish == "budget" and e.done  # feedback overflows the total
    e = start(max_turn_tokens=10, max_total_tokens=prompt_len + 6)
    assert e.turn_tokens() == 6 and not e.done                       # the room left, below the turn limit
    e2 = Episode(QUESTION, protocol.render_prompt(QUESTION), encode, ProtocolConfig(), max_tokens=prompt_len + 4)
    assert e2.budget == prompt_len + 4 and e2.turn_tokens() == 4     # the engine's context caps it


def test_observation_budget_counts_with_the_given_counter():
    words = []
    e = Episode(QUESTION, "p", encode, ProtocolConfig(max_obs_tokens=12, top_k=5),
                count_tokens=lambda text: words.append(text) or len(text.split()))
    turn(e, SEARCH)
    e.observe("Peru", PASSAGES)
    block = e.transcript.segments[-1].text
    assert words and len(block.split()) <= 12 < len(protocol.information_block(PASSAGES).split())
    assert e.ids[-len(encode(block)):] == encode(block)


def test_ids_mask_and_logprobs_are_the_transcripts():
    e = start()
    turn(e, SEARCH, logprobs=True)
    e.observe("Peru", PASSAGES)
    turn(e, INVALID, logprobs=True)
    turn(e, ANSWER, logprobs=True)
    tok = e.transcript.tokenize(encode)
    assert (e.ids, e.mask) == (tok.ids, tok.mask)
    assert len(e.logprobs) == len(e.ids)
    assert all((lp == -0.5) == bool(m) for lp, m in zip(e.logprobs, e.mask))
    assert sum(e.mask) == len(encode(SEARCH + INVALID + ANSWER))


def test_misuse_is_refused_and_leaves_the_state_alone():
    e = start()
    with pytest.raises(ValueError, match="logprobs"):
        e.add_turn(SEARCH, encode(SEARCH), [0.0])
    assert len(e.transcript.segments) == 1 + 1 and len(e.ids) == len(e.logprobs)
    e = start()
    turn(e, SEARCH)
    with pytest.raises(RuntimeError, match="waiting on passages"):
        turn(e, ANSWER)
    with pytest.raises(RuntimeError, match="no search for 'Chile'"):
        e.observe("Chile", PASSAGES)
    e.observe("Peru", PASSAGES)
    with pytest.raises(RuntimeError, match="no search"):
        e.observe("Peru", PASSAGES)
    turn(e, ANSWER)
    with pytest.raises(RuntimeError, match="over"):
        turn(e, ANSWER)


def test_record_then_decide_is_add_turn():
    a, b = start(), start()
    for text in (INVALID, SEARCH):
        step_a = turn(a, text)
        step_b = b.decide(b.record_turn(text, encode(text)))
        assert step_a == step_b
    assert a.transcript.to_dict() == b.transcript.to_dict() and a.ids == b.ids


# ------------------------------------------------------------------ agent and rollout agree

class ScriptedDecoder:
    """The rollout engine interface (`decode(prefixes, max_new, ...)`) over a ScriptedEngine."""

    def __init__(self, turns: list[str]):
        self.engine = ScriptedEngine(turns)

    def decode(self, prefixes, max_new, sampling, generator, resume=False):
        out = []
        for ids, n in zip(prefixes, max_new):
            gen = self.engine.generate(list(ids), n)
            for _ in gen:
                pass
            out.append(SimpleNamespace(ids=list(gen.result.token_ids), logprobs=[0.0] * len(gen.result.token_ids)))
        return out


class ByteTokenizer:
    """The tokenizer side of the scripted engine, as rollout.py calls it."""

    chat_template = None

    def __init__(self, engine: ScriptedEngine):
        self.engine = engine

    def encode(self, text, add_special_tokens=False):
        return self.engine.encode(text)

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return self.engine.decode(ids)


SCRIPTS = {  # model turns, limits, how the episode ends
    "search, answer": ([f"<think>a</think>\n{SEARCH}\n\nignored", ANSWER], {}, "answer"),
    "invalid, search, answer": ([INVALID, SEARCH, ANSWER], {}, "answer"),
    "searches until the final turn": ([SEARCH, SEARCH, SEARCH], {"max_searches": 2}, "final"),
    "answer at once": ([ANSWER], {"max_searches": 0}, "answer"),
    "turn budget cuts the answer": (["<answer> Lima Lima Lima </answer>", ANSWER], {"max_turn_tokens": 24},
                                    "answer"),
    "total budget": ([SEARCH] * 4, {"max_total_tokens": PROMPT_LEN + 100, "max_obs_tokens": 30}, "budget"),
}
ENDINGS = {"answer": "answer", "final": "max_turns", "budget": "token_budget"}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_agent_and_rollout_play_the_same_episode(name):
    rollout = pytest.importorskip("dgpo_edge.train.rollout")
    turns, limits, ending = SCRIPTS[name]
    config = ProtocolConfig(**limits)
    agent = Agent(ScriptedEngine(turns), ListRetriever(PASSAGES), config)
    laptop = agent.answer(QUESTION)

    decoder = ScriptedDecoder(turns)
    tokenizer = ByteTokenizer(decoder.engine)
    rconfig = rollout.RolloutConfig(protocol=config)
    episode = Episode(QUESTION, rollout.render(QUESTION, tokenizer, rconfig), tokenizer.encode, config)
    rollout._play([episode], decoder, tokenizer, ListRetriever(PASSAGES), rconfig, None)
    trained = rollout._result(episode, ("Lima",))

    assert trained.transcript.to_dict() == laptop.transcript.to_dict()
    tok = laptop.transcript.tokenize(agent.engine.encode)
    assert (trained.token_ids, trained.loss_mask) == (tok.ids, tok.mask)
    assert trained.finish == ending and ENDINGS[ending] == laptop.stop_reason
    assert trained.answer == laptop.answer and trained.n_searches == len(laptop.searches)
    assert trained.n_invalid == laptop.transcript.n_invalid
