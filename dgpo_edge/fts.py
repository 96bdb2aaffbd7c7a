"""A small BM25 index on SQLite FTS5 (stdlib only).

Used where a real lexical retriever is needed without building an index on
disk, e.g. to check that FactbookQA's oracle queries retrieve their evidence.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable

from .protocol import Passage

_WORD = re.compile(r"\w+", re.UNICODE)


class BM25Index:
    """In-memory FTS5 table over (id, title, text); `search` ranks by bm25()."""

    def __init__(self, passages: Iterable[Passage], title_weight: float = 4.0):
        # Titles name the entity ("Peru — Government"); weighting them keeps a
        # country's own passages ahead of passages that merely mention it.
        self.title_weight = title_weight
        self._db = sqlite3.connect(":memory:")
        self._db.execute("CREATE VIRTUAL TABLE p USING fts5(pid UNINDEXED, title, body, "
                         "tokenize='unicode61 remove_diacritics 2')")
        self._db.executemany("INSERT INTO p VALUES (?, ?, ?)",
                             ((p.id, p.title, p.text) for p in passages))
        self._contents = {pid: (title, body) for pid, title, body in self._db.execute("SELECT * FROM p")}

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """Top-k passages for the words of `query` (OR-ed; punctuation ignored)."""
        words = _WORD.findall(query)
        if not words:
            return []
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        rows = self._db.execute(
            "SELECT pid, title, body, bm25(p, 0, ?, 1) AS s FROM p WHERE p MATCH ? ORDER BY s LIMIT ?",
            (self.title_weight, match, k)).fetchall()
        # bm25() is lower-is-better; report the usual higher-is-better score.
        return [Passage(pid, f'"{title}"\n{body}', -score) for pid, title, body, score in rows]
