"""Agent: the multi-turn search loop over an Engine and a Retriever."""

from .agent import Agent
from .events import (AgentResult, Answered, Event, Failed, InvalidAction, PassagesRetrieved, SearchIssued,
                     Timings, TokenDelta, TurnFinished, TurnStarted)

__all__ = ["Agent", "AgentResult", "Answered", "Event", "Failed", "InvalidAction", "PassagesRetrieved",
           "SearchIssued", "Timings", "TokenDelta", "TurnFinished", "TurnStarted"]
