"""jsonio: replace_dir (the one way finished folders are swapped into place) and the JSON-lines reader."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from dgpo_edge import jsonio
from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import cut_torn_last_line, iter_lines, read_jsonl, replace_dir


def _folder(path: Path, text: str) -> Path:
    path.mkdir()
    (path / "f.txt").write_text(text)
    return path


def test_replace_dir_moves_a_new_folder_into_place(tmp_path: Path):
    src = _folder(tmp_path / ".build", "new")
    replace_dir(src, tmp_path / "out")
    assert (tmp_path / "out" / "f.txt").read_text() == "new" and not src.exists()


def test_replace_dir_replaces_an_old_folder_and_leaves_no_trash(tmp_path: Path):
    _folder(tmp_path / "out", "old")
    _folder(tmp_path / ".out.old", "stale leftover of an earlier crash")
    replace_dir(_folder(tmp_path / ".build", "new"), tmp_path / "out")
    assert (tmp_path / "out" / "f.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_refuses_a_folder_it_did_not_write(tmp_path: Path):
    """An --out given by mistake keeps every file; a folder with dgpo-edge's manifest is replaced."""
    mine = _folder(tmp_path / "thesis", "three years of work")
    with pytest.raises(InputError, match="is not a folder dgpo-edge wrote; refusing to replace it"):
        with jsonio.atomic_dir(mine) as tmp:
            (tmp / "corpus.jsonl").write_text("{}")
    assert [p.name for p in mine.iterdir()] == ["f.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis"]        # nothing written beside it either
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="exists and is not a directory"):
        with jsonio.atomic_dir(tmp_path / "file"):
            pass

    ours = tmp_path / "world"
    ours.mkdir()
    (ours / "manifest.json").write_text('{"kind": "notes", "produced_by": "dgpo-edge 0.1.0"}')
    with jsonio.atomic_dir(ours) as tmp:
        (tmp / "corpus.jsonl").write_text("{}")
    assert [p.name for p in ours.iterdir()] == ["corpus.jsonl"]
    with jsonio.atomic_dir(mine, lambda d: (d / "f.txt").is_file(), "a folder with f.txt") as tmp:
        (tmp / "g.txt").write_text("new")                                  # a caller's own test of what it wrote
    assert [p.name for p in mine.iterdir()] == ["g.txt"]


def _bundle(path: Path) -> Path:
    """A folder with a bundle's manifest (all `bundle_holding` reads) and a model file in it."""
    (path / "model").mkdir(parents=True)
    (path / "manifest.json").write_text('{"format": "dgpo-edge-bundle", "produced_by": "dgpo-edge 0.1.0"}')
    (path / "model" / "m.gguf").write_bytes(b"GGUF")
    return path


def test_outputs_inside_a_bundle_are_refused(tmp_path: Path):
    """A folder written inside a bundle (`--out B/model`, `--out B/index`) replaced or added files
    its manifest lists with their sha256, or does not list: the bundle then failed its own check."""
    b = _bundle(tmp_path / "B")
    checks = [jsonio.check_replaceable,
              lambda out: jsonio.check_holds_only(out, {"m.gguf"}, "a model's", "elsewhere")]
    for check in checks:
        for out in (b / "model", b / "index", b / "model" / "new" / "deeper"):
            with pytest.raises(InputError, match=r"is inside the bundle .*B, whose manifest lists every file"):
                check(out)
        check(tmp_path / "elsewhere")                # beside the bundle: fine
    jsonio.check_replaceable(b, lambda d: True)      # the bundle itself: `export bundle --overwrite` replaces it
    (tmp_path / "link").symlink_to(b / "model")
    assert jsonio.bundle_holding(tmp_path / "link" / "m.gguf") == b.resolve()   # through a link too
    assert jsonio.bundle_holding(b) is None and jsonio.bundle_holding(tmp_path / "elsewhere") is None
    assert (b / "model" / "m.gguf").read_bytes() == b"GGUF" and not (b / "index").exists()


# --- reading JSON lines: bounded lines, a byte-order mark --------------------------------------------

def test_read_jsonl_accepts_a_utf8_byte_order_mark(tmp_path: Path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n{"a": 2}\n')
    assert list(read_jsonl(path)) == [(1, {"a": 1}), (2, {"a": 2})]


def test_a_byte_order_mark_is_only_skipped_at_the_start(tmp_path: Path):
    path = tmp_path / "bom2.jsonl"
    path.write_bytes(b'{"a": 1}\n\xef\xbb\xbf{"a": 2}\n')
    with pytest.raises(InputError, match="line 2: malformed JSON"):
        list(read_jsonl(path))


def test_an_over_long_line_is_refused_naming_file_and_line(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(jsonio, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "long.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "' + b"x" * 1000 + b'"}\n')
    with pytest.raises(InputError) as info:
        list(read_jsonl(path))
    assert f"{path}, line 2: " in str(info.value) and "1,000 bytes" in str(info.value)
    path.write_bytes(b'{"a": "' + b"x" * 991 + b'"}\n')   # exactly 1,000 bytes before the newline
    assert len(list(read_jsonl(path))) == 1


def test_a_long_line_without_newline_is_read_in_bounded_memory(tmp_path: Path, monkeypatch):
    """The 2 GB single-line file, scaled down: the cap is hit before the line is held in memory."""
    monkeypatch.setattr(jsonio, "MAX_LINE_BYTES", 1 << 20)
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"a": "')
        for _ in range(32):
            f.write(b"x" * (1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="line 1: .*longer than"):
            list(read_jsonl(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak   # 32 MiB on disk, a few MiB at most in memory


def test_iter_lines_says_whether_a_line_is_complete(tmp_path: Path):
    path = tmp_path / "torn.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\n\n{"a"')
    assert list(iter_lines(path)) == [(1, b'{"a": 1}\n'), (2, b"\n"), (3, b'{"a"')]


def test_cut_torn_last_line_cuts_only_a_torn_record(tmp_path: Path, monkeypatch):
    path = tmp_path / "progress.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2}\n{"id": 3, "q')
    assert cut_torn_last_line(path) == len(b'{"id": 3, "q')
    assert path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    assert cut_torn_last_line(path) == 0 and path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    # a file that is one huge line is not a torn record: refused, not truncated to nothing
    monkeypatch.setattr(jsonio, "MAX_LINE_BYTES", 1000)
    other = tmp_path / "not-ours.jsonl"
    other.write_bytes(b"x" * 5000)
    with pytest.raises(InputError, match="line 1: line longer than 1,000 bytes"):
        cut_torn_last_line(other)
    assert other.stat().st_size == 5000
