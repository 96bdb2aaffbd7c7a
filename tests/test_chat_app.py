"""The chat TUI under Textual's pilot and in snapshots.

The app runs the real `Agent` over a real BM25 retriever on a tiny real
`PassageStore`. Only the model is replaced: `ChatEngine` (the shared
`engine_fakes.ScriptedEngine`) implements the `Engine` interface (tokenizer,
KV-cache hooks, logits) and its logits pick, one byte-token at a time, the
next byte of a fixed script of turns.
Why not a real model: snapshots must be identical on every run and machine,
and pilot tests must finish in milliseconds; a sampled LLM gives neither.
Everything else - the decoding loop, stop strings, action parsing, the
transcript, information blocks, budgets, the stop event - is the real code.
The one test with a real model (SmolLM2's GGUF through `load_agent`) is in
test_chat_real.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("textual")

from textual.widgets import Button, Input, Markdown, OptionList  # noqa: E402

from dgpo_edge.agent import Agent  # noqa: E402
from dgpo_edge.agent import events as ev  # noqa: E402
from dgpo_edge.apps.chat.app import ChatApp  # noqa: E402
from dgpo_edge.apps.chat.exchange import Recorder  # noqa: E402
from dgpo_edge.apps.chat.screens import HistoryScreen, Settings, SettingsScreen  # noqa: E402
from dgpo_edge.apps.chat.storage import ChatStore  # noqa: E402
from dgpo_edge.apps.chat.widgets import ExchangeView, StepView  # noqa: E402
from dgpo_edge.engines.base import GREEDY  # noqa: E402
from dgpo_edge.protocol import Passage, ProtocolConfig  # noqa: E402
from dgpo_edge.retrieval.retrievers import BM25Retriever  # noqa: E402
from dgpo_edge.retrieval.store import PassageStore  # noqa: E402
from engine_fakes import ScriptedEngine  # noqa: E402

CORPUS = [
    Passage("peru-gov", '"Peru — Government"\nThe capital of Peru is Lima. Peru is a presidential republic '
                        "with a unicameral Congress of 130 members."),
    Passage("peru-geo", '"Peru — Geography"\nPeru borders Ecuador, Colombia, Brazil, Bolivia and Chile. '
                        "The Andes run the length of the country."),
    Passage("chile-gov", '"Chile — Government"\nThe capital of Chile is Santiago. Chile has a bicameral '
                         "National Congress."),
    Passage("bolivia-gov", '"Bolivia — Government"\nBolivia has two capitals: La Paz, the seat of government, '
                           "and Sucre, the constitutional capital."),
    Passage("ecuador-econ", '"Ecuador — Economy"\nEcuador uses the US dollar. Its exports include petroleum, '
                            "bananas and shrimp."),
    Passage("brazil-people", '"Brazil — People"\nPortuguese is the official language of Brazil, the most '
                             "populous country of South America."),
]

# Two searches, then the answer: what a trained student writes for a bridge question.
PERU_TURNS = [
    "<think>I need to know which countries border Peru.</think>\n<search> countries bordering Peru </search>",
    "<think>Chile borders Peru. Now the capital of Chile.</think>\n<search> capital of Chile </search>",
    "<think>The capital of Chile is Santiago.</think>\n<answer> **Santiago** </answer>",
]
PERU_QUESTION = "What is the capital of Peru's southern neighbour Chile"


class ChatEngine(ScriptedEngine):
    """The shared byte-level `ScriptedEngine` (engine_fakes.py), made to serve a chat.

    Its logits put all mass on the next byte of the current scripted turn, so
    the real decoding loop, stop strings and streaming run unchanged. A chat
    asks several questions of one agent: a call whose ids do not continue the
    last call's is a new question, and the script starts again. `endless`
    gives every turn past the script a long ramble (for Esc); each such turn
    runs into the per-turn token limit and the next one starts.
    """

    def __init__(self, turns: Iterable[str], *, endless: bool = False, token_delay_s: float = 0.0):
        # An endless run must outlast any slow CI machine: no context limit ends it.
        super().__init__(list(turns), n_ctx=10**8 if endless else 8192, delay_s=token_delay_s)
        self.script_turns = len(self.turns)
        self.endless = endless
        self._episode: list[int] = []   # the ids of the last call

    def generate(self, ids, max_new_tokens, sampling=GREEDY, stop=None):
        ids = list(ids)
        if ids[:len(self._episode)] != self._episode:
            self.calls = 0
        self._episode = ids
        if self.endless and self.calls >= len(self.turns):
            self.turns.append("thinking " * 100_000)
        return super().generate(ids, max_new_tokens, sampling, stop)


def scripted_agent(retriever, turns: Iterable[str], **kw) -> Agent:
    if kw.get("endless"):  # only Esc ends it: no token budget runs out first
        return Agent(ChatEngine(turns, **kw), retriever,
                     ProtocolConfig(max_turn_tokens=10**7, max_total_tokens=10**8))
    return Agent(ChatEngine(turns, **kw), retriever)


class Wrapped:
    """An agent wrapped: its settings are the wrapped agent's (the app sets `config` on it)."""

    def __init__(self, agent: Agent):
        self.agent = agent

    @property
    def config(self):
        return self.agent.config

    @config.setter
    def config(self, value) -> None:
        self.agent.config = value


