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

import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence

from .fts_postings import Postings
from .lru import LRU
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


def query_words(text: str) -> list[str]:
    """The words of `text` a search matches on ("gustavo's" is "gustavo" and "s"), in order."""
    return _QUERY_WORD.findall(text)


def unasked_words(text: str, question: str) -> list[str]:
    """The words of `text` (a search, a think) that `question` does not hold, case-insensitively, in
    order: what an oracle's search invents ("Rudd" of "Sholto Rudd" for "Sholto side")."""
    asked = {w.lower() for w in query_words(question)}
    return [w for w in query_words(text) if w.lower() not in asked]


def match_expression(query: str) -> str | None:
    """The query's words, quoted and OR-ed (None when it has none).

    Quoting makes punctuation, quotes and FTS5 operators in user text plain words.
    A repeated word stays repeated: bm25() then counts it twice, a query-term
    frequency, as training always scored ("Gaza, Gaza Strip").
    """
    words = query_words(query)
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

    Queries are scored by `fts_postings.Postings` (FTS5's bm25() over numpy arrays, the same
    scores bit for bit, built on the first search); a query with a word FTS5 reads as a phrase
    goes to SQLite. `postings=False` sends every query to SQLite (benchmarks, tests).

    Answers are kept in a bounded cache (the last `cache_size` distinct queries): the index never
    changes, so a cached answer is the answer. RL asks the same questions again every epoch and a
    student's searches for one question mostly repeat.
    """

    def __init__(self, passages: Iterable[Passage], title_weight: float = TITLE_WEIGHT,
                 cache_size: int = 100_000, postings: bool = True):
        self.title_weight = title_weight
        self._passages = list(passages)
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        create_table(self._db, "p")
        insert(self._db, "p", enumerate(self._passages))
        self._db.commit()
        self._use_postings = postings
        self._postings: Postings | None = None
        self._lock = threading.Lock()   # one connection, one query at a time
        self._cache: LRU[tuple[str, int], list[Passage]] = LRU(cache_size)
        self.searched = 0   # queries scored (the rest came from the cache)
        self.phrases = 0    # of those, queries SQLite scored (a word FTS5 splits into a phrase)

    def search(self, query: str, k: int = 3) -> list[Passage]:
        """Top-k passages for the words of `query`, scored."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        """`search` for each query, in order; repeated queries are scored once."""
        with self._lock:
            unique = list(dict.fromkeys(queries))
            found = {q: hit for q in unique if (hit := self._cache.get((q, k))) is not None}
            fresh = {q: self._search(q, k) for q in unique if q not in found}
            self.searched += len(fresh)
            for q, passages in fresh.items():
                self._cache.put((q, k), passages)
        found.update(fresh)
        return [list(found[q]) for q in queries]

    def close(self) -> None:
        """Nothing to release (kept for callers that close their retriever)."""

    def _search(self, query: str, k: int) -> list[Passage]:
        words = _QUERY_WORD.findall(query)
        hits = None
        if self._use_postings and words and k >= 1:
            if self._postings is None:
                self._postings = Postings(self._db, "p", len(self._passages), self.title_weight, TOKENIZER)
            terms = self._postings.terms(words)
            hits = None if terms is None else self._postings.top(terms, k)
        if hits is None:
            self.phrases += bool(words and k >= 1)
            hits = search(self._db, "p", query, k, self.title_weight)
        return [Passage(self._passages[row].id, self._passages[row].contents, score) for row, score in hits]
