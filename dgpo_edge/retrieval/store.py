"""The passage store: one SQLite file of zstd-compressed passages plus a BM25 index.

Layout (docs/retrieval.md, "Passage store"; stdlib sqlite3 + zstandard only):

- `passages(row INTEGER PRIMARY KEY, id TEXT, body BLOB)`, with a unique
  index on the ids that are stored. `row` counts from 0 in input order, so
  FAISS row i is store row i. `body` is one zstd frame of the whole `contents`
  (title line included: titles repeat, and inside the frame the dictionary
  compresses them to a few bytes), in zstd's magicless format (4 bytes a
  passage saved; the format is recorded in `meta`). `id` is NULL when it is
  the row number written in decimal, as in Search-R1's corpora ("0", "1", ...):
  the id column and its index were 13% of the store on FactbookQA. An explicit
  id that reads as another row's number while that row's id is implicit is a
  duplicate, refused at build time like any other.
- `meta(key, value)`: format, compression (`zstd+dict` or `zstd`), level,
  the dictionary bytes, passage count, what built it.
- `passages_fts`: the FTS5 table of `dgpo_edge.fts` (contentless, columns
  `body, title`, unicode61 remove_diacritics 2) with rowid = row, searched with
  that module's scoring, the one training uses. Contentless keeps the text out
  of the index; its bm25() scores are identical to those of a table that
  stores the text, because detail=full keeps the positions bm25 counts. (With
  detail=column or none, FTS5 re-reads the text to count hits, and a
  contentless table scores every row 0.)

Passages are compressed one by one (random access after a FAISS search) with a
dictionary trained on the head of the corpus, which is what makes ~600-byte
passages compress well; below `dict_min_passages` a dictionary would cost more
than it saves, so small stores use plain zstd.
"""

from __future__ import annotations

import sqlite3
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, islice
from pathlib import Path

import zstandard

from .. import __version__
from ..errors import InputError
from ..fts import TITLE_WEIGHT, TOKENIZER as _FTS_TOKENIZER, create_table as _create_fts_table, \
    search as _search_fts
from ..jsonio import atomic_path, require_file
from ..protocol import Passage
from .documents import DocRecord

FORMAT = "dgpo-edge/passage-store/2"
_IN_BATCH = 500  # placeholders per `row IN (...)`, under every SQLite's limit
PLAIN_LEVEL = 19  # small stores: every byte counts and speed does not
DICT_LEVEL = 9  # large stores: 19 saves 0.5% on wiki-18 and triples the build time (hours there)
WHOLE_DICT_LEVEL = 19  # a corpus that fits in the dictionary sample: 4% smaller, seconds of work