class PinnedTimings(Wrapped):
    """Wraps an agent and pins the wall-clock figures in its events (tokens/s, retrieval ms).

    Only for snapshots: those figures are real measurements and differ on every
    run; everything else passes through unchanged.
    """

    def run(self, question: str, stop=None) -> Iterator[ev.Event]:
        for e in self.agent.run(question, stop):
            if isinstance(e, ev.PassagesRetrieved):
                e = dataclasses.replace(e, retrieval_ms=4.0)
            elif isinstance(e, ev.TurnFinished):
                e = dataclasses.replace(e, decode_s=e.new_tokens / 250.0, tokens_per_s=250.0)
            yield e


def asynchronous(test):
    """Run an async test body with asyncio (no pytest async plugin needed)."""
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))
    return wrapper


# --- fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "store.sqlite"
    PassageStore.build(path, CORPUS).close()
    return path


@pytest.fixture
def retriever(store_path: Path) -> Iterator[BM25Retriever]:
    with BM25Retriever(PassageStore(store_path)) as r:
        yield r


@pytest.fixture
def chats(tmp_path: Path) -> ChatStore:
    return ChatStore(tmp_path / "chats.sqlite", clock=lambda: 1_764_150_000.0)  # 2025-11-26 09:40 UTC


def make_app(agent, chats: ChatStore, **kw) -> ChatApp:
    return ChatApp(lambda: agent, chats, description="scripted engine · BM25 over 6 passages", **kw)


async def ask(pilot, question: str, type_it: bool = False) -> None:
    """Enter a question (typed key by key, or pasted) and wait until the run has finished."""
    app = pilot.app
    await app.workers.wait_for_complete()  # the agent is loaded
    await pilot.pause()
    await pilot.click("#question")
    if type_it:
        await pilot.press(*question)
    else:
        app.query_one("#question", Input).insert_text_at_cursor(question)
    await pilot.press("enter")
    await app.workers.wait_for_complete()
    await pilot.pause()


async def until(pilot, condition, timeout: float = 5.0) -> None:
    """Let the app run until `condition()` holds (a dismissed screen is popped asynchronously)."""
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        await pilot.pause(0.05)
    assert condition()


def exchange_views(app: ChatApp) -> list[ExchangeView]:
    return list(app.query(ExchangeView))


async def start_thinking_forever(app: ChatApp, pilot) -> None:
    """Ask an endless agent a question and wait until some of its text has streamed in."""
    await app.workers.wait_for_complete()
    app.query_one("#question", Input).insert_text_at_cursor("think forever")
    await pilot.press("enter")

    def streaming() -> bool:
        views = exchange_views(app)
        return bool(views and views[0].exchange.steps and len(views[0].exchange.steps[0].text) > 20)

    await until(pilot, streaming)


# --- pilot tests ------------------------------------------------------------------------------------

