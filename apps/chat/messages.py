"""The typed messages a worker thread sends the chat UI.

Workers never touch widgets: they `post_message` one of these (thread-safe)
and the app's handlers update the screen. Each agent event has its own
message class, carrying the event unchanged, so a handler's name says what
happened (`on_passages_found`) and the event's fields keep their types.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from dgpo_edge.agent import events as ev


class AgentMessage(Message):
    """One agent event, carried unchanged from the worker thread to the UI."""

    def __init__(self, event: ev.Event) -> None:
        super().__init__()
        self.event = event


class TurnBegan(AgentMessage):
    event: ev.TurnStarted


class TextGenerated(AgentMessage):
    event: ev.TokenDelta


class SearchIssued(AgentMessage):
    event: ev.SearchIssued


class PassagesFound(AgentMessage):
    event: ev.PassagesRetrieved


class ActionInvalid(AgentMessage):
    event: ev.InvalidAction


class TurnTimed(AgentMessage):
    event: ev.TurnFinished


class RunEnded(AgentMessage):
    """Terminal: `Answered` or `Failed` (including a user stop)."""

    event: ev.Answered | ev.Failed


class RunCrashed(Message):
    """The run raised instead of ending with a terminal event."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class AgentReady(Message):
    """The agent factory returned; questions can be asked."""

    def __init__(self, agent: Any, description: str) -> None:
        super().__init__()
        self.agent, self.description = agent, description


class AgentUnavailable(Message):
    """The agent factory raised; the app shows why and refuses questions."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


_FOR_EVENT: dict[type, type[AgentMessage]] = {
    ev.TurnStarted: TurnBegan,
    ev.TokenDelta: TextGenerated,
    ev.SearchIssued: SearchIssued,
    ev.PassagesRetrieved: PassagesFound,
    ev.InvalidAction: ActionInvalid,
    ev.TurnFinished: TurnTimed,
    ev.Answered: RunEnded,
    ev.Failed: RunEnded,
}


def message_for(event: ev.Event) -> AgentMessage:
    """The message that carries `event` to the UI; TypeError for anything else."""
    try:
        return _FOR_EVENT[type(event)](event)
    except KeyError:
        raise TypeError(f"not an agent event: {event!r}") from None
