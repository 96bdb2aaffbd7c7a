"""The Search-R1 agent loop over one Engine and one Retriever, as a stream of typed events.

One episode, exactly as Search-R1's `generation.py` runs it
(docs/architecture.md#the-agent-protocol). The rules below live in
`dgpo_edge.episode.Episode`, which the training rollouts drive too; this
module generates the turns, calls the retriever and streams events:

1. The prompt is `protocol.render_prompt(question)` in the model's chat template.
2. Up to `max_searches` turns in the loop: the model writes until `</search>`
   or `</answer>` (at most `max_turn_tokens`). An answer ends the episode; a
   search appends the information block (top-k passages, at most
   `max_obs_tokens` tokens, tags escaped); anything else appends the
   invalid-action feedback. An invalid turn uses up a loop turn, as in
   Search-R1, so the loop cannot spin.
3. Then one final turn in which a search is not executed: the model answers
   or the episode fails with reason "max_turns".

The transcript is append-only and its ids are the concatenation of each
segment's ids (`transcript.py`); the engine keeps its KV cache across turns,
so each turn evaluates only the text appended since the last one.

Limits besides the turns: the total budget (`max_total_tokens`, prompt and
everything appended, capped by the engine's `n_ctx`), a wall-clock `timeout_s`
and a `threading.Event` the caller sets to stop (the TUI's Esc). Engine and
retriever exceptions end the run with `Failed(reason="error: ...")`; the
partial turn is kept in the transcript.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from ..arc import gold_in_passages
from ..episode import Episode
from ..protocol import Passage, ProtocolConfig
from ..retrieval.base import Retriever
from ..transcript import Transcript
from .events import (AgentResult, Answered, Event, Failed, InvalidAction, PassagesRetrieved, SearchIssued,
                     Timings, TokenDelta, TurnFinished, TurnStarted)


class _Stop(Exception):
    """Internal: end the run with this stop reason."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason, self.detail = reason, detail