@asynchronous
async def test_question_shows_steps_answer_and_sources(retriever, chats):
    app = make_app(scripted_agent(retriever, PERU_TURNS), chats)
    async with app.run_test(size=(100, 40)) as pilot:
        await ask(pilot, PERU_QUESTION, type_it=True)
        [view] = exchange_views(app)
        x = view.exchange
        assert x.stop_reason == "answer" and x.answer == "**Santiago**"
        assert [(s.kind, s.turn) for s in x.steps] == [("think", 0), ("search", 0), ("think", 1), ("search", 1),
                                                       ("think", 2)]
        steps = list(view.query(StepView))
        assert len(steps) == 5
        assert steps[0].title == "Turn 1 · thinking"
        assert "Turn 1 · search “countries bordering Peru” · 2 passages" in steps[1].title
        # The BM25 hits are the real store's: the search for Chile's capital finds Chile's government first.
        assert x.steps[3].passages[0].title == "Chile — Government"
        assert "Chile has a bicameral" in str(steps[3].body.render())
        assert str(steps[4].body.render()) == "The capital of Chile is Santiago."
        # The answer is rendered as markdown (bold), without its tags.
        md = view.query_one(".answer", Markdown)
        assert md.source == "**Santiago**"
        # Sources: the passages that hold the answer, with their titles.
        assert str(view.query_one(".outcome").render()) == "Sources\n [1] Chile — Government"
        assert [s.id for s in x.sources] == ["chile-gov"]
        assert app.query_one("#question", Input).value == ""
        status = str(app.query_one("#status").render())
        assert status.startswith("answered │ turn 3/5 │") and "tok/s" in status and "top-k 3" in status


HOSTILE = Passage("p1", '"passwd \x1b]0;pwned title\x07copy [bold]x"\n'
                        "root:x:0:0:root:/root:/bin/bash \x1b[2J\x1b[31mred\x1b[0m \x9b2J end")


@asynchronous
async def test_passage_text_reaches_the_screen_without_terminal_escapes(tmp_path, chats):
    path = tmp_path / "hostile.sqlite"
    PassageStore.build(path, [HOSTILE]).close()
    turns = ["<think>look \x1b[2J</think>\n<search> root bash [bold] </search>",
             "<answer> root:x:0:0 \x1b]0;pwned\x07 </answer>"]
    with BM25Retriever(PassageStore(path)) as retriever:
        app = make_app(scripted_agent(retriever, turns), chats)
        async with app.run_test(size=(100, 40)) as pilot:
            await ask(pilot, "what is in passwd \x1b[2J")
            [view] = exchange_views(app)
            steps = list(view.query(StepView))
            shown = [str(view.query_one(".question").render()), str(view.query_one(".outcome").render()),
                     view.query_one(".answer", Markdown).source]
            shown += [str(s.body.render()) for s in steps] + [s._title.label.plain for s in steps]
            assert view.query_one(".answer", Markdown).source.rstrip() == "root:x:0:0"
    text = "\n".join(shown)
    assert not any(c in text for c in "\x1b\x07\x9b"), text
    assert "pwned" not in text and "root:x:0:0:root:/root:/bin/bash red 2J end" in text
    assert "1. passwd copy [bold]x" in text and "search “root bash [bold]”" in text  # markup shown as text


@asynchronous
async def test_the_answer_streams_into_markdown(retriever, chats):
    # 30 ms a token: slow enough that even a slow CI machine renders several partial answers.
    app = make_app(scripted_agent(retriever, ["<answer> Lima is the capital of **Peru** </answer>"],
                                  token_delay_s=0.03), chats)
    seen: list[str] = []
    async with app.run_test(size=(100, 30)) as pilot:
        original = ExchangeView._sync_answer

        async def spy(self) -> None:
            await original(self)
            seen.append(self.query_one(".answer", Markdown).source)

        ExchangeView._sync_answer = spy
        try:
            await ask(pilot, "capital of Peru")
        finally:
            ExchangeView._sync_answer = original
    answers = [s for s in dict.fromkeys(seen) if s]
    # Piece by piece, each a prefix of the next, never a fragment of "</answer>".
    assert answers[-1] == "Lima is the capital of **Peru**"
    assert len(answers) >= 4 and len(answers[0]) < 20
    assert all(b.startswith(a) for a, b in itertools.pairwise(answers))
    assert not any("<" in a for a in answers)


