"""Chat history in SQLite: XDG location, reopen, deletion, concurrent writers, bad files."""

from __future__ import annotations

import contextlib
import multiprocessing
import sqlite3
import threading
from pathlib import Path

import pytest

from dgpo_edge.apps.chat.exchange import Exchange, Source, Step
from dgpo_edge.apps.chat.storage import ChatStore, default_path
from dgpo_edge.errors import InputError


def exchange(question: str, answer: str | None = "Lima") -> Exchange:
    return Exchange(
        question, answer=answer, stop_reason="answer" if answer else "max_turns",
        steps=[Step("think", 0, text="I should search."),
               Step("search", 0, query="capital of Peru", retrieval_ms=3.5,
                    passages=[Source("p1", "Peru — Government", "The capital of Peru is Lima.")]),
               Step("think", 1, text="Found it.")],
        sources=[Source("p1", "Peru — Government", "The capital of Peru is Lima.")], sources_cited=True,
        new_tokens=42, seconds=1.25)


def test_default_path_honours_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_path() == tmp_path / "data" / "dgpo-edge" / "chats.sqlite"
    store = ChatStore()
    assert store.path == default_path() and store.path.is_file()
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")  # invalid per the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "dgpo-edge" / "chats.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_path() == tmp_path / "home" / ".local" / "share" / "dgpo-edge" / "chats.sqlite"


def test_exchanges_round_trip_and_survive_reopening(tmp_path):
    path = tmp_path / "chats.sqlite"
    times = iter([100.0, 101.0, 102.0, 103.0])
    store = ChatStore(path, clock=lambda: next(times))
    first = store.create_chat("  What is the\ncapital of Peru?  ")
    assert store.add_exchange(first, exchange("What is the capital of Peru?")) == 0
    assert store.add_exchange(first, exchange("And of Chile?", answer=None)) == 1
    second = store.create_chat("x" * 100)

    again = ChatStore(path)  # a new session
    chats = again.list_chats()
    assert [c.id for c in chats] == [second, first]  # most recently updated first
    assert chats[1].title == "What is the capital of Peru?" and chats[1].exchanges == 2
    assert (chats[1].created, chats[1].updated) == (100.0, 102.0)
    assert len(chats[0].title) == 60 and chats[0].title.endswith("…") and chats[0].exchanges == 0
    loaded = again.load_chat(first)
    assert loaded == [exchange("What is the capital of Peru?"), exchange("And of Chile?", answer=None)]
    assert loaded[0].steps[1].passages[0].title == "Peru — Government"
    assert again.load_chat(second) == []


def test_delete_removes_the_chat_and_its_exchanges(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    keep, gone = store.create_chat("keep"), store.create_chat("gone")
    store.add_exchange(gone, exchange("q"))
    store.add_exchange(keep, exchange("q"))
    assert store.delete_chat(gone) is True
    assert store.delete_chat(gone) is False
    assert [c.id for c in store.list_chats()] == [keep]
    with pytest.raises(KeyError):
        store.load_chat(gone)
    with pytest.raises(KeyError):
        store.add_exchange(gone, exchange("late"))
    with sqlite3.connect(store.path) as db:  # the cascade removed the rows, not just the chat
        assert db.execute("SELECT COUNT(*) FROM exchanges").fetchone()[0] == 1


def test_concurrent_writers_in_threads_lose_nothing(tmp_path):
    path = tmp_path / "chats.sqlite"
    chat = ChatStore(path).create_chat("shared")
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        store = ChatStore(path)  # each thread its own store object, as two windows would have
        try:
            for i in range(15):
                store.add_exchange(chat, exchange(f"t{n}-{i}"))
                store.create_chat(f"t{n}-{i}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store = ChatStore(path)
    questions = [x.question for x in store.load_chat(chat)]
    assert len(questions) == 90 and len(set(questions)) == 90
    for n in range(6):  # each writer's exchanges kept its own order
        mine = [q for q in questions if q.startswith(f"t{n}-")]
        assert mine == [f"t{n}-{i}" for i in range(15)]
    assert len(store.list_chats()) == 91


def _process_writer(path: str, chat: int, n: int) -> None:
    store = ChatStore(path)
    for i in range(10):
        store.add_exchange(chat, exchange(f"p{n}-{i}"))


def test_concurrent_writers_in_processes_lose_nothing(tmp_path):
    path = tmp_path / "chats.sqlite"
    chat = ChatStore(path).create_chat("shared")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_process_writer, args=(str(path), chat, n)) for n in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    loaded = ChatStore(path).load_chat(chat)
    assert sorted(x.question for x in loaded) == sorted(f"p{n}-{i}" for n in range(3) for i in range(10))


def test_a_file_that_is_not_a_chat_history_is_a_clear_error(tmp_path):
    bad = tmp_path / "chats.sqlite"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(InputError) as e:
        ChatStore(bad)
    assert str(bad) in str(e.value) and "not a readable chat history" in str(e.value)


def test_a_folder_given_as_the_history_is_named_as_one(tmp_path):
    with pytest.raises(InputError, match="is a folder; give --history a file"):
        ChatStore(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_newer_format_is_refused(tmp_path):
    path = tmp_path / "chats.sqlite"
    ChatStore(path)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(InputError, match="format 99 is newer"):
        ChatStore(path)


def _foreign_db(path: Path, user_version: int = 0) -> Path:
    """Another application's SQLite file: its own table, rollback journal, its own user_version."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        db.execute("INSERT INTO notes (text) VALUES ('keep me')")
        db.execute(f"PRAGMA user_version = {user_version}")
        db.commit()
    return path


@pytest.mark.parametrize("user_version", [0, 1, 3])
def test_another_applications_sqlite_file_is_refused_untouched(tmp_path, user_version):
    """No table added, no WAL switch, no user_version written: the file is opened read-only first."""
    path = _foreign_db(tmp_path / "other-app.db", user_version)
    before = path.read_bytes()
    with pytest.raises(InputError) as e:
        ChatStore(path)
    assert str(path) in str(e.value) and "not a dgpo-edge chat history" in str(e.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-app.db"]   # no -wal, no -shm
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert db.execute("PRAGMA user_version").fetchone()[0] == user_version


def test_a_file_with_this_apps_tables_but_another_schema_is_refused(tmp_path):
    path = tmp_path / "chats.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript("CREATE TABLE chats (id INTEGER PRIMARY KEY, name TEXT);"
                         "CREATE TABLE exchanges (id INTEGER PRIMARY KEY); PRAGMA user_version = 1;")
    before = path.read_bytes()
    with pytest.raises(InputError, match="not a dgpo-edge chat history"):
        ChatStore(path)
    assert path.read_bytes() == before


def test_an_empty_file_becomes_a_chat_history(tmp_path):
    path = tmp_path / "new.sqlite"
    path.touch()
    store = ChatStore(path)
    store.add_exchange(store.create_chat("q"), exchange("q"))
    assert [c.title for c in ChatStore(path).list_chats()] == ["q"]


def test_a_corrupt_exchange_names_the_chat(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("q")
    store.add_exchange(chat, exchange("q"))
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE exchanges SET body = '{not json'")
    with pytest.raises(InputError, match=f"chat {chat}, exchange 0 is corrupt"):
        store.load_chat(chat)


def test_an_unwritable_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match="cannot create the chat history folder"):
        ChatStore(Path(blocker) / "sub" / "chats.sqlite")
