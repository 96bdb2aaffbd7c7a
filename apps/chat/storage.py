"""Chat history: SQLite under the XDG data directory.

`$XDG_DATA_HOME/dgpo-edge/chats.sqlite` (default `~/.local/share/...`). A chat
is a titled list of exchanges; each exchange (question, steps, answer,
sources, timings) is stored as one JSON document, so what the chat shows is
what comes back when a chat is reopened.

Several chat windows (processes) and threads may use one file at once: every
operation opens its own short-lived connection, the database runs in WAL mode
with a busy timeout, and writes take the write lock up front
(`BEGIN IMMEDIATE`) so a read-then-write such as numbering an exchange cannot
interleave with another writer's.

An existing file is first opened read-only and used only when it has this
app's tables and format (`PRAGMA user_version`); anything else (another
application's database, a newer format) is refused untouched. A missing or
empty file becomes a new history.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.request import pathname2url

from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import check_folder_path

from .exchange import Exchange

FILE_NAME = "chats.sqlite"
# What a damaged history file raises from any ChatStore call: the app shows it and goes on.
HISTORY_ERRORS = (InputError, sqlite3.Error)
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    title   TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS exchanges (
    chat_id  INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    created  REAL NOT NULL,
    body     TEXT NOT NULL,
    PRIMARY KEY (chat_id, position)
);
"""
# The columns of each table, in order: an existing file must have exactly these to be used.
_TABLES = {"chats": ["id", "title", "created", "updated"],
           "exchanges": ["chat_id", "position", "created", "body"]}


