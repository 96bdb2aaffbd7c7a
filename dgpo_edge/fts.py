"""BM25 on SQLite FTS5 (stdlib only): the project's one lexical scoring.

Training (FactbookQA's oracle trajectories, rollouts and dev EM over a corpus
.jsonl) searches a `BM25Index`; the laptop searches `PassageStore.bm25` (the
`bm25` and `hybrid` index kinds). Both go through this module: the same
contentless FTS5 table (columns `body, title`; `unicode61 remove_diacritics 2`),
the same query words, the same weights (title hits 4x) and the same tie order
(row), so a student's query ranks the same passages in training as on the
laptop.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .protocol import Passage

TOKENIZER = "unicode61 remove_diacritics 2"
# Titles name the entity ("Peru — Government"); weighting them keeps a country's
# own passages ahead of passages that merely mention it.
TITLE_WEIGHT = 4.0
_QUERY_WORD = re.compile(r"[^\W_]+")  # what unicode61 keeps as token characters


def create_table(db: sqlite3.Connection, name: str) -> None:
    """The FTS5 table: contentless (`content=''`), `body` first.

    Contentless keeps the text out of the index; with detail=full its bm25()
    equals that of a table storing the text. `body` comes first because FTS5
    writes a column marker for every hit outside column 0 (25% smaller on wiki-18).
    """
    db.execute(f"CREATE VIRTUAL TABLE {name} USING fts5(body, title, content='', tokenize='{TOKENIZER}')")


def insert(db: sqlite3.Connection, name: str, rows: Iterable[tuple[int, Passage]]) -> None:
    """Index `(row, passage)` pairs; the row is the FTS5 rowid search returns.

    The passage store writes the same `(rowid, body=text, title)` rows in its own batches.
    """
    db.executemany(f"INSERT INTO {name}(rowid, body, title) VALUES (?, ?, ?)",
                   ((row, p.text, p.title) for row, p in rows))


def match_expression(query: str) -> str | None:
    """The query's words, quoted and OR-ed (None when it has none).

    Quoting makes punctuation, quotes and FTS5 operators in user text plain words.
    A repeated word stays repeated: bm25() then counts it twice, a query-term
    frequency, as training always scored ("Gaza, Gaza Strip").
    """
    words = _QUERY_WORD.findall(query)
    return " OR ".join(f'"{w}"' for w in words) if words else None


def search(db: sqlite3.Connection, name: str, query: str, k: int,
           title_weight: float = TITLE_WEIGHT) -> list[tuple[int, float]]:
    """Top-k `(row, score)` for any of the query's words, best first, ties by row.

    Scores are FTS5 bm25() negated (higher is better).
    """
    match = match_expression(query)
    if match is None or k < 1:
        return []
    rows = db.execute(f"SELECT rowid, bm25({name}, 1.0, ?) AS s FROM {name} WHERE {name} MATCH ? "
                      "ORDER BY s, rowid LIMIT ?", (title_weight, match, k)).fetchall()
    return [(row, 0.0 - s) for row, s in rows]


class BM25Index:
    """An in-memory index over passages (no file to build); `search` returns Passages.

    `search_many` answers a batch of queries (a rollout round's searches) on several threads,
    each with its own copy of the in-memory database (SQLite runs a query without the GIL, but
    one connection runs one query at a time); repeated queries are answered once.

    Answers are kept in a bounded cache (the last `cache_size` distinct queries): the index never
    changes, so a cached answer is the answer. RL asks the same questions again every epoch and a
    student's searches for one question mostly repeat; a query of common words ("what is the ...")
    makes FTS5 score most of the corpus, so a repeat saved is worth having.
    """

    def __init__(self, passages: Iterable[Passage], title_weight: float = TITLE_WEIGHT,
                 threads: int | None = None, cache_size: int = 100_000):
        self.title_weight = title_weight
        self._passages = list(passages)
        self._db = sqlite3.connect(":memory:")
        create_table(self._db, "p")
        insert(self._db, "p", enumerate(self._passages))
        self._db.commit()  # serialize() copies committed pages only
        self.threads = threads if threads is not None else min(8, os.cpu_count() or 1)
        self._image: bytes | None = None
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, int], list[Passage]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.searched = 0   # queries that reached SQLite (the rest came from the cache)

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """Top-k passages for the words of `query`, scored."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        """`search` for each query, in order; the same results, on `threads` threads."""
        unique = list(dict.fromkeys(queries))
        found = self._cached(unique, k)
        todo = [q for q in unique if q not in found]
        if self.threads < 2 or len(todo) < 2 * self.threads:
            fresh = {q: self._search(self._db, q, k) for q in todo}
        else:
            if self._pool is None:
                self._image = self._db.serialize()
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="bm25")
            fresh = dict(zip(todo, self._pool.map(lambda q: self._search(self._thread_db(), q, k), todo)))
        self._remember(fresh, k)
        found.update(fresh)
        return [list(found[q]) for q in queries]

    def _cached(self, queries: Iterable[str], k: int) -> dict[str, list[Passage]]:
        with self._cache_lock:
            hits = {q: self._cache[(q, k)] for q in queries if (q, k) in self._cache}
            for q in hits:
                self._cache.move_to_end((q, k))
        return hits

    def _remember(self, fresh: dict[str, list[Passage]], k: int) -> None:
        with self._cache_lock:
            self.searched += len(fresh)
            if self.cache_size < 1:
                return
            for q, passages in fresh.items():
                self._cache[(q, k)] = passages
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _search(self, db: sqlite3.Connection, query: str, k: int) -> list[Passage]:
        return [Passage(self._passages[row].id, self._passages[row].contents, score)
                for row, score in search(db, "p", query, k, self.title_weight)]

    def _thread_db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:  # this thread's own copy of the index (a few MB for FactbookQA)
            db = self._local.db = sqlite3.connect(":memory:", check_same_thread=False)
            db.deserialize(self._image)
        return db