class PassageStore:
    """Read-only access to a store file; build one with `PassageStore.build`.

    Safe to share between threads (one lock around the connection and the
    decompressor). Corrupt or truncated files raise InputError naming the file.
    """

    # --- building -----------------------------------------------------------------

    @classmethod
    def build(cls, path: str | Path, passages: Iterable[Passage], batch: int = 2000,
              progress: Callable[[int], None] | None = None, *, level: int | None = None,
              dict_size: int = 64 * 1024, dict_min_passages: int = 1000,
              dict_sample_bytes: int = 8 << 20, fts: bool = True) -> PassageStore:
        """Write `passages` (row i = i-th passage) to `path` atomically; open it.

        The file is built under a temporary name in the same folder and renamed
        onto `path` only when complete: an exception (bad input, Ctrl-C) leaves
        no file at `path`, or the previous one untouched, and no temporary file.
        `progress(n)` is called after each batch with the passages it added (a
        tqdm `update`). `fts=False` skips the BM25 index, for dense-only bundles
        where the index would be most of the file. `level` defaults to 19
        without a dictionary and 9 with one: on wiki-18 passages 19 makes the
        store only 0.5% smaller but the build 3x slower, hours on wiki-18. A
        corpus that fits in the dictionary's sample (`dict_sample_bytes`) is
        small enough for 19 anyway: on FactbookQA (7 MB) it took the store from
        203.2 to 194.8 B/passage for about 20 more seconds.
        """
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        path = Path(path)
        with atomic_path(path) as tmp:
            _write_store(tmp, iter(passages), batch, progress, level, dict_size,
                         dict_min_passages, dict_sample_bytes, fts)
        return cls(path)

    # --- opening ------------------------------------------------------------------

    def __init__(self, path: str | Path):
        """Open `path` read-only, checking it is a whole, readable store."""
        self.path = Path(path)
        _check_sqlite_file(self.path)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True,
                                       check_same_thread=False)
            meta = dict(self._db.execute("SELECT key, value FROM meta"))
        except sqlite3.DatabaseError as e:
            raise InputError(f"not a readable passage store ({e})", self.path) from None
        if meta.get("format") != FORMAT:
            self._db.close()
            old = str(meta.get("format", "")).startswith("dgpo-edge/passage-store/")
            hint = "; rebuild it with this version" if old else ""
            raise InputError(f"not a passage store (format {meta.get('format')!r}, expected {FORMAT!r}){hint}",
                             self.path)
        self.meta = {k: v for k, v in meta.items() if k != "dictionary"}
        try:
            self._count = int(meta["count"])
            self._codec = _Codec(int(meta["level"]), meta.get("dictionary"))
        except (KeyError, ValueError, TypeError, zstandard.ZstdError) as e:
            self._db.close()
            raise InputError(f"corrupt passage store metadata ({type(e).__name__}: {e})", self.path) from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> PassageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading ------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    @property
    def compression(self) -> str:
        """'zstd+dict' (trained dictionary) or 'zstd' (small stores)."""
        return str(self.meta["compression"])

    @property
    def has_bm25(self) -> bool:
        return self.meta.get("fts") == "1"

    def bytes(self) -> int:
        """Size of the store file in bytes (what a bundle ships)."""
        return self.path.stat().st_size

    def get_by_row(self, row: int) -> Passage:
        """Passage at `row` (0-based, = FAISS row); IndexError when out of range."""
        return self.get_rows([row])[0]

    def get_by_id(self, pid: str) -> Passage:
        """Passage with id `pid`; KeyError when absent."""
        pid = str(pid)
        found = self._query("SELECT row, id, body FROM passages WHERE id = ?", (pid,))
        if not found and _is_row_number(pid) and int(pid) < self._count:
            found = self._query("SELECT row, id, body FROM passages WHERE row = ? AND id IS NULL", (int(pid),))
        if not found:
            raise KeyError(pid)
        return self._passage(found[0])

    def get_rows(self, rows: Sequence[int], scores: Sequence[float] | None = None) -> list[Passage]:
        """Passages at `rows`, in that order (repeats allowed), optionally scored.

        Made for FAISS results: numpy integers are accepted; FAISS's -1 (fewer
        hits than k) is out of range like any other bad row, so drop it first.
        """
        wanted = [int(r) for r in rows]
        if scores is not None and len(scores) != len(wanted):
            raise ValueError(f"{len(wanted)} rows but {len(scores)} scores")
        found = {}
        for start in range(0, len(wanted), _IN_BATCH):
            part = sorted(set(wanted[start:start + _IN_BATCH]) - found.keys())
            if part:
                sql = f"SELECT row, id, body FROM passages WHERE row IN ({','.join('?' * len(part))})"
                found.update((r[0], r) for r in self._query(sql, part))
        out = []
        for i, r in enumerate(wanted):
            if r not in found:
                raise IndexError(f"row {r} out of range: the store has rows 0..{self._count - 1}")
            out.append(self._passage(found[r], None if scores is None else float(scores[i])))
        return out

    def iter_passages(self, batch: int = 2000) -> Iterator[Passage]:
        """Every passage in row order, `batch` rows per query (for re-encoding).

        Rows are read by key, not counted: an updated index (`index update`)
        has gaps where removed passages were.
        """
        after = -1
        while found := self._query("SELECT row, id, body FROM passages WHERE row > ? ORDER BY row LIMIT ?",
                                   (after, batch)):
            yield from (self._passage(r) for r in found)
            after = found[-1][0]

    def documents(self) -> list[DocRecord]:
        """What each file of a documents folder gave (empty for jsonl corpora and older stores)."""
        if not self._query("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'documents'"):
            return []
        return [DocRecord(*r) for r in self._query(f"SELECT {_DOC_COLUMNS} FROM documents ORDER BY path")]

    def bm25(self, query: str, k: int = 3, title_weight: float = TITLE_WEIGHT) -> list[Passage]:
        """Top-k passages for any of the query's words, best first (`dgpo_edge.fts.search`).

        Punctuation, quotes and FTS5 operators in user text are plain words; a
        query with no words gives []. Scores are FTS5 bm25() negated (higher is
        better). `title_weight` scales title hits relative to body hits; the
        default is the one training retrieves with.
        """
        if not self.has_bm25:
            raise InputError("this store was built without a BM25 index", self.path)
        with self._lock:
            try:
                hits = _search_fts(self._db, "passages_fts", query, k, title_weight)
            except sqlite3.DatabaseError as e:
                raise InputError(f"corrupt passage store ({e})", self.path) from None
        return self.get_rows([r for r, _ in hits], [s for _, s in hits])

    # --- internals ------------------------------------------------------------------

    def _query(self, sql: str, params: Sequence = ()) -> list[tuple]:
        """Run a read query, turning SQLite corruption errors into InputError."""
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as e:
                raise InputError(f"corrupt passage store ({e})", self.path) from None

    def _passage(self, record: tuple, score: float | None = None) -> Passage:
        row, pid, blob = record
        with self._lock:
            try:
                contents = self._codec.decompress(blob)
            except (zstandard.ZstdError, UnicodeDecodeError) as e:
                raise InputError(f"corrupt passage text at row {row} ({e})", self.path) from None
        return Passage(str(row) if pid is None else pid, contents, score)


