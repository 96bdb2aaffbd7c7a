"""A pool of agents for the HTTP server: N engines, each serving one request at a time.

Every agent owns its engine, and with it its KV cache; an agent is lent to one
request from `acquire` to `release`, so two requests never share (or mix) a
cache. The retriever is shared: the passage store locks its connection, FAISS
searches and onnxruntime sessions are safe to call from several threads.

Requests beyond the free engines wait in a bounded queue (`max_waiting`);
when it is full `acquire` raises `Busy` at once (the server's 503), and a
request that waited `timeout` seconds without an engine gets `Busy` too.

The pool loads nothing itself: `AgentPool.around` grows one loaded agent into
N with an engine opener its caller supplies (`bundle.load_pool` for
`dgpo-edge serve`), so the agent room never reaches up into bundle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .agent import Agent


class Busy(Exception):
    """No engine free and no room (or time) to wait for one."""


class AgentPool:
    """Agents over one retriever; see the module docstring."""

    def __init__(self, agents: list[Agent], max_waiting: int = 8):
        if not agents:
            raise ValueError("an agent pool needs at least one agent")
        if max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {max_waiting}")
        self.agents = list(agents)
        self.max_waiting = max_waiting
        self._free = list(agents)
        self._waiting = 0
        self._closing = False
        # reentrant: `drain` may run in a signal handler on a thread that is inside `stats`
        self._cond = threading.Condition(threading.RLock())

    @classmethod
    def around(cls, first: Agent, open_engine: Callable[[], Any], engines: int = 1,
               max_waiting: int = 8) -> AgentPool:
        """`first` and `engines - 1` agents like it, each on an engine from `open_engine()`, all on
        `first`'s retriever. The pool owns `first` from here: a failure closes it with the rest."""
        agents = [first]
        try:
            if engines < 1:
                raise ValueError(f"engines must be >= 1, got {engines}")
            for _ in range(engines - 1):
                extra = Agent(open_engine(), first.retriever, first.config, timeout_s=first.timeout_s,
                              sampling=first.sampling)
                extra.info = first.info
                agents.append(extra)
            return cls(agents, max_waiting)
        except BaseException:
            cls(agents).close()
            raise

    @property
    def info(self) -> dict[str, Any]:
        return {**self.agents[0].info, "engines": len(self.agents)}

    @property
    def retriever(self) -> Any:
        return self.agents[0].retriever

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"engines": len(self.agents), "busy": len(self.agents) - len(self._free),
                    "waiting": self._waiting, "max_waiting": self.max_waiting}

    def acquire(self, timeout: float | None = None) -> Agent:
        """A free agent, waiting in the queue up to `timeout` seconds; Busy when the queue is full."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._closing:
                raise Busy("the server is shutting down")
            if not self._free and self._waiting >= self.max_waiting:
                raise Busy(f"all {len(self.agents)} engine(s) busy and {self._waiting} request(s) waiting")
            self._waiting += 1
            try:
                while not self._free:
                    if self._closing:
                        raise Busy("the server is shutting down")
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise Busy(f"no engine free after {timeout:g} s")
                    # a --timeout past threading's limit (1e10 s for "no limit") raised OverflowError: a 500
                    self._cond.wait(None if left is None else min(left, threading.TIMEOUT_MAX))
                return self._free.pop()
            finally:
                self._waiting -= 1

    def release(self, agent: Agent) -> None:
        with self._cond:
            if agent not in self._free:
                self._free.append(agent)
            self._cond.notify()

    @property
    def closing(self) -> bool:
        return self._closing

    def drain(self) -> None:
        """Refuse new requests and wake the waiting ones (they get Busy): the server is stopping."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def close(self) -> None:
        """Close every engine, then the shared retriever once."""
        for agent in self.agents:
            close = getattr(agent.engine, "close", None)
            if close is not None:
                close()
        close = getattr(self.agents[0].retriever, "close", None)
        if close is not None:
            close()