@asynchronous
async def test_escape_stops_a_long_generation(retriever, chats):
    app = make_app(scripted_agent(retriever, [], endless=True, token_delay_s=0.002), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await start_thinking_forever(app, pilot)
        assert app.generating
        assert app.screen.active_bindings["escape"].binding.action == "stop"  # the footer offers "Stop"
        # With a dialog open, Esc closes the dialog and the run goes on.
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen) and app.generating
        await pilot.press("escape")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not app.generating and "escape" not in app.screen.active_bindings
        [view] = exchange_views(app)
        assert view.exchange.stop_reason == "stopped"
        assert view.exchange.steps[0].text.startswith("thinking thinking")
        assert len(view.exchange.steps[0].text) < 100_000 * 9 // 2  # it stopped long before the end
        assert str(view.query_one(".outcome").render()).startswith("Stopped.")
        assert str(app.query_one("#status").render()).startswith("stopped │")
    [chat] = chats.list_chats()
    assert chats.load_chat(chat.id)[0].stop_reason == "stopped"  # a stopped run is kept too


@asynchronous
async def test_quitting_mid_answer_keeps_the_question_as_stopped(retriever, chats):
    app = make_app(scripted_agent(retriever, [], endless=True, token_delay_s=0.002), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await start_thinking_forever(app, pilot)
        await pilot.press("ctrl+q")
        await pilot.pause()
    [chat] = chats.list_chats()   # before, nothing was saved: the question was gone
    [saved] = chats.load_chat(chat.id)   # once, though the run's own stop may still arrive
    assert (saved.question, saved.stop_reason, saved.answer) == ("think forever", "stopped", None)
    assert saved.steps[0].text.startswith("thinking thinking")


@asynchronous
async def test_chat_is_saved_and_reopened_from_the_list(retriever, chats):
    async with make_app(scripted_agent(retriever, PERU_TURNS), chats).run_test(size=(100, 40)) as pilot:
        await ask(pilot, PERU_QUESTION)
        await ask(pilot, "and again")
    [chat] = chats.list_chats()
    assert chat.exchanges == 2 and chat.title == PERU_QUESTION
    saved = chats.load_chat(chat.id)
    assert [x.question for x in saved] == [PERU_QUESTION, "and again"]
    assert [x.answer for x in saved] == ["**Santiago**"] * 2  # each question replays the script
    other = chats.create_chat("an older chat")

    # A new app (a new session) lists both chats and reopens the first one.
    app = make_app(scripted_agent(retriever, PERU_TURNS), chats)
    async with app.run_test(size=(100, 40)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        options = app.screen.query_one("#chats", OptionList)
        labels = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert len(labels) == 2 and all("2025-11-26" in label for label in labels)
        assert {labels[0].split(" · ")[0], labels[1].split(" · ")[0]} == {PERU_QUESTION, "an older chat"}
        target = next(i for i, label in enumerate(labels) if label.startswith(PERU_QUESTION))
        options.highlighted = target
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, HistoryScreen)
        views = exchange_views(app)
        assert [v.exchange.question for v in views] == [PERU_QUESTION, "and again"]
        assert views[0].query_one(".answer", Markdown).source == "**Santiago**"
        steps = list(views[0].query(StepView))
        assert len(steps) == 5 and all(s.collapsed for s in steps)  # reopened chats start folded
        assert app.chat_id == chat.id
        await ask(pilot, "a third question")  # goes into the reopened chat
        # Delete the other chat from the list.
        await pilot.press("ctrl+o")
        await pilot.pause()
        options = app.screen.query_one("#chats", OptionList)
        options.highlighted = next(i for i in range(options.option_count)
                                   if str(options.get_option_at_index(i).prompt).startswith("an older"))
        await pilot.press("delete")
        await pilot.pause()
        assert options.option_count == 1
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HistoryScreen)
    assert [c.id for c in chats.list_chats()] == [chat.id]
    assert chats.list_chats()[0].exchanges == 3
    with pytest.raises(KeyError):
        chats.load_chat(other)


