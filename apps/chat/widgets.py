"""Widgets of the chat view: one exchange (steps, answer, sources) and the status bar.

Widgets render an `Exchange` (see exchange.py): `ExchangeView.sync()` mounts
the steps that are new and refreshes the ones that changed, so the same code
draws a run as it streams and a chat reopened from the history.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import Collapsible, Input, Markdown, Static

from ...termtext import printable
from .exchange import Exchange, Live, Step

SNIPPET_CHARS = 240

_STOP_REASONS = {
    "stopped": "Stopped.",
    "max_turns": "No answer: the turn limit was reached.",
    "token_budget": "No answer: the token budget ran out.",
    "timeout": "No answer: the time limit was reached.",
    "error": "No answer: the run failed.",
}


def step_title(step: Step) -> str:
    """The one-line header of a step's collapsible."""
    n = step.turn + 1
    if step.kind == "think":
        return f"Turn {n} · thinking"
    if step.kind == "search":
        found = "searching…" if step.retrieval_ms is None else (
            f"{len(step.passages)} passage{'s' * (len(step.passages) != 1)} · {step.retrieval_ms:.0f} ms")
        return f"Turn {n} · search “{printable(step.query)}” · {found}"
    return f"Turn {n} · no search or answer: feedback sent"


def passages_text(step: Step) -> Text:
    """Each retrieved passage as a bold numbered title and a snippet of its text."""
    out = Text()
    for i, p in enumerate(step.passages, start=1):
        snippet = " ".join(printable(p.text).split())
        if len(snippet) > SNIPPET_CHARS:
            snippet = snippet[:SNIPPET_CHARS - 1].rstrip() + "…"
        out.append(f"{i}. {printable(p.title)}\n", style="bold")
        out.append(snippet + ("\n" if i < len(step.passages) else ""))
    return out or Text("(no passages)", style="italic")


def outcome_text(x: Exchange) -> Text:
    """Sources with titles (or why there is no answer) under a finished exchange."""
    out = Text()
    if x.stop_reason and x.stop_reason != "answer":
        label = _STOP_REASONS.get(x.stop_reason, f"No answer: {x.stop_reason}.")
        if x.error:  # the detail: "after 30 s", "4100 of 4096 tokens used", the engine's message
            error = printable(x.error)
            label = f"{label[:-1]}: {error}" if x.stop_reason == "error" else f"{label} ({error})"
        out.append(label, style="bold")
    if x.sources:
        if out:
            out.append("\n")
        out.append("Sources" if x.sources_cited else "Passages read", style="bold")
        for i, s in enumerate(x.sources, start=1):
            out.append(f"\n [{i}] {printable(s.title)}")
    return out


class StepView(Collapsible):
    """One step, collapsible: a turn's reasoning, a search and its passages, or an invalid turn."""

    def __init__(self, step: Step, collapsed: bool) -> None:
        self.step = step
        self.body = Static(classes="step-body")
        super().__init__(self.body, title=escape(step_title(step)), collapsed=collapsed,
                         classes=f"step -{step.kind}")
        self._shown: tuple | None = None

    def on_mount(self) -> None:
        self.sync()

    def sync(self) -> None:
        """Redraw when the step changed (a think step grows while its turn streams)."""
        s = self.step
        shown = (s.text, s.retrieval_ms, len(s.passages))
        if shown == self._shown:
            return
        self._shown = shown
        self.title = escape(step_title(s))  # a title is markup: a query's "[bold]" is shown as written
        self.set_class(s.kind == "think" and not s.text, "-empty")
        if s.kind == "think":
            self.body.update(Text(printable(s.text)))
        elif s.kind == "search":
            self.body.update(passages_text(s))
        else:
            self.body.update(Text("The turn had neither <search> nor <answer>; the agent asked it to retry."))


class ExchangeView(Vertical):
    """A question, its steps, the answer (markdown, streamed) and the sources."""

    def __init__(self, exchange: Exchange, collapsed: bool = False) -> None:
        super().__init__(classes="exchange")
        self.exchange = exchange
        self.collapsed = collapsed
        self._answer = ""

    def compose(self) -> ComposeResult:
        yield Static(Text(printable(self.exchange.question)), classes="question")
        yield Vertical(classes="steps")
        yield Markdown(classes="answer")
        yield Static(classes="outcome")

    async def sync(self) -> None:
        """Bring the view up to date with `self.exchange` (mutated by a Recorder)."""
        steps = self.query_one(".steps", Vertical)
        views = list(steps.query_children(StepView))
        for view in views:
            view.sync()
        new = self.exchange.steps[len(views):]
        if new:
            # Search results start folded while a run streams; every step starts folded when reopened.
            await steps.mount_all(StepView(s, self.collapsed or s.kind == "search") for s in new)
        await self._sync_answer()
        x = self.exchange
        self.set_class(x.finished, "-finished")
        self.set_class(x.finished and x.stop_reason != "answer", "-failed")
        if x.finished:
            self.query_one(".outcome", Static).update(outcome_text(x))

    async def _sync_answer(self) -> None:
        answer = printable(self.exchange.answer or "")  # whole, so an escape split across deltas goes too
        if answer == self._answer:
            return
        md = self.query_one(".answer", Markdown)
        if answer.startswith(self._answer) and self._answer:
            await md.append(answer[len(self._answer):])
        else:
            await md.update(answer)
        self._answer = answer
        self.set_class(bool(answer), "-answered")


class QuestionInput(Input):
    """The question box: pasted text of several lines becomes one line.

    Textual's `Input` keeps only the first line of a paste, so a question pasted from a
    note or an email would silently lose the rest and be asked cut short.
    """

    def on_paste(self, event: events.Paste) -> None:
        lines = [line.strip() for line in event.text.splitlines()]
        text = " ".join(line for line in lines if line)
        if text:
            if self.selection.is_empty:
                self.insert_text_at_cursor(text)
            else:
                self.replace(text, *self.selection)
        event.stop()
        event.prevent_default()  # Input's own paste handler would insert the first line again


@dataclass
class Status:
    """What the status bar shows."""

    state: str = "loading the model…"
    turn: int | None = None
    turn_limit: int = 5            # the searches and the final answer-only turn
    tokens_per_s: float | None = None
    retrieval_ms: float | None = None
    top_k: int = 3

    def take(self, live: Live) -> None:
        self.turn, self.tokens_per_s, self.retrieval_ms = live.turn, live.tokens_per_s, live.retrieval_ms


def status_line(s: Status) -> str:
    """`state │ turn 2/5 │ 12.3 tok/s │ retrieval 4 ms │ top-k 3`; unknown figures show as –."""
    turn = "–" if s.turn is None else str(s.turn + 1)
    tps = "–" if s.tokens_per_s is None else f"{s.tokens_per_s:.1f}"
    ms = "–" if s.retrieval_ms is None else f"{s.retrieval_ms:.0f}"
    return f"{s.state} │ turn {turn}/{s.turn_limit} │ {tps} tok/s │ retrieval {ms} ms │ top-k {s.top_k}"


class StatusBar(Static):
    """One line under the input: run state, turn, decode speed, retrieval time, top-k."""

    def show(self, status: Status) -> None:
        self.update(Text(status_line(status)))  # Text: a path in the state ("/m/[old]/x.gguf") is not markup
