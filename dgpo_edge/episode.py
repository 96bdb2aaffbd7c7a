"""One Search-R1 episode as a state machine: the round rules training and the laptop share.

The laptop agent (`agent/agent.py`, one question, streaming) and the training
rollouts (`train/rollout.py`, many rows per engine call) both drive an
`Episode`; only how they generate turns and call the retriever differs. The
machine decides everything else, so the two cannot drift apart:

    running --turn_tokens() == 0--------------------------> done ("budget")
    running --add_turn: answer----------------------------> done ("answer")
    running --add_turn: anything on the final turn--------> done ("final")
    running --add_turn: search--> searching --observe()---> running (turn + 1)
    running --add_turn: invalid (feedback appended)-------> running (turn + 1)

- The final turn is turn `max_searches`: its search is not executed (Search-R1's
  last rollout), so an episode has at most `max_searches + 1` turns.
- An invalid turn gets the invalid-action feedback and uses up a turn, so the
  loop cannot spin.
- Budgets: a turn may generate `min(max_turn_tokens, room)` tokens, where room
  is what the total budget (`max_total_tokens`, capped by the caller's context,
  e.g. llama.cpp's n_ctx) leaves; no room ends the episode before the turn.
  An information block holds at most `top_k` passages and `max_obs_tokens` tokens.

Token ids and the loss mask are built here, one segment at a time, with
`TokenizedTranscript.add` (the code `Transcript.tokenize` runs): a turn keeps
the ids the engine sampled (mask 1), forced text (prompt, information,
feedback) is encoded on its own (mask 0). `logprobs` stays aligned with the ids
(0.0 where forced or not given).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from . import protocol
from .protocol import Action, Passage, ProtocolConfig
from .transcript import Encoder, TokenizedTranscript, Transcript

StepKind = Literal["answer", "final", "search", "invalid"]
FINISHES = ("answer", "final", "budget")


@dataclass(frozen=True)
class Step:
    """What the machine made of a turn. For "search", call `observe(step.query, passages)`."""

    kind: StepKind
    action: Action

    @property
    def query(self) -> str:
        return self.action.content if self.kind == "search" else ""


class Episode:
    """The state of one episode: transcript, ids, loss mask, turn, and how it finished.

    `encode` tokenizes the prompt (special tokens recognised, no BOS); `plain`
    tokenizes forced text - observations and feedback - with special and added
    tokens read as text, so a passage never yields a control token (default:
    `encode.plain` when `encode` has one, as `encoder_for`'s do, else `encode`);
    `count_tokens` measures information blocks (default: `len(plain(text))`); `blocks` builds
    them (default: a `protocol.InformationBlocks` over `count_tokens` of this episode's own;
    rollouts pass one over the same count shared by many episodes, since the same passages
    come back every epoch);
    `max_tokens` caps the total budget (an engine's context window).
    """

    def __init__(self, question: str, prompt: str, encode: Encoder, config: ProtocolConfig,
                 max_tokens: int | None = None, count_tokens: Callable[[str], int] | None = None,
                 plain: Encoder | None = None, blocks: protocol.InformationBlocks | None = None):
        self.config = config
        self.encode = encode
        self.plain = plain or getattr(encode, "plain", None) or encode
        self.count_tokens = count_tokens or (lambda text: len(self.plain(text)))
        self.blocks = blocks or protocol.InformationBlocks(self.count_tokens)
        self.budget = config.max_total_tokens if max_tokens is None else min(config.max_total_tokens, max_tokens)
        self.transcript = Transcript(question)
        self.tokens = TokenizedTranscript([], [])
        self.logprobs: list[float] = []
        self.turn = 0                       # turns completed that did not end the episode
        self.finish: str | None = None      # one of FINISHES once done
        self._searching: str | None = None  # the query a search step is waiting on
        self.transcript.append_prompt(prompt)
        self._add(encode(prompt))

    # -- state -------------------------------------------------------------------------------------
    @property
    def ids(self) -> list[int]:
        return self.tokens.ids

    @property
    def mask(self) -> list[int]:
        return self.tokens.mask

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def final(self) -> bool:
        """Whether the next turn is the last one (its search would not be executed)."""
        return self.turn >= self.config.max_searches

    def turn_tokens(self) -> int:
        """How many tokens the next turn may generate; 0 ends the episode ("budget")."""
        self._require_turn()
        room = self.budget - len(self.ids)
        if room <= 0:
            self.finish = "budget"
            return 0
        return min(self.config.max_turn_tokens, room)

    # -- transitions -------------------------------------------------------------------------------
    def add_turn(self, text: str, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> Step:
        """Record a generated turn and apply the round rule to it."""
        return self.decide(self.record_turn(text, ids, logprobs))

    def record_turn(self, text: str, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> Action:
        """Append a turn without deciding (the agent keeps a turn cut short by Esc this way)."""
        self._require_turn()
        action = self.transcript.append_turn(text, list(ids))
        self._add(ids, logprobs)
        return action

    def decide(self, action: Action) -> Step:
        """The round rule for the turn just recorded: answer, final, search or invalid."""
        if action.kind == "answer":
            self.finish = "answer"
            return Step("answer", action)
        if self.final:
            self.finish = "final"
            return Step("final", action)
        if action.kind == "search":
            self._searching = action.content
            return Step("search", action)
        self._force(self.transcript.append_feedback())
        self.turn += 1
        return Step("invalid", action)

    def observe(self, query: str, passages: Sequence[Passage],
                block: tuple[str, Sequence[int]] | None = None) -> list[Passage]:
        """Append the information block for the pending search; returns the passages shown.

        `block`, when the caller built it (rollouts build a round's blocks and their `plain` ids
        in batch calls), is that block's text and ids: `self.blocks(shown, max_obs_tokens)` and
        `self.plain` of it. By default both are built here.
        """
        if self._searching is None or query != self._searching:
            raise RuntimeError(f"no search for {query!r} is waiting on passages")
        shown = self.shown(passages)
        text, ids = block if block is not None else (self.blocks(shown, self.config.max_obs_tokens), None)
        self.transcript.append_information(query, shown, block=text)
        self._add(self.plain(text) if ids is None else ids)
        self._searching = None
        self.turn += 1
        return shown

    def shown(self, passages: Sequence[Passage]) -> list[Passage]:
        """The passages of a search this episode shows: the first `top_k` (a caller that builds the
        block itself, as rollouts do, builds it for these)."""
        return list(passages)[: self.config.top_k]

    # -- internals -----------------------------------------------------------------------------------
    def _require_turn(self) -> None:
        if self.done:
            raise RuntimeError(f"the episode is over ({self.finish})")
        if self._searching is not None:
            raise RuntimeError(f"the search {self._searching!r} is waiting on passages")

    def _force(self, text: str) -> None:
        self._add(self.plain(text))

    def _add(self, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        """Extend ids, mask and logprobs by the transcript's last segment."""
        ids = list(ids)
        lps = [0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs]
        if len(lps) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(lps)} logprobs")
        self.tokens.add(self.transcript.segments[-1], ids)
        self.logprobs.extend(lps)
