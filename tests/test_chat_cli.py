"""`dgpo-edge chat`: options, bad input before the app starts, lazy imports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli_helpers import assert_one_line_error, invoke


def test_help_lists_the_options():
    result = invoke("chat", "--help")
    assert result.exit_code == 0, result.output
    for word in ("--bundle", "--model", "--index", "--top-k", "--max-searches", "--threads", "--history"):
        assert word in result.plain


def test_bundle_with_model_loads_like_ask(tmp_path):
    # --model replaces the bundle's model, as in ask and eval; the bundle itself is still checked.
    (tmp_path / "b").mkdir()
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    result = invoke("chat", "--bundle", tmp_path / "b", "--model", tmp_path / "m.gguf")
    assert_one_line_error(result, str(tmp_path / "b"), "not a bundle: no manifest.json")


@pytest.mark.parametrize("option, what", [("--bundle", "no such bundle folder"),
                                          ("--model", "no such model file or folder"),
                                          ("--index", "no such index folder")])
def test_a_missing_path_is_named(tmp_path, option, what):
    missing = tmp_path / "nowhere"
    assert_one_line_error(invoke("chat", option, missing), str(missing), what)


def test_an_index_must_be_a_directory(tmp_path):
    f = tmp_path / "index.txt"
    f.write_text("x")
    assert_one_line_error(invoke("chat", "--index", f), str(f), "not a directory")


def test_a_broken_history_file_is_named_before_any_model_loads(tmp_path):
    pytest.importorskip("textual")
    bad = tmp_path / "chats.sqlite"
    bad.write_bytes(b"not a database" * 50)
    assert_one_line_error(invoke("chat", "--history", bad), str(bad), "not a readable chat history")


def test_another_applications_database_is_refused_unchanged(tmp_path):
    import sqlite3

    pytest.importorskip("textual")
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    before = other.read_bytes()
    assert_one_line_error(invoke("chat", "--history", other), str(other), "not a dgpo-edge chat history")
    assert other.read_bytes() == before


def test_without_a_terminal_chat_says_so_and_exits_2(tmp_path, monkeypatch):
    pytest.importorskip("textual")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    line = assert_one_line_error(invoke("chat"), "chat needs a terminal", "dgpo-edge ask")
    assert "stdin and stdout are not one" in line


def test_without_a_terminal_a_real_process_exits_instead_of_hanging(tmp_path):
    pytest.importorskip("textual")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "dgpo_edge", "chat"], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: chat needs a terminal") and "Traceback" not in done.stderr
    assert not (tmp_path / "cache").exists()   # refused before the default bundle is built


def test_a_refused_chat_leaves_no_new_history_behind(tmp_path):
    """`chat --history new/dir/chats.sqlite` without a terminal made the folders and an empty
    history before it refused; nothing is written until the app starts."""
    pytest.importorskip("textual")
    new = tmp_path / "new" / "dir" / "chats.sqlite"
    assert_one_line_error(invoke("chat", "--history", new), "chat needs a terminal")
    assert not (tmp_path / "new").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(invoke("chat", "--history", blocker / "sub" / "chats.sqlite"),
                          str(blocker), "so the chat history folder", str(blocker / "sub"), "cannot be made in it")
    assert blocker.read_text() == "x"


def test_out_of_range_settings_are_refused():
    assert_one_line_error(invoke("chat", "--top-k", "0"), "--top-k must be in 1..20, got 0")
    assert_one_line_error(invoke("chat", "--max-searches", "17"), "--max-searches must be in 0..16, got 17")


def test_the_cli_does_not_import_textual_until_chat_runs():
    code = ("import sys, dgpo_edge.cli.main; "
            "bad = sorted(m for m in ('textual', 'llama_cpp', 'torch') if m in sys.modules); "
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