# --- compression ------------------------------------------------------------------------

class _Codec:
    """zstd for passage contents, with or without a trained dictionary.

    Frames are magicless and omit the dictionary id and checksum (4 bytes
    each, per passage): the one dictionary and the format live in `meta`.
    """

    def __init__(self, level: int, dictionary: bytes | None):
        kwargs = {}
        if dictionary is not None:
            kwargs["dict_data"] = zstandard.ZstdCompressionDict(dictionary)
        params = zstandard.ZstdCompressionParameters.from_level(
            level, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_dict_id=False, write_checksum=False,
            write_content_size=True)
        self._c = zstandard.ZstdCompressor(compression_params=params, **kwargs)
        self._d = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS, **kwargs)

    def compress(self, contents: str) -> bytes:
        return self._c.compress(contents.encode("utf-8"))

    def decompress(self, blob: bytes) -> str:
        return self._d.decompress(blob).decode("utf-8")


def _is_row_number(pid: str) -> bool:
    """Whether `pid` is a row number as `str(row)` writes it ("0", "17"; not "007" or "+1")."""
    return pid.isascii() and pid.isdigit() and (pid == "0" or pid[0] != "0")


def _train(sample: list[Passage], level: int, dict_size: int) -> bytes | None:
    """A dictionary for the sample's contents, or None when zstd cannot train one.

    Capped at 1/20 of the sample: zstd wants ~100x more sample than dictionary,
    and on small corpora a large dictionary mostly memorises (and costs) bytes.
    """
    texts = [c.encode("utf-8") for p in sample if (c := p.contents)]
    size = min(dict_size, sum(map(len, texts)) // 20)
    if size < 1024:
        return None
    try:
        return zstandard.train_dictionary(size, texts, level=level).as_bytes()
    except zstandard.ZstdError:
        return None


# --- writing ------------------------------------------------------------------------------

def _write_store(tmp: str, passages: Iterator[Passage], batch: int,
                 progress: Callable[[int], None] | None, level: int | None, dict_size: int,
                 dict_min_passages: int, dict_sample_bytes: int, fts: bool) -> None:
    """Fill the (empty) temp file `tmp` with a complete store, then fsync it."""
    sample, whole = _take_sample(passages, dict_min_passages, dict_sample_bytes)
    dictionary = None
    if len(sample) >= dict_min_passages:
        dictionary = _train(sample, DICT_LEVEL if level is None else level, dict_size)
    if level is None:
        level = PLAIN_LEVEL if dictionary is None else WHOLE_DICT_LEVEL if whole else DICT_LEVEL
    codec = _Codec(level, dictionary)
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        _create_schema(db, fts)
        db.execute("BEGIN")
        count = _insert_all(db, codec, chain(sample, passages), batch, progress, fts)
        if count == 0:
            raise InputError("empty corpus: no passages to store")
        if fts:
            db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('optimize')")
        _write_meta(db, level, dictionary, count, fts)
        db.execute("COMMIT")
        # Give back the pages FTS5 freed when merging segments (a third of the
        # file on the wiki sample). Unlike VACUUM this needs no second copy of
        # the file. executescript, because the sqlite3 module steps this
        # pragma only once, which frees a single page.
        db.executescript("PRAGMA incremental_vacuum;")
    finally:
        db.close()   # (atomic_path fsyncs the file before its rename)


def _take_sample(passages: Iterator[Passage], min_count: int,
                 min_bytes: int) -> tuple[list[Passage], bool]:
    """The first passages, enough to train on (`min_count` and `min_bytes` of
    text), and whether they are the whole corpus.

    The corpus is streamed, so the dictionary must be trained on its head
    before anything is written; 8 MiB is ~100x a 64 KiB dictionary.
    """
    sample, size = [], 0
    for p in passages:
        sample.append(p)
        size += len(p.contents)
        if len(sample) >= min_count and size >= min_bytes:
            return sample, False
    return sample, True


def _create_schema(db: sqlite3.Connection, fts: bool) -> None:
    """Tables; journal and sync are off because the file is a temp until renamed."""
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # must precede the first table
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    db.execute("PRAGMA cache_size = -65536")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value)")
    db.execute("CREATE TABLE passages (row INTEGER PRIMARY KEY, id TEXT, body BLOB)")
    db.execute("CREATE UNIQUE INDEX passages_id ON passages(id) WHERE id IS NOT NULL")
    if fts:
        _create_fts_table(db, "passages_fts")