@asynchronous
async def test_a_chat_deleted_in_another_window_starts_a_new_one(retriever, chats):
    app = make_app(scripted_agent(retriever, ["<answer> Lima </answer>"]), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, "capital of Peru")
        first = app.chat_id
        ChatStore(chats.path).delete_chat(first)  # another window deletes it
        await ask(pilot, "capital of Peru, again")
        assert app.chat_id is not None and app.chat_id != first
    [chat] = chats.list_chats()
    assert chat.id == app.chat_id and [x.question for x in chats.load_chat(chat.id)] == ["capital of Peru, again"]


def record_notifications(app: ChatApp) -> list[tuple[str, str]]:
    """(message, severity) of every notification the app (or a screen of it) shows."""
    seen: list[tuple[str, str]] = []
    notify = app.notify

    def recording(message, *args, **kw):
        seen.append((str(message), kw.get("severity", "information")))
        return notify(message, *args, **kw)

    app.notify = recording   # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", '{"question": 5}', '{"question": "q", "steps": [7]}'])
@asynchronous
async def test_a_corrupt_stored_exchange_is_an_error_in_the_app_not_a_crash(retriever, chats, body):
    """Reopening a chat with one corrupt exchange: an error shown, the app running, the screen kept."""
    broken = chats.create_chat("broken chat")
    for q in ("fine", "damaged"):
        chats.add_exchange(broken, Recorder(q).exchange)
    with sqlite3.connect(chats.path) as db:
        db.execute("UPDATE exchanges SET body = ? WHERE chat_id = ? AND position = 1", (body, broken))
    db.close()
    app = make_app(scripted_agent(retriever, ["<answer> Lima </answer>"]), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        notes = record_notifications(app)
        await ask(pilot, "capital of Peru")
        current = app.chat_id
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        options = app.screen.query_one("#chats", OptionList)
        options.highlighted = next(i for i in range(options.option_count)
                                   if str(options.get_option_at_index(i).prompt).startswith("broken chat"))
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, HistoryScreen))
        await pilot.pause()
        assert [v.exchange.question for v in exchange_views(app)] == ["capital of Peru"]   # kept on screen
        assert app.chat_id == current
        assert any("exchange 1 is corrupt" in m and sev == "error" for m, sev in notes), notes
        await ask(pilot, "still working?")   # the app goes on: the next question is answered and saved
        assert len(exchange_views(app)) == 2
    assert app.return_code in (0, None) and not getattr(app, "_exception", None)
    assert len(chats.load_chat(current)) == 2


@asynchronous
async def test_a_history_file_damaged_while_the_app_runs_is_shown_not_raised(retriever, chats):
    """The file is overwritten with garbage mid-session: the chat list, delete and save all fail
    with an error in the app; the conversation on screen stays and questions still get answered."""
    app = make_app(scripted_agent(retriever, ["<answer> Lima </answer>"]), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        notes = record_notifications(app)
        await ask(pilot, "capital of Peru")
        for suffix in ("-wal", "-shm"):
            Path(str(chats.path) + suffix).unlink(missing_ok=True)
        chats.path.write_bytes(b"garbage, not SQLite" * 200)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await pilot.pause()
        options = app.screen.query_one("#chats", OptionList)
        assert "cannot be read" in str(options.get_option_at_index(0).prompt)
        await pilot.press("delete")
        await pilot.pause()
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HistoryScreen))
        await ask(pilot, "and again")
        assert [v.exchange.question for v in exchange_views(app)] == ["capital of Peru", "and again"]
        assert [v.exchange.answer for v in exchange_views(app)] == ["Lima", "Lima"]
        errors = [m for m, sev in notes if sev == "error"]
        assert any("not saved" in m for m in errors) and any("not a readable chat history" in m for m in errors)
    assert not getattr(app, "_exception", None)


