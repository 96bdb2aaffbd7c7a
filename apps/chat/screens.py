"""Modal screens: the list of past chats and the settings (top-k, max searches)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.validation import Integer
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from dgpo_edge.protocol import MAX_SEARCHES, MAX_TOP_K
from dgpo_edge.termtext import printable

from .storage import HISTORY_ERRORS, ChatStore, ChatSummary


@dataclass(frozen=True)
class Settings:
    """What the settings screen edits: passages per search and the agent's search budget
    (`ProtocolConfig.top_k`, `ProtocolConfig.max_searches`, Search-R1's `max_turns`)."""

    top_k: int = 3
    max_searches: int = 4

    @property
    def turn_limit(self) -> int:
        """The most turns an episode has: the searches, then one last answer-only turn."""
        return self.max_searches + 1


def chat_label(chat: ChatSummary) -> Text:
    """`title · 3 questions · 2026-11-26 09:12` (local time).

    Plain text, not markup: the title is the user's first question, and an option's str
    prompt is read as markup ("[bold]" vanishes, a lone "[/]" raises while the list draws)."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
    n = chat.exchanges
    return Text(f"{printable(chat.title)} · {n} question{'s' * (n != 1)} · {when}")


class HistoryScreen(ModalScreen[int | None]):
    """Past chats, newest first: Enter reopens one, Delete removes one, Esc goes back."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Back"),
        Binding("delete,d", "delete", "Delete chat"),
    ]

    def __init__(self, store: ChatStore) -> None:
        super().__init__(classes="modal")
        self.store = store

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="history"):
            yield Label("Past chats", classes="dialog-title")
            yield OptionList(id="chats")
            yield Static("Enter open · Delete remove · Esc back", classes="dialog-help")

    def on_mount(self) -> None:
        self.reload()

    def reload(self) -> None:
        """Re-read the chat list (keeps the highlight near where it was)."""
        chats = self.query_one("#chats", OptionList)
        keep = chats.highlighted
        chats.clear_options()
        try:
            summaries = self.store.list_chats()
        except HISTORY_ERRORS as e:   # a damaged history: say so here, the app goes on
            chats.add_option(Option("The chat history cannot be read.", disabled=True))
            self.notify(str(e), title="Chat history", severity="error", timeout=10, markup=False)
            return
        chats.add_options(Option(chat_label(c), id=str(c.id)) for c in summaries)
        if summaries:
            chats.highlighted = min(keep or 0, len(summaries) - 1)
        else:
            chats.add_option(Option("No chats yet.", disabled=True))

    @on(OptionList.OptionSelected, "#chats")
    def _open(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(int(event.option.id))

    def action_delete(self) -> None:
        option = self.query_one("#chats", OptionList).highlighted_option
        if option is not None and option.id is not None:
            try:
                self.store.delete_chat(int(option.id))
            except HISTORY_ERRORS as e:
                self.notify(f"The chat was not deleted: {e}", severity="error", timeout=10, markup=False)
            self.reload()


class SettingsScreen(ModalScreen[Settings | None]):
    """Top-k and max searches; they apply from the next question on."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, current: Settings) -> None:
        super().__init__(classes="modal")
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="settings"):
            yield Label("Settings", classes="dialog-title")
            yield Label(f"Passages per search (top-k, 1–{MAX_TOP_K})")
            yield Input(str(self.current.top_k), id="top-k", type="integer",
                        validators=[Integer(1, MAX_TOP_K)])
            yield Label(f"Max searches (before the answer turn, 0–{MAX_SEARCHES})")
            yield Input(str(self.current.max_searches), id="max-searches", type="integer",
                        validators=[Integer(0, MAX_SEARCHES)])
            yield Static("", id="settings-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    @on(Button.Pressed, "#cancel")
    def _cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#save")
    @on(Input.Submitted)
    def _save(self) -> None:
        fields = [self.query_one("#top-k", Input), self.query_one("#max-searches", Input)]
        for field in fields:
            result = field.validate(field.value)
            if result is not None and not result.is_valid:
                self.query_one("#settings-error", Static).update(
                    f"{field.id}: {'; '.join(result.failure_descriptions)}")
                field.focus()
                return
        self.dismiss(Settings(int(fields[0].value), int(fields[1].value)))
