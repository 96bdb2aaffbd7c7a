"""One question and everything the agent did for it, built from agent events.

`Recorder.feed(event)` turns the agent's event stream into an `Exchange`: the
steps (each turn's thinking, its search and the passages it returned, invalid
turns), the answer as it streams, the sources and the timings. The chat view
renders an `Exchange` and the history store saves it as JSON, so a reopened
chat looks like the live one did.

A turn is shown while it streams, so its text is read before it is complete:
`turn_view` splits partial text into the visible reasoning and the answer so
far, holding back a tag that is only half written ("</ans") so neither part
ever flickers a fragment of markup.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dgpo_edge.agent import events as ev
from dgpo_edge.protocol import Passage

_TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>")


@dataclass
class Source:
    """A passage as the chat shows and stores it."""

    id: str
    title: str
    text: str = ""

    @classmethod
    def of(cls, passage: Passage) -> Source:
        return cls(passage.id, passage.title, passage.text)


@dataclass
class Step:
    """One visible step: `think` (a turn's reasoning), `search` (query + passages) or `invalid`."""

    kind: str
    turn: int
    text: str = ""
    query: str = ""
    passages: list[Source] = field(default_factory=list)
    retrieval_ms: float | None = None


@dataclass
class Exchange:
    """A question, its steps and its outcome; `stop_reason` is empty while it runs."""

    question: str
    answer: str | None = None
    stop_reason: str = ""
    steps: list[Step] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    sources_cited: bool = False  # True: passages holding the answer; False: all that were read
    new_tokens: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def finished(self) -> bool:
        return bool(self.stop_reason)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Exchange:
        steps = [Step(**{**s, "passages": [Source(**p) for p in s.get("passages", [])]})
                 for s in d.get("steps", [])]
        return cls(question=d["question"], answer=d.get("answer"), stop_reason=d.get("stop_reason", ""),
                   steps=steps, sources=[Source(**s) for s in d.get("sources", [])],
                   sources_cited=bool(d.get("sources_cited", False)),
                   new_tokens=int(d.get("new_tokens", 0)), seconds=float(d.get("seconds", 0.0)),
                   error=d.get("error", ""))


# --- reading a turn while it streams ---------------------------------------------------------------

def _hold_back(text: str) -> str:
    """`text` without a trailing, half-written protocol tag ("<", "</ans", "<sear")."""
    i = text.rfind("<")
    if i == -1:
        return text
    tail = text[i:]
    return text[:i] if any(tag.startswith(tail) and tag != tail for tag in _TAGS) else text


def turn_view(text: str) -> tuple[str, str | None]:
    """(reasoning, answer-so-far) of a turn's generated text, complete or not.

    The reasoning is the text before the turn's first `<search>` or `<answer>`,
    without `<think>` tags (a base model may not use them at all; whatever it
    writes before acting is its reasoning). The answer is the text after
    `<answer>`, up to `</answer>` when that has arrived; None before `<answer>`.
    """
    cut = min((i for i in (text.find("<search>"), text.find("<answer>")) if i != -1), default=len(text))
    reasoning = _hold_back(text[:cut]).replace("<think>", "").replace("</think>", "").strip()
    start = text.find("<answer>")
    if start == -1 or start > cut:
        return reasoning, None
    rest = text[start + len("<answer>"):]
    end = rest.find("</answer>")
    answer = rest[:end] if end != -1 else _hold_back(rest)
    return reasoning, answer.strip()


# --- events -> exchange ---------------------------------------------------------------------------

@dataclass
class Live:
    """Figures for the status bar, updated as events arrive."""

    turn: int | None = None
    tokens_per_s: float | None = None
    retrieval_ms: float | None = None


class Recorder:
    """Builds an `Exchange` from one run's events, in order."""

    def __init__(self, question: str):
        self.exchange = Exchange(question)
        self.live = Live()
        self._turn_text = ""

    def feed(self, event: ev.Event) -> None:
        x = self.exchange
        if isinstance(event, ev.TurnStarted):
            self._turn_text = ""
            self.live.turn = event.turn
            x.steps.append(Step("think", event.turn))
        elif isinstance(event, ev.TokenDelta):
            self._turn_text += event.text
            reasoning, answer = turn_view(self._turn_text)
            self._think_step(event.turn).text = reasoning
            if answer is not None:
                x.answer = answer
        elif isinstance(event, ev.SearchIssued):
            x.steps.append(Step("search", event.turn, query=event.query))
        elif isinstance(event, ev.PassagesRetrieved):
            step = self._search_step(event.turn, event.query)
            step.passages = [Source.of(p) for p in event.passages]
            step.retrieval_ms = event.retrieval_ms
            self.live.retrieval_ms = event.retrieval_ms
        elif isinstance(event, ev.InvalidAction):
            x.steps.append(Step("invalid", event.turn))
        elif isinstance(event, ev.TurnFinished):
            self.live.tokens_per_s = event.tokens_per_s
        elif isinstance(event, (ev.Answered, ev.Failed)):
            self._finish(event)

    def fail(self, error: str) -> None:
        """The run raised instead of ending with a terminal event."""
        self.exchange.stop_reason, self.exchange.error = "error", error

    def interrupt(self) -> None:
        """The app quits while the run streams: end the exchange as a stop, as Esc would have
        (the agent's own `Failed("stopped")` would arrive after the app has gone). As for a
        stop, a half-written answer is not an answer and the sources are the passages read."""
        x = self.exchange
        x.stop_reason, x.answer = "stopped", None
        read: dict[str, Source] = {}
        for step in x.steps:
            for p in step.passages:
                read.setdefault(p.id, p)
        x.sources = list(read.values())

    def _finish(self, event: ev.Answered | ev.Failed) -> None:
        x, result = self.exchange, event.result
        x.answer = result.answer
        x.stop_reason = result.stop_reason if isinstance(event, ev.Failed) else "answer"
        if isinstance(event, ev.Failed):
            x.error = _detail(event.reason, x.stop_reason)
        x.sources_cited = bool(result.cited)
        x.sources = [Source.of(p) for p in (result.cited or _unique(result.passages))]
        x.new_tokens = result.timings.new_tokens
        x.seconds = result.timings.total_s

    def _think_step(self, turn: int) -> Step:
        for step in reversed(self.exchange.steps):
            if step.kind == "think" and step.turn == turn:
                return step
        step = Step("think", turn)  # a delta without TurnStarted: tolerate it
        self.exchange.steps.append(step)
        return step

    def _search_step(self, turn: int, query: str) -> Step:
        last = self.exchange.steps[-1] if self.exchange.steps else None
        if last is not None and last.kind == "search" and last.turn == turn:
            return last
        step = Step("search", turn, query=query)
        self.exchange.steps.append(step)
        return step


def _detail(reason: str, stop_reason: str) -> str:
    """What a `Failed` reason adds to its stop reason ("timeout: after 30 s" -> "after 30 s")."""
    if reason == stop_reason:
        return ""
    head = stop_reason + ":"
    return reason[len(head):].strip() if reason.startswith(head) else reason


def _unique(passages: list[Passage]) -> list[Passage]:
    seen: dict[str, Passage] = {}
    for p in passages:
        seen.setdefault(p.id, p)
    return list(seen.values())
