"""Typed events an agent run yields, in order, for printers, the TUI and `--json`.

A run is a stream: `TurnStarted`, then `TokenDelta`s while the model writes, then
for a search `SearchIssued` and `PassagesRetrieved` (or `InvalidAction`), and so on
until exactly one terminal event, `Answered` or `Failed`, which carries the
`AgentResult`. Events are plain frozen dataclasses so they cross thread boundaries
(Textual workers) and serialise to JSON with `dataclasses.asdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol import Passage
from ..transcript import Transcript


@dataclass(frozen=True)
class TurnStarted:
    """The model starts generating turn `turn` (0-based)."""

    turn: int


@dataclass(frozen=True)
class TokenDelta:
    """New text generated in turn `turn` (may hold several tokens)."""

    turn: int
    text: str


@dataclass(frozen=True)
class SearchIssued:
    """The turn ended in `<search>query</search>`."""

    turn: int
    query: str


@dataclass(frozen=True)
class PassagesRetrieved:
    """What the retriever returned for the query (shown to the model, best first)."""

    turn: int
    query: str
    passages: tuple[Passage, ...]
    retrieval_ms: float


@dataclass(frozen=True)
class InvalidAction:
    """The turn had neither a search nor an answer; the feedback text was appended."""

    turn: int


@dataclass(frozen=True)
class TurnFinished:
    """Timing of one generated turn."""

    turn: int
    new_tokens: int
    prompt_tokens: int          # tokens the engine had to evaluate before this turn
    decode_s: float
    tokens_per_s: float


@dataclass
class Timings:
    """Totals over one run."""

    total_s: float = 0.0
    generate_s: float = 0.0
    retrieval_s: float = 0.0
    prompt_tokens: int = 0      # tokens evaluated as prompt (after KV-cache reuse)
    new_tokens: int = 0         # tokens generated
    prompt_s: float = 0.0       # part of generate_s spent evaluating prompt tokens
    decode_s: float = 0.0       # part of generate_s spent generating new tokens
    transcript_tokens: int = 0  # length of the final transcript in tokens


@dataclass
class AgentResult:
    """What one question produced."""

    question: str
    answer: str | None
    transcript: Transcript
    searches: list[str] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)   # everything shown, in order
    cited: list[Passage] = field(default_factory=list)      # passages that contain the answer
    invalid_actions: int = 0
    stop_reason: str = "answer"  # answer | max_turns | token_budget | timeout | stopped | error
    timings: Timings = field(default_factory=Timings)


@dataclass(frozen=True)
class Answered:
    """Terminal: the model gave `<answer>`."""

    result: AgentResult


@dataclass(frozen=True)
class Failed:
    """Terminal: no answer (budget, turns, timeout, user stop, or an engine error)."""

    reason: str
    result: AgentResult


Event = (TurnStarted | TokenDelta | SearchIssued | PassagesRetrieved | InvalidAction
         | TurnFinished | Answered | Failed)