class Agent:
    """A search agent: `run(question)` streams events; `answer(question)` returns the result.

    `engine`: an `engines.Engine`. `retriever`: any `Retriever` (in-process
    index, HTTP client). `config`: episode limits (`ProtocolConfig`).
    `timeout_s`: wall-clock limit per question (None: none). `sampling`:
    decoding (greedy by default). One agent runs one question at a time.
    """

    def __init__(self, engine: Any, retriever: Retriever, config: ProtocolConfig | None = None,
                 timeout_s: float | None = None, sampling: Any = None):
        from ..engines.base import GREEDY

        self.engine = engine
        self.retriever = retriever
        self.config = config or ProtocolConfig()
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self.sampling = sampling or GREEDY
        self.info: dict[str, Any] = {}   # what load_agent loaded (bundle, model, index), for display
        self._lock = threading.Lock()

    # -- public -------------------------------------------------------------------------------------
    def answer(self, question: str, stop: threading.Event | None = None) -> AgentResult:
        """Run to the end and return the result (answered or not)."""
        result = None
        for event in self.run(question, stop):
            if isinstance(event, (Answered, Failed)):
                result = event.result
        assert result is not None
        return result

    def run(self, question: str, stop: threading.Event | None = None) -> Iterator[Event]:
        """Stream one episode's events; the last one is `Answered` or `Failed`."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this agent is already running a question")
        try:
            yield from self._episode(question, stop)
        finally:
            self._lock.release()

    def close(self) -> None:
        """Release the engine and the retriever."""
        for part in (self.engine, self.retriever):
            close = getattr(part, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the episode -----------------------------------------------------------------------------------
    def _episode(self, question: str, stop: threading.Event | None) -> Iterator[Event]:
        """Drive an `Episode` (the rules training shares) and turn its steps into events."""
        t0 = time.perf_counter()
        deadline = None if self.timeout_s is None else t0 + self.timeout_s
        result = AgentResult(question=question, answer=None, transcript=Transcript(question), timings=Timings())
        ids: list[int] = []

        def check() -> None:
            if stop is not None and stop.is_set():
                raise _Stop("stopped")
            if deadline is not None and time.perf_counter() > deadline:
                raise _Stop("timeout", f"after {self.timeout_s:g} s")

        try:
            episode = self._start(question)   # ValueError for an empty question
            result.transcript, ids = episode.transcript, episode.ids
            while not episode.done:
                yield from self._round(episode, result, check)
            result.stop_reason = "answer"
        except _Stop as s:
            result.stop_reason = s.reason
            reason = s.reason if not s.detail else f"{s.reason}: {s.detail}"
            yield from self._finish(result, t0, ids, Failed(reason, result))
            return
        except Exception as e:  # an engine or retriever failure ends this question, not the app
            result.stop_reason = "error"
            yield from self._finish(result, t0, ids, Failed(f"error: {e}", result))
            return
        yield from self._finish(result, t0, ids, Answered(result))

    def _start(self, question: str) -> Episode:
        engine = self.engine
        return Episode(question, engine.render_prompt(question), engine.encode, self.config,
                       max_tokens=engine.n_ctx, count_tokens=engine.count_text_tokens,
                       plain=engine.encode_text)  # passage text never becomes control tokens

    def _round(self, episode: Episode, result: AgentResult, check: Any) -> Iterator[Event]:
        """One turn and what follows it; raises _Stop when the episode ends without an answer."""
        check()
        turn, max_new = episode.turn, episode.turn_tokens()
        if episode.finish == "budget":
            raise _Stop("token_budget", f"{len(episode.ids)} of {episode.budget} tokens used")
        yield TurnStarted(turn)
        yield from self._generate(turn, episode, max_new, check, result.timings)
        step = episode.decide(episode.transcript.turns()[-1].action)
        if step.kind == "answer":
            result.answer = step.action.content
        elif step.kind == "final":
            raise _Stop("max_turns", f"no answer after {turn + 1} turns")
        elif step.kind == "search":
            result.searches.append(step.query)
            yield SearchIssued(turn, step.query)
            check()
            passages, ms = self._search(step.query)
            result.timings.retrieval_s += ms / 1000
            shown = episode.observe(step.query, passages)
            _add_unique(result.passages, shown)
            yield PassagesRetrieved(turn, step.query, tuple(shown), ms)
        else:
            result.invalid_actions += 1
            yield InvalidAction(turn)

    def _generate(self, turn: int, episode: Episode, max_new: int, check: Any, timings: Timings) -> Iterator[Event]:
        """One turn: stream its deltas; record the turn (even a cut-off one) in the episode."""
        gen = self.engine.generate(episode.ids, max_new, self.sampling)
        stopped: _Stop | None = None
        try:
            for delta in gen:
                yield TokenDelta(turn, delta)
                try:
                    check()
                except _Stop as s:
                    stopped = s
                    break
        finally:
            gen.close()
            r = gen.result
            episode.record_turn(r.text, r.token_ids)
            timings.prompt_tokens += r.prompt_tokens
            timings.new_tokens += r.new_tokens
            timings.prompt_s += r.prompt_s
            timings.decode_s += r.decode_s
            timings.generate_s += r.prompt_s + r.decode_s
        yield TurnFinished(turn, r.new_tokens, r.prompt_tokens, r.decode_s, r.tokens_per_s)
        if stopped is not None:
            raise stopped

    def _search(self, query: str) -> tuple[list[Passage], float]:
        t = time.perf_counter()
        found = self.retriever.search([query], k=self.config.top_k)
        ms = (time.perf_counter() - t) * 1000
        return (list(found[0]) if found else []), ms

    def _finish(self, result: AgentResult, t0: float, ids: list[int], event: Event) -> Iterator[Event]:
        result.timings.total_s = time.perf_counter() - t0
        result.timings.transcript_tokens = len(ids)
        if result.answer is not None and result.answer.strip():
            result.cited = [p for p in result.passages if gold_in_passages(result.answer, [p])]
        yield event


def _add_unique(seen: list[Passage], passages: list[Passage]) -> None:
    ids = {p.id for p in seen}
    for p in passages:
        if p.id not in ids:
            seen.append(p)
            ids.add(p.id)
