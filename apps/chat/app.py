"""`ChatApp`: ask questions, watch the agent think, search and answer.

The app never builds a model itself: it is given an *agent factory* (any
callable returning an object with `run(question, stop) -> Iterator[Event]`
and a `config` holding `top_k` and `max_searches`), called once in a thread
worker so loading a model never freezes the screen. Each question runs in a
thread worker too; the worker turns agent events into typed messages
(messages.py) and the handlers here feed a `Recorder` and redraw its
`ExchangeView`. Esc sets the run's stop event; the agent ends the run with a
`Failed("stopped")` event, which is recorded and saved like any other.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Header, Input
from textual.worker import Worker

from . import messages as msg
from .exchange import Exchange, Recorder
from .screens import HistoryScreen, Settings, SettingsScreen
from .storage import HISTORY_ERRORS, ChatStore
from .widgets import ExchangeView, QuestionInput, Status, StatusBar

AgentFactory = Callable[[], Any]
REDRAW_S = 1 / 30   # the exchange view is redrawn at most this often while a run streams


class ChatApp(App[None]):
    """The `dgpo-edge chat` terminal app (see the module docstring)."""

    CSS_PATH = "chat.tcss"
    TITLE = "dgpo-edge chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+o", "history", "Chats"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(self, agent_factory: AgentFactory, store: ChatStore, settings: Settings | None = None,
                 description: str = "") -> None:
        super().__init__()
        self.agent_factory, self.store, self.description = agent_factory, store, description
        self.settings = settings or Settings()
        self.agent: Any = None
        self.chat_id: int | None = None
        self.status = Status(top_k=self.settings.top_k, turn_limit=self.settings.turn_limit)
        self._stop: threading.Event | None = None   # set while a run is in flight
        self._worker: Worker | None = None          # the last run's worker (its thread may outlive the run)
        self._recorder: Recorder | None = None
        self._view: ExchangeView | None = None
        self._redraw_due = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield VerticalScroll(id="conversation")
        yield QuestionInput(placeholder="Ask a question and press Enter (Esc stops the answer)", id="question")
        yield StatusBar(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.description
        self._show_status()
        self.query_one("#question", Input).focus()
        self._load_agent()

    # --- the agent ----------------------------------------------------------------

    @work(thread=True, group="load")
    def _load_agent(self) -> None:
        try:
            agent = self.agent_factory()
        except Exception as e:  # shown in the status bar; the app stays usable for reading history
            self.post_message(msg.AgentUnavailable(_describe(e)))
        else:
            self.post_message(msg.AgentReady(agent, self.description))

    def on_agent_ready(self, message: msg.AgentReady) -> None:
        self.agent = message.agent
        self._set_state("ready")

    def on_agent_unavailable(self, message: msg.AgentUnavailable) -> None:
        self._set_state(f"no model: {message.error}")

    @property
    def generating(self) -> bool:
        return self._stop is not None

    @property
    def _lingering(self) -> bool:
        """The last run's exchange has ended but its worker thread has not returned yet.

        The terminal event is posted before the agent's generator closes, so for a moment
        the agent still holds its run; a question asked then would be refused by the agent
        ("already running a question") and the old worker's end would be taken for the new run's.
        """
        return self._worker is not None and not self._worker.is_finished

    # --- asking -------------------------------------------------------------------

    @on(Input.Submitted, "#question")
    async def _ask(self, event: Input.Submitted) -> None:
        question = event.value.strip()
        if not question:
            return
        if self.generating:
            self.notify("Still answering: wait, or press Esc to stop it.", severity="warning")
            return
        if self._lingering:
            self.notify("The last answer is still closing: press Enter again in a moment.", severity="warning")
            return
        if self.agent is None:
            self.notify("The model is not loaded yet.", severity="warning")
            return
        event.input.clear()
        self._recorder = Recorder(question)
        self._view = ExchangeView(self._recorder.exchange)
        await self.query_one("#conversation", VerticalScroll).mount(self._view)
        self._stop = threading.Event()
        self.refresh_bindings()
        self.status = Status(state="generating…", top_k=self.settings.top_k,
                             turn_limit=self.settings.turn_limit)
        self._show_status()
        self._worker = self._generate(question, self._stop, self.settings)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, question: str, stop: threading.Event, settings: Settings) -> None:
        """Run the agent; every event goes to the UI as a message, nothing else does."""
        agent = self.agent
        try:
            agent.config = dataclasses.replace(agent.config, top_k=settings.top_k,
                                               max_searches=settings.max_searches)
            for event in agent.run(question, stop=stop):
                self.post_message(msg.message_for(event))
        except Exception as e:
            self.post_message(msg.RunCrashed(_describe(e)))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Esc means "stop" only while a run streams on the main screen; elsewhere it closes dialogs."""
        if action == "stop":
            return self.generating and not isinstance(self.screen, ModalScreen)
        return True

    def action_stop(self) -> None:
        """Esc: ask the running agent to stop (it ends the run with a `stopped` failure)."""
        if self._stop is not None and not self._stop.is_set():
            self._stop.set()
            self._set_state("stopping…")

    async def action_quit(self) -> None:
        """Stop a running question first, so its worker thread ends with the app, and keep it
        in the history as stopped, as Esc would (its own stop event comes too late to be saved)."""
        if self._stop is not None:
            self._stop.set()
        if self._recorder is not None and not self._recorder.exchange.finished:
            self._recorder.interrupt()
            self._save(self._recorder.exchange)
            self._recorder = None   # a terminal event still delivered before exit must not save it again
        await super().action_quit()

    # --- agent messages -> the exchange view -------------------------------------------

    @on(msg.TurnBegan)
    @on(msg.TextGenerated)
    @on(msg.SearchIssued)
    @on(msg.PassagesFound)
    @on(msg.ActionInvalid)
    @on(msg.TurnTimed)
    async def _progress(self, message: msg.AgentMessage) -> None:
        if self._recorder is None:
            return
        self._recorder.feed(message.event)
        if not self._redraw_due:  # draw at most every REDRAW_S: a fast model outpaces per-token redraws
            self._redraw_due = True
            self.set_timer(REDRAW_S, self._redraw)

    async def on_run_ended(self, message: msg.RunEnded) -> None:
        if self._recorder is not None:
            self._recorder.feed(message.event)
            await self._finish()

    async def on_run_crashed(self, message: msg.RunCrashed) -> None:
        if self._recorder is not None:
            self._recorder.fail(message.error)
            await self._finish()

    async def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A generate worker that ended without a terminal event still ends the exchange."""
        if (event.worker is self._worker and event.worker.is_finished   # not an earlier run's worker
                and self._recorder is not None and not self._recorder.exchange.finished):
            self._recorder.fail("the agent stopped without an answer or a failure event")
            await self._finish()

    async def _finish(self) -> None:
        """Save the finished exchange and get ready for the next question."""
        assert self._recorder is not None
        x = self._recorder.exchange
        await self._redraw()
        self._save(x)
        self._stop, self._recorder = None, None
        self.refresh_bindings()
        self._set_state({"answer": "answered", "stopped": "stopped"}.get(x.stop_reason, "no answer"))

    def _save(self, exchange: Exchange) -> None:
        """Append the exchange to the current chat (created by its first question)."""
        try:
            if self.chat_id is None:
                self.chat_id = self.store.create_chat(exchange.question)
            self.store.add_exchange(self.chat_id, exchange)
        except KeyError:  # the chat was deleted from another window: start a new one
            self.chat_id = None
            self._save(exchange)
        except HISTORY_ERRORS as e:  # a broken history must not end the session
            # markup=False: the message holds the file's path and stored text ("[old]", "[/]")
            self.notify(f"The chat was not saved: {e}", severity="error", timeout=10, markup=False)

    async def _redraw(self) -> None:
        self._redraw_due = False
        if self._recorder is not None:
            self.status.take(self._recorder.live)
            self._show_status()
        if self._view is not None:
            await self._view.sync()
            self.query_one("#conversation", VerticalScroll).scroll_end(animate=False)

    # --- chats and settings ---------------------------------------------------------------

    async def action_new_chat(self) -> None:
        if self.generating:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.chat_id = None
        await self.query_one("#conversation", VerticalScroll).remove_children()
        self._view = None

    def action_history(self) -> None:
        if self.generating:
            self.notify("Stop the answer first (Esc).", severity="warning")
            return
        self.push_screen(HistoryScreen(self.store), self._open_chat)

    async def _open_chat(self, chat_id: int | None) -> None:
        if chat_id is None:
            return
        try:
            exchanges = self.store.load_chat(chat_id)
        except KeyError:
            self.notify("That chat was deleted.", severity="warning")
            return
        except HISTORY_ERRORS as e:   # the conversation on screen stays as it is
            self.notify(f"That chat cannot be opened: {e}", severity="error", timeout=10, markup=False)
            return
        await self.show_chat(chat_id, exchanges)

    async def show_chat(self, chat_id: int, exchanges: list[Exchange]) -> None:
        """Replace the conversation with a stored chat; new questions are added to it."""
        conversation = self.query_one("#conversation", VerticalScroll)
        await conversation.remove_children()
        views = [ExchangeView(x, collapsed=True) for x in exchanges]
        await conversation.mount_all(views)
        for view in views:
            await view.sync()
        self.chat_id, self._view = chat_id, None
        conversation.scroll_end(animate=False)
        self.query_one("#question", Input).focus()

    def action_settings(self) -> None:
        self.push_screen(SettingsScreen(self.settings), self._apply_settings)

    def _apply_settings(self, settings: Settings | None) -> None:
        """New settings take effect from the next question (a running one keeps its own)."""
        if settings is None:
            return
        self.settings = settings
        if not self.generating:
            self.status.top_k, self.status.turn_limit = settings.top_k, settings.turn_limit
            self._show_status()

    # --- status ------------------------------------------------------------------------

    def _set_state(self, state: str) -> None:
        self.status.state = state
        if not self.generating:
            self.status.top_k, self.status.turn_limit = self.settings.top_k, self.settings.turn_limit
        self._show_status()

    def _show_status(self) -> None:
        self.query_one("#status", StatusBar).show(self.status)


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