@asynchronous
async def test_settings_change_top_k_and_max_searches(retriever, chats):
    agent = scripted_agent(retriever, PERU_TURNS)
    app = make_app(agent, chats)
    async with app.run_test(size=(100, 40)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        top_k = app.screen.query_one("#top-k", Input)
        top_k.value = "99"  # out of range: refused, the screen stays
        await pilot.click("#save")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        assert "top-k" in str(app.screen.query_one("#settings-error").render())
        top_k.value = "1"
        app.screen.query_one("#max-searches", Input).value = "1"
        # A Button ignores clicks during its 0.2 s "pressed" effect; the second click waits it out.
        save = app.screen.query_one("#save", Button)
        await until(pilot, lambda: not save.has_class("-active"))
        await pilot.click("#save")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.settings == Settings(top_k=1, max_searches=1)
        status = str(app.query_one("#status").render())
        assert "top-k 1" in status and "/2 │" in status   # one search, then the answer turn
        await ask(pilot, PERU_QUESTION)
        assert (agent.config.top_k, agent.config.max_searches) == (1, 1)
        x = exchange_views(app)[0].exchange
        searches = [s for s in x.steps if s.kind == "search"]
        assert len(searches) == 1 and len(searches[0].passages) == 1  # top-1, and only one search allowed
        assert x.stop_reason == "max_turns"  # the script's second search is past the limit
        # Esc cancels the settings screen without changing anything.
        await pilot.press("ctrl+s")
        await pilot.pause()
        app.screen.query_one("#top-k", Input).value = "7"
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, SettingsScreen)
        assert app.settings == Settings(top_k=1, max_searches=1)


@asynchronous
async def test_a_dialogs_key_opens_no_second_dialog_over_it(retriever, chats):
    """Ctrl+O or Ctrl+S pressed while a dialog is open does nothing: Textual ends a modal screen's
    binding chain at the screen, so the app's keys reach it only if made priority bindings (as Esc
    is, `check_action`), which would stack a second copy of the list or settings for Esc to close."""
    app = make_app(scripted_agent(retriever, PERU_TURNS), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.workers.wait_for_complete()
        for key, dialog in (("ctrl+o", HistoryScreen), ("ctrl+s", SettingsScreen)):
            await pilot.press(key)
            await until(pilot, lambda: isinstance(app.screen, dialog))
            for again in ("ctrl+o", "ctrl+s"):
                await pilot.press(again)
                await pilot.pause()
                assert len(app.screen_stack) == 2 and isinstance(app.screen, dialog), (key, again)
            await pilot.press("escape")
            await until(pilot, lambda: len(app.screen_stack) == 1)
        await pilot.press("ctrl+s")   # closed, the dialog opens again
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))


