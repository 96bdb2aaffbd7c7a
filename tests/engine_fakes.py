"""Test doubles: a byte-level scripted Engine and an in-memory Retriever.

`ScriptedEngine` runs the real `Engine.generate` loop (cache reuse, stop strings,
EOS, streaming) over a byte vocabulary (ids 0..255, EOS = 256): each call to
`generate` plays the next scripted turn one byte per token, then EOS. It records
the ids every call evaluated, so tests can check KV reuse without a model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dgpo_edge.engines.base import Engine, Sampling
from dgpo_edge.protocol import Passage
from dgpo_edge.retrieval.base import Retriever

EOS = 256


class ScriptedEngine(Engine):
    name = "scripted"

    def __init__(self, turns: Sequence[str], n_ctx: int = 4096, merge: dict[str, str] | None = None,
                 delay_s: float = 0.0):
        super().__init__()
        self.turns = list(turns)
        self.n_ctx = n_ctx
        self.eos_ids = frozenset({EOS})
        self.model_path = "<scripted>"
        self.evaluated: list[list[int]] = []   # ids passed to _evaluate, per call
        self.calls = 0
        self.delay_s = delay_s
        self._script: list[int] = []
        self._pos = 0
        self.merge = merge or {}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def generate(self, ids, max_new_tokens, sampling: Sampling = Sampling(), stop=None):
        script = self.turns[self.calls] if self.calls < len(self.turns) else ""
        self.calls += 1
        self._script = list(script.encode("utf-8"))
        self._pos = 0
        return super().generate(ids, max_new_tokens, sampling, stop)

    def _truncate(self, keep: int) -> None:
        pass

    def _evaluate(self, ids: Sequence[int]) -> None:
        self.evaluated.append(list(ids))
        if self.delay_s:
            import time

            time.sleep(self.delay_s)

    def _logits(self) -> np.ndarray:
        x = np.zeros(257, dtype=np.float32)
        x[self._script[self._pos] if self._pos < len(self._script) else EOS] = 1.0
        return x

    def _pick(self, logits, sampling):
        tok = super()._pick(logits, sampling)
        self._pos += 1
        return tok


class ListRetriever(Retriever):
    """Returns passages whose text contains a query word, in corpus order."""

    def __init__(self, passages: Sequence[Passage]):
        self.passages = list(passages)
        self.queries: list[str] = []
        self.closed = False

    def search(self, queries, k=3):
        out = []
        for q in queries:
            self.queries.append(q)
            words = {w.lower() for w in q.split()}
            out.append([p for p in self.passages if words & set(p.contents.lower().split())][:k])
        return out

    def close(self) -> None:
        self.closed = True