def _insert_all(db: sqlite3.Connection, codec: _Codec, passages: Iterator[Passage], batch: int,
                progress: Callable[[int], None] | None, fts: bool) -> int:
    """Insert every passage in `batch`-sized executemany calls; returns the count."""
    row = 0
    while chunk := list(islice(passages, batch)):
        _insert_rows(db, codec, row, chunk, fts)
        row += len(chunk)
        if progress is not None:
            progress(len(chunk))
    _check_implicit_ids(db, row)
    return row


def _insert_rows(db: sqlite3.Connection, codec: _Codec, start: int, passages: Sequence[Passage],
                 fts: bool) -> list[int]:
    """Store `passages` at rows start, start + 1, ... (and in BM25); return the rows."""
    records = [(start + i, _stored_id(start + i, p.id), codec.compress(p.contents))
               for i, p in enumerate(passages)]
    try:
        db.executemany("INSERT INTO passages VALUES (?, ?, ?)", records)
    except sqlite3.IntegrityError:
        raise _duplicate_error(db, records) from None
    if fts:
        db.executemany("INSERT INTO passages_fts(rowid, body, title) VALUES (?, ?, ?)",
                       [(r, p.text, p.title) for (r, *_), p in zip(records, passages)])
    return [r for r, *_ in records]


def _stored_id(row: int, pid: object) -> str | None:
    """NULL for the id every row has implicitly (its own number), else the id as text."""
    pid = str(pid)
    return None if pid == str(row) else pid


def _check_implicit_ids(db: sqlite3.Connection, count: int) -> None:
    """Refuse an explicit id equal to another row's implicit one (its number)."""
    rows = db.execute("SELECT row, id FROM passages WHERE id IS NOT NULL AND id GLOB '[0-9]*'")
    for row, pid in rows:
        if _is_row_number(pid) and int(pid) < count:
            other = db.execute("SELECT id FROM passages WHERE row = ?", (int(pid),)).fetchone()
            if other is not None and other[0] is None:
                raise InputError(f"duplicate passage id {pid!r} (passages {pid} and {row})")


def _duplicate_error(db: sqlite3.Connection, records: list[tuple]) -> InputError:
    """Name the duplicate id: the first record whose id is stored under another row.

    executemany stops at the failing row, so every earlier record of the batch
    is stored under its own row and the failing one finds its id elsewhere.
    """
    for row, pid, _ in records:
        other = db.execute("SELECT row FROM passages WHERE id = ?", (pid,)).fetchone()
        if other is not None and other[0] != row:
            return InputError(f"duplicate passage id {pid!r} (passages {other[0]} and {row})")
    return InputError("duplicate passage id")


def _write_meta(db: sqlite3.Connection, level: int, dictionary: bytes | None, count: int,
                fts: bool) -> None:
    """Record how to read the file back and what produced it."""
    meta = {
        "format": FORMAT,
        "compression": "zstd+dict" if dictionary is not None else "zstd",
        "level": str(level),
        "count": str(count),
        "fts": "1" if fts else "0",
        "fts_tokenizer": _FTS_TOKENIZER if fts else "",
        "created_by": f"dgpo-edge {__version__}, zstandard {zstandard.__version__}, "
                      f"SQLite {sqlite3.sqlite_version}",
    }
    if dictionary is not None:
        meta["dictionary"] = dictionary
    db.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())


