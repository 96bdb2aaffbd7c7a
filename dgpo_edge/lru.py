"""A bounded memory that forgets the least recently used entry first.

The answers it holds are exact (BM25 results of an index that never changes, the length of an
observation that fits), so a remembered entry is always the right one; the bound only caps memory.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `size` entries (`size` < 1: none are kept); `get` counts as a use."""

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        if key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, key: K, value: V) -> None:
        if self.size < 1:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