def default_path() -> Path:
    """`$XDG_DATA_HOME/dgpo-edge/chats.sqlite`, or under `~/.local/share` when unset.

    The XDG spec says a relative value is invalid and must be ignored.
    """
    base = os.environ.get("XDG_DATA_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "share"
    return root / "dgpo-edge" / FILE_NAME


@dataclass(frozen=True)
class ChatSummary:
    """A row of the chat list."""

    id: int
    title: str
    created: float
    updated: float
    exchanges: int


class ChatStore:
    """Chats in one SQLite file; safe across threads and processes (see the module docstring).

    `clock` gives the timestamps written (seconds since the epoch); tests pass a
    fixed one so what they render is deterministic.
    """

    def __init__(self, path: str | Path | None = None, clock: Callable[[], float] = time.time,
                 timeout_s: float = 10.0):
        self.path = Path(path) if path is not None else default_path()
        self.clock, self.timeout_s = clock, timeout_s
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create the chat history folder ({e.strerror})", self.path.parent) from None
        if _check_existing(self.path, timeout_s):
            return
        with self._connect() as db:   # a new (or empty) file: make it a chat history
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # --- writing ------------------------------------------------------------------

    def create_chat(self, title: str) -> int:
        """A new, empty chat; returns its id."""
        now = self.clock()
        with self._write() as db:
            return int(db.execute("INSERT INTO chats (title, created, updated) VALUES (?, ?, ?)",
                                  (_title(title), now, now)).lastrowid)

    def add_exchange(self, chat_id: int, exchange: Exchange) -> int:
        """Append `exchange` to the chat; returns its 0-based position. KeyError: no such chat."""
        now = self.clock()
        body = json.dumps(exchange.to_dict(), ensure_ascii=False)
        with self._write() as db:
            if db.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone() is None:
                raise KeyError(chat_id)
            position = db.execute("SELECT COUNT(*) FROM exchanges WHERE chat_id = ?", (chat_id,)).fetchone()[0]
            db.execute("INSERT INTO exchanges (chat_id, position, created, body) VALUES (?, ?, ?, ?)",
                       (chat_id, position, now, body))
            db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
            return int(position)

    def delete_chat(self, chat_id: int) -> bool:
        """Delete a chat and its exchanges; False when there was no such chat."""
        with self._write() as db:
            return db.execute("DELETE FROM chats WHERE id = ?", (chat_id,)).rowcount > 0

    # --- reading ------------------------------------------------------------------

    def list_chats(self) -> list[ChatSummary]:
        """All chats, most recently updated first."""
        with self._connect() as db:
            rows = db.execute("SELECT c.id, c.title, c.created, c.updated, COUNT(e.position) FROM chats c "
                              "LEFT JOIN exchanges e ON e.chat_id = c.id GROUP BY c.id "
                              "ORDER BY c.updated DESC, c.id DESC").fetchall()
        return [ChatSummary(int(r[0]), r[1], float(r[2]), float(r[3]), int(r[4])) for r in rows]

    def load_chat(self, chat_id: int) -> list[Exchange]:
        """The chat's exchanges in order. KeyError: no such chat."""
        with self._connect() as db:
            if db.execute("SELECT 1 FROM chats WHERE id = ?", (chat_id,)).fetchone() is None:
                raise KeyError(chat_id)
            rows = db.execute("SELECT position, body FROM exchanges WHERE chat_id = ? ORDER BY position",
                              (chat_id,)).fetchall()
        out = []
        for position, body in rows:
            try:
                exchange = Exchange.from_dict(json.loads(body))
                _check_types(exchange)
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise InputError(f"chat {chat_id}, exchange {position} is corrupt ({type(e).__name__}: {e})",
                                 self.path) from None
            out.append(exchange)
        return out

    # --- connections ----------------------------------------------------------------

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A fresh connection (autocommit; WAL; foreign keys), closed afterwards."""
        try:
            db = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        except sqlite3.Error as e:
            raise InputError(f"cannot open the chat history ({e})", self.path) from None
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA foreign_keys = ON")
            yield db
        except sqlite3.DatabaseError as e:
            if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
                raise  # contention that outlasted the timeout is not bad input
            raise InputError(f"not a readable chat history ({e})", self.path) from None
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding the write lock from its start."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


def check_history(path: str | Path | None = None, timeout_s: float = 10.0) -> None:
    """What opening a ChatStore on `path` would refuse, found without writing anything: a folder,
    a file that is not a chat history of this format, a folder that cannot be made above it.
    `chat` runs this before it loads the model and opens the store only when the app starts,
    so a chat refused in between (no terminal, a model that fails) leaves no new file or folder."""
    path = Path(path) if path is not None else default_path()
    check_folder_path(path.parent, "the chat history folder")
    _check_existing(path, timeout_s)


def _check_existing(path: Path, timeout_s: float) -> bool:
    """True for an existing chat history of this format, False for no file or an empty one.

    Read-only, so a file that is not ours (another application's database) is refused
    before anything could change it: no table created, no WAL switch, no pragma written.
    """
    if path.is_dir():
        raise InputError("is a folder; give --history a file (e.g. chats.sqlite inside it)", path)
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return False
    uri = "file:" + pathname2url(str(path.resolve())) + "?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=timeout_s)) as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {name: [c[1] for c in db.execute(f"PRAGMA table_info('{name}')")]
                      for name in _TABLES}
            empty = db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
    except sqlite3.DatabaseError as e:
        raise InputError(f"not a readable chat history ({e})", path) from None
    if empty and version == 0:
        return False
    if tables != _TABLES:
        raise InputError("not a dgpo-edge chat history (it lacks this app's tables): refused, left "
                         "unchanged; give --history another file", path)
    if version > SCHEMA_VERSION:
        raise InputError(f"chat history format {version} is newer than this dgpo-edge reads "
                         f"({SCHEMA_VERSION})", path)
    if version != SCHEMA_VERSION:
        raise InputError(f"not a dgpo-edge chat history (format {version}, expected {SCHEMA_VERSION}): "
                         "refused, left unchanged", path)
    return True


_TYPES = {"str": (str,), "None": (type(None),), "int": (int,), "float": (int, float), "bool": (bool,)}


def _check_types(obj: object) -> None:
    """TypeError unless every field of a loaded Exchange (and its Steps and Sources) has its declared type.

    A stored body can parse as JSON and still hold, say, a number for the question; the
    widgets would fail on it while drawing, taking the app down, so it is caught here.
    """
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value, hint = getattr(obj, f.name), str(f.type)
        if hint.startswith("list["):
            if not isinstance(value, list):
                raise TypeError(f"{f.name} must be a list")
            for item in value:
                _check_types(item)
            continue
        allowed = tuple(t for part in hint.split("|") for t in _TYPES[part.strip()])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise TypeError(f"{f.name} must be {hint}, got {type(value).__name__}")


def _title(question: str, width: int = 60) -> str:
    """A one-line chat title from its first question."""
    line = " ".join(question.split()) or "(untitled)"
    return line if len(line) <= width else line[:width - 1].rstrip() + "…"