# --- documents and in-place edits (index update) --------------------------------------------------

_DOC_COLUMNS = "path, size, mtime_ns, sha256, passages, reason"


def write_documents(path: str | Path, records: Iterable[DocRecord]) -> None:
    """Record (replacing any earlier records) what each source file gave, in the store at `path`."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN")
        _replace_documents(db, records)
        db.execute("COMMIT")
    finally:
        db.close()


def _replace_documents(db: sqlite3.Connection, records: Iterable[DocRecord]) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS documents (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, "
               "sha256 TEXT, passages INTEGER, reason TEXT)")
    db.execute("DELETE FROM documents")
    db.executemany(f"INSERT INTO documents ({_DOC_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                   [r.as_row() for r in records])


def edit_store(path: str | Path, drop_ids: Sequence[str], add: Sequence[Passage],
               records: Iterable[DocRecord]) -> tuple[list[int], list[int]]:
    """Remove the passages `drop_ids` and append `add` at new rows, in place; return (dropped, added) rows.

    For `index update`, on a work copy of a store (the caller renames it into
    place). New rows continue after the largest row, so the rows, and with
    them the FAISS ids, of every other passage stay as they were. New text is
    compressed with the store's own dictionary; BM25 entries of removed rows
    are deleted with their original text, as a contentless FTS5 table requires.
    """
    db = sqlite3.connect(path, isolation_level=None)
    try:
        meta = dict(db.execute("SELECT key, value FROM meta"))
        codec, fts = _Codec(int(meta["level"]), meta.get("dictionary")), meta.get("fts") == "1"
        db.execute("BEGIN")
        dropped = _drop_ids(db, codec, list(drop_ids), fts)
        start = db.execute("SELECT coalesce(max(row) + 1, 0) FROM passages").fetchone()[0]
        added = _insert_rows(db, codec, start, add, fts)
        count = db.execute("SELECT count(*) FROM passages").fetchone()[0]
        if count == 0:
            raise InputError("empty corpus: the update would leave no passages")
        db.execute("UPDATE meta SET value = ? WHERE key = 'count'", (str(count),))
        _replace_documents(db, records)
        db.execute("COMMIT")
        if fts:
            db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('optimize')")
        db.executescript("PRAGMA incremental_vacuum;")
    finally:
        db.close()
    return dropped, added


def _drop_ids(db: sqlite3.Connection, codec: _Codec, ids: list[str], fts: bool) -> list[int]:
    """Delete the passages with these ids (and their BM25 entries); their rows, ascending."""
    rows = []
    for start in range(0, len(ids), _IN_BATCH):
        part = ids[start:start + _IN_BATCH]
        found = db.execute(f"SELECT row, id, body FROM passages WHERE id IN ({','.join('?' * len(part))})",
                           part).fetchall()
        if fts:
            texts = [(r, Passage(pid, codec.decompress(body))) for r, pid, body in found]
            db.executemany("INSERT INTO passages_fts(passages_fts, rowid, body, title) "
                           "VALUES ('delete', ?, ?, ?)", [(r, p.text, p.title) for r, p in texts])
        db.executemany("DELETE FROM passages WHERE row = ?", [(r,) for r, *_ in found])
        rows.extend(r for r, *_ in found)
    return sorted(rows)


# --- integrity ------------------------------------------------------------------------------

_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_sqlite_file(path: Path) -> None:
    """Fail fast on a missing, foreign or truncated file, without reading it all.

    SQLite itself opens a truncated file happily and fails later, mid-query, on
    whichever page is missing; the header records the page count, so comparing
    it with the file size catches truncation in O(1) (a full integrity check
    would read gigabytes on every open).
    """
    require_file(path)
    with open(path, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        raise InputError("not a passage store (not an SQLite file)", path)
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, n_pages = struct.unpack(">II", header[24:32])
    valid_for = struct.unpack(">I", header[92:96])[0]
    expected = page_size * n_pages
    if valid_for == change_counter and path.stat().st_size < expected:
        raise InputError(f"truncated passage store: {path.stat().st_size} bytes, "
                         f"header says {expected}", path)