@asynchronous
async def test_a_failing_agent_factory_is_shown_not_raised(chats):
    def broken():
        raise FileNotFoundError("/models/[old]/model.gguf")   # brackets: shown, not read as markup

    app = ChatApp(broken, chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
        status = str(app.query_one("#status").render())
        assert status.startswith("no model: FileNotFoundError: /models/[old]/model.gguf")
        await pilot.click("#question")
        await pilot.press(*"hello", "enter")
        await pilot.pause()
        assert exchange_views(app) == [] and app.query_one("#question", Input).value == "hello"


class FailingEngine(ChatEngine):
    """Dies after a few tokens, as a backend can (out of memory, a corrupt model)."""

    def _logits(self) -> np.ndarray:
        if self._pos > 5:
            raise RuntimeError("engine died")
        return super()._logits()


@asynchronous
async def test_an_engine_failure_ends_the_exchange_with_its_reason(retriever, chats):
    app = make_app(Agent(FailingEngine(["<think>this will not get far</think>"]), retriever), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, "anything")
        [view] = exchange_views(app)
        assert (view.exchange.stop_reason, view.exchange.error) == ("error", "engine died")
        assert str(view.query_one(".outcome").render()) == "No answer: the run failed: engine died"
        assert not app.generating
        assert str(app.query_one("#status").render()).startswith("no answer │")
    assert chats.load_chat(chats.list_chats()[0].id)[0].error == "engine died"


@asynchronous
async def test_an_agent_that_breaks_its_contract_still_ends_the_exchange(retriever, chats):
    class Raising(Agent):
        """Raises out of `run` (the real Agent turns errors into a Failed event instead)."""

        def run(self, question, stop=None):
            yield ev.TurnStarted(0)
            yield ev.TokenDelta(0, "<think>hm")
            raise RuntimeError("bug")

    class Silent(Agent):
        """Ends without a terminal event."""

        def run(self, question, stop=None):
            yield ev.TurnStarted(0)

    for agent, error in [(Raising(ChatEngine([]), retriever), "RuntimeError: bug"),
                         (Silent(ChatEngine([]), retriever),
                          "the agent stopped without an answer or a failure event")]:
        app = make_app(agent, chats)
        async with app.run_test(size=(100, 30)) as pilot:
            await ask(pilot, "anything")
            [view] = exchange_views(app)
            assert (view.exchange.stop_reason, view.exchange.error) == ("error", error)
            assert not app.generating
            await ask(pilot, "the app still takes questions")
            assert len(exchange_views(app)) == 2


def screen_text(widget) -> str:
    """What a widget draws, line by line (as plain text)."""
    return "\n".join(widget.render_line(y).text for y in range(widget.size.height))


@asynchronous
async def test_chat_titles_in_the_list_are_shown_as_written(retriever, chats):
    """A chat's title is its first question: "[bold]" is not markup there, and a lone "[/]"
    (which markup cannot parse) does not take the app down when the list draws."""
    app = make_app(scripted_agent(retriever, ["<answer> Lima </answer>"]), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await ask(pilot, "what do [bold] and [/] do \x1b]0;pwned\x07in Rich")
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await pilot.pause()
        shown = screen_text(app.screen.query_one("#chats", OptionList))
    assert not getattr(app, "_exception", None)
    assert "what do [bold] and [/] do in Rich · 1 question" in shown


@asynchronous
async def test_error_notifications_show_paths_and_stored_text_as_written(tmp_path, retriever):
    """The history's path ("backup [old]") and a corrupt exchange's text ("[/]") reach the
    notification as text: not read as markup, which dropped one and could not parse the other."""
    chats = ChatStore(tmp_path / "backup [old]" / "chats.sqlite")
    broken = chats.create_chat("broken chat")
    chats.add_exchange(broken, Recorder("q").exchange)
    with sqlite3.connect(chats.path) as db:
        db.execute("UPDATE exchanges SET body = ?", ('{"question": "q", "steps": [{"[/]": 1}]}',))
    db.close()
    app = make_app(scripted_agent(retriever, []), chats)
    async with app.run_test(size=(120, 30), notifications=True) as pilot:
        await app.workers.wait_for_complete()
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, HistoryScreen))
        await pilot.press("enter")
        await until(pilot, lambda: not isinstance(app.screen, HistoryScreen) and app.screen.query("Toast"))
        await pilot.pause()
        toasts = [str(t.render()) for t in app.screen.query("Toast")]
    assert not getattr(app, "_exception", None)
    [toast] = toasts
    assert "backup [old]" in toast and "keyword argument '[/]'" in toast


@asynchronous
async def test_a_pasted_question_of_several_lines_is_kept_whole(retriever, chats):
    from textual import events

    app = make_app(scripted_agent(retriever, ["<answer> Santiago </answer>"]), chats)
    async with app.run_test(size=(100, 30)) as pilot:
        await app.workers.wait_for_complete()
        field = app.query_one("#question", Input)
        field.post_message(events.Paste("What is the capital of\n  Peru's southern\r\n\nneighbour?\n"))
        await pilot.pause()
        assert field.value == "What is the capital of Peru's southern neighbour?"  # Input kept line 1 only
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        [view] = exchange_views(app)
        assert view.exchange.question == "What is the capital of Peru's southern neighbour?"


