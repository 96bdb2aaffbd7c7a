"""Reading streamed turns, building an exchange from events, and the status line."""

from __future__ import annotations

import pytest

from dgpo_edge.agent import events as ev
from dgpo_edge.apps.chat.exchange import Exchange, Recorder, turn_view
from dgpo_edge.protocol import Passage
from dgpo_edge.transcript import Transcript

PERU = Passage("p1", '"Peru — Government"\nThe capital of Peru is Lima.')
CHILE = Passage("p2", '"Chile — Government"\nThe capital of Chile is Santiago.')


@pytest.mark.parametrize("text, expected", [
    ("", ("", None)),
    ("<think>I should", ("I should", None)),
    ("<think>I should search</thi", ("I should search", None)),       # half a closing tag is held back
    ("<think>a</think>\n<sea", ("a", None)),
    ("<think>a</think>\n<search> capital of Peru", ("a", None)),     # the query is the search step's
    ("no tags at all, just words", ("no tags at all, just words", None)),
    ("<think>a</think><answer> Li", ("a", "Li")),
    ("<think>a</think><answer> Lima </ans", ("a", "Lima")),
    ("<think>a</think><answer> Lima </answer>", ("a", "Lima")),
    ("<answer>**Lima** and\n\n- a list</answer> trailing", ("", "**Lima** and\n\n- a list")),
    ("x < y and <b>bold</b>", ("x < y and <b>bold</b>", None)),       # other "<" is kept
    ("<search> q </search><answer> A </answer>", ("", None)),         # the first action wins
])
def test_turn_view(text, expected):
    assert turn_view(text) == expected


def test_the_answer_only_grows_while_it_streams():
    text = "<think>ok</think>\n<answer> The capital is **Lima** </answer>"
    answers = [turn_view(text[:i])[1] for i in range(len(text) + 1)]
    shown = [a for a in answers if a]
    assert shown[-1] == "The capital is **Lima**"
    assert all(b.startswith(a) for a, b in zip(shown, shown[1:]))


def run_events() -> list:
    t = Transcript("q")
    t.append_prompt("prompt")
    result = ev.AgentResult("Capital of Chile?", "Santiago", t, searches=["capital of Chile"],
                            passages=[PERU, CHILE, CHILE], cited=[CHILE])
    result.timings.new_tokens, result.timings.total_s = 30, 2.5
    return [
        ev.TurnStarted(0), ev.TokenDelta(0, "<think>Search"), ev.TokenDelta(0, " first.</think>"),
        ev.TokenDelta(0, "<search> capital of Chile </search>"),
        ev.TurnFinished(0, 12, 100, 0.5, 24.0),
        ev.SearchIssued(0, "capital of Chile"),
        ev.PassagesRetrieved(0, "capital of Chile", (PERU, CHILE), 7.25),
        ev.TurnStarted(1), ev.TokenDelta(1, "hmm"), ev.TurnFinished(1, 2, 10, 0.1, 20.0), ev.InvalidAction(1),
        ev.TurnStarted(2), ev.TokenDelta(2, "<answer> Santi"), ev.TokenDelta(2, "ago </answer>"),
        ev.TurnFinished(2, 16, 10, 0.5, 32.0),
        ev.Answered(result),
    ]


def test_recorder_builds_steps_sources_and_live_figures():
    rec = Recorder("Capital of Chile?")
    events = run_events()
    for e in events[:7]:
        rec.feed(e)
    assert (rec.live.turn, rec.live.tokens_per_s, rec.live.retrieval_ms) == (0, 24.0, 7.25)
    assert not rec.exchange.finished
    for e in events[7:]:
        rec.feed(e)
    x = rec.exchange
    assert [(s.kind, s.turn) for s in x.steps] == [("think", 0), ("search", 0), ("think", 1), ("invalid", 1),
                                                   ("think", 2)]
    assert x.steps[0].text == "Search first."
    assert x.steps[1].query == "capital of Chile" and [p.title for p in x.steps[1].passages] == [
        "Peru — Government", "Chile — Government"]
    assert x.steps[2].text == "hmm" and x.steps[4].text == ""
    assert (x.answer, x.stop_reason, x.new_tokens, x.seconds) == ("Santiago", "answer", 30, 2.5)
    assert x.sources_cited and [s.id for s in x.sources] == ["p2"]
    assert Exchange.from_dict(x.to_dict()) == x


def test_a_failed_run_lists_what_was_read():
    t = Transcript("q")
    t.append_prompt("prompt")
    result = ev.AgentResult("q", None, t, passages=[PERU, CHILE, PERU], stop_reason="stopped")
    rec = Recorder("q")
    rec.feed(ev.TurnStarted(0))
    rec.feed(ev.Failed("stopped", result))
    x = rec.exchange
    assert (x.answer, x.stop_reason, x.error) == (None, "stopped", "")
    assert not x.sources_cited and [s.id for s in x.sources] == ["p1", "p2"]  # unique, in order
    rec.fail("RuntimeError: boom")
    assert (x.stop_reason, x.error) == ("error", "RuntimeError: boom")


def test_status_line():
    pytest.importorskip("textual")
    from dgpo_edge.apps.chat.widgets import Status, status_line

    assert status_line(Status()) == "loading the model… │ turn –/5 │ – tok/s │ retrieval – ms │ top-k 3"
    s = Status("generating…", turn=1, turn_limit=5, tokens_per_s=12.345, retrieval_ms=3.6, top_k=4)
    assert status_line(s) == "generating… │ turn 2/5 │ 12.3 tok/s │ retrieval 4 ms │ top-k 4"


def test_an_interrupted_run_is_kept_as_a_stop_with_the_passages_read():
    """Quitting mid-run: what streamed stays, as Esc's stop would leave it (no half answer)."""
    r = Recorder("capital of Peru")
    for e in [ev.TurnStarted(0), ev.SearchIssued(0, "peru"), ev.PassagesRetrieved(0, "peru", (PERU, CHILE), 3.0),
              ev.TurnStarted(1), ev.SearchIssued(1, "chile"), ev.PassagesRetrieved(1, "chile", (CHILE,), 2.0),
              ev.TurnStarted(2), ev.TokenDelta(2, "<answer> Li")]:
        r.feed(e)
    assert r.exchange.answer == "Li"
    r.interrupt()
    x = r.exchange
    assert (x.stop_reason, x.answer, x.sources_cited) == ("stopped", None, False)
    assert [s.id for s in x.sources] == ["p1", "p2"]