class Lingering(Wrapped):
    """Wraps an agent whose `run` goes on after its last event (as a generator does until it is
    closed) until `release` is set."""

    def __init__(self, agent: Agent):
        super().__init__(agent)
        self.release = threading.Event()

    def run(self, question: str, stop=None) -> Iterator[ev.Event]:
        yield from self.agent.run(question, stop)
        self.release.wait(10)


@asynchronous
async def test_a_question_asked_as_the_last_run_closes_is_not_failed_by_it(retriever, chats):
    """The last run's exchange has ended but its worker has not: the next question waits for it
    (before, it started and the old worker's end marked the new exchange as failed)."""
    agent = Lingering(scripted_agent(retriever, ["<answer> Lima </answer>"]))
    app = make_app(agent, chats)
    async with app.run_test(size=(100, 30)) as pilot:
        notes = record_notifications(app)
        await app.workers.wait_for_complete()
        field = app.query_one("#question", Input)
        field.insert_text_at_cursor("first")
        await pilot.press("enter")
        await until(pilot, lambda: exchange_views(app)[0].exchange.finished)
        field.insert_text_at_cursor("second")
        await pilot.press("enter")   # the first run's worker is still in `run`
        await pilot.pause(0.2)
        assert len(exchange_views(app)) == 1 and field.value == "second"
        assert any("still closing" in m for m, _ in notes), notes
        agent.release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: len(exchange_views(app)) == 2 and exchange_views(app)[1].exchange.finished)
        assert [(v.exchange.question, v.exchange.stop_reason) for v in exchange_views(app)] == [
            ("first", "answer"), ("second", "answer")]
        agent.release.set()
        await app.workers.wait_for_complete()


@asynchronous
async def test_the_chat_list_opens_on_a_very_narrow_terminal(retriever, chats):
    chats.add_exchange(chats.create_chat("What is the capital of Peru"), Recorder("q").exchange)
    app = make_app(scripted_agent(retriever, []), chats)
    async with app.run_test(size=(10, 8)) as pilot:
        await app.workers.wait_for_complete()
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        assert isinstance(app.screen, HistoryScreen)
        await pilot.resize_terminal(4, 3)
        await pilot.pause(0.2)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HistoryScreen))
    assert not getattr(app, "_exception", None)


# --- snapshots --------------------------------------------------------------------------------------

def test_snapshot_answered_question(retriever, chats, snap_compare):
    agent = PinnedTimings(scripted_agent(retriever, PERU_TURNS))

    async def run_before(pilot) -> None:
        await ask(pilot, PERU_QUESTION)
        view = exchange_views(pilot.app)[0]
        view.query(StepView)[1].collapsed = False  # show the first search's passages
        steady(pilot)
        await pilot.pause()

    assert snap_compare(make_app(agent, chats), terminal_size=(100, 40), run_before=run_before)


def test_snapshot_settings(retriever, chats, snap_compare):
    app = make_app(scripted_agent(retriever, PERU_TURNS), chats, settings=Settings(top_k=5, max_searches=2))

    async def run_before(pilot) -> None:
        await pilot.app.workers.wait_for_complete()
        await pilot.press("ctrl+s")
        await pilot.pause()
        steady(pilot)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_snapshot_history(retriever, chats, snap_compare, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    for q in ("How many members has Peru's Congress", "What currency does Ecuador use"):
        chats.add_exchange(chats.create_chat(q), _answered(q))

    async def run_before(pilot) -> None:
        await pilot.app.workers.wait_for_complete()
        await pilot.press("ctrl+o")
        await pilot.pause()
        steady(pilot)
        await pilot.pause()

    try:
        assert snap_compare(make_app(scripted_agent(retriever, []), chats), terminal_size=(100, 30),
                            run_before=run_before)
    finally:
        monkeypatch.undo()
        time.tzset()


def steady(pilot) -> None:
    """Blinking input cursors are the one thing a snapshot could catch in either state."""
    for screen in pilot.app.screen_stack:
        for field in screen.query(Input):
            field.cursor_blink = False


def _answered(question: str):
    from dgpo_edge.apps.chat.exchange import Exchange

    return Exchange(question, answer="130", stop_reason="answer")
