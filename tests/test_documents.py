"""Real documents in a notes folder: PDF text layers, HTML main text, and a summary of what was skipped."""

from __future__ import annotations

import json
import sys

import pytest
from cli_helpers import assert_one_line_error, invoke
from doc_helpers import PAGE, make_pdf

from dgpo_edge.retrieval.corpus import iter_text_corpus
from dgpo_edge.retrieval.documents import DocReport

pytest.importorskip("pypdf")
pytest.importorskip("bs4")


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "report.pdf").write_bytes(make_pdf([["Quarterly report.", "Revenue grew (a lot) in March."], [],
                                             ["The volcano survey starts in June."]]))
    (d / "scan.pdf").write_bytes(make_pdf([[]]))
    (d / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    (d / "wiki.html").write_text(PAGE, encoding="utf-8")
    (d / "slides.pptx").write_bytes(b"PK\x03\x04")
    (d / "todo.md").write_text("# Today\n\nWater the plants.\n", encoding="utf-8")
    return d


def test_pdf_pages_are_passages_titled_by_page(folder):
    passages = {p.id: p for p in iter_text_corpus(folder)}
    first = passages["report.pdf#0"]
    assert first.contents == '"report — p. 1"\nQuarterly report. Revenue grew (a lot) in March.'
    assert passages["report.pdf#1"].title == "report — p. 3"  # page 2 has no text: no passage
    assert "volcano survey" in passages["report.pdf#1"].text
    assert "report.pdf#2" not in passages


def test_html_keeps_the_main_text_by_heading_and_drops_boilerplate(folder):
    html = [p for p in iter_text_corpus(folder) if p.id.startswith("wiki.html")]
    assert [p.title for p in html] == ["wiki — Offsite planning", "wiki — Budget"]
    assert html[0].text == ("The offsite is in Lisbon from the 3rd to the 5th of May. Book flights by Friday. "
                            "Hotel near the river.")
    everything = " ".join(p.contents for p in html)
    for boilerplate in ("tracking", "navigation", "banner", "Copyright", "comment", "color"):
        assert boilerplate not in everything


def test_the_report_says_what_was_read_and_why_files_were_skipped(folder):
    report = DocReport()
    list(iter_text_corpus(folder, report=report))
    s = report.summary()
    assert s["read"] == 3 and s["read_by_type"] == {".html": 1, ".md": 1, ".pdf": 1} and s["passages"] == 5
    reasons = {x["path"]: x["reason"] for x in s["skipped"]}
    assert set(reasons) == {"scan.pdf", "broken.pdf", "slides.pptx"}
    assert reasons["scan.pdf"].startswith("no text layer")
    assert reasons["broken.pdf"].startswith("unreadable PDF")
    assert reasons["slides.pptx"] == "unsupported type .pptx"
    by_path = {r.path: r for r in report.records}
    assert by_path["report.pdf"].passages == 2 and len(by_path["report.pdf"].sha256) == 64
    assert by_path["report.pdf"].size == (folder / "report.pdf").stat().st_size


def test_a_missing_parser_skips_with_the_install_line(folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "pypdf", None)
    report = DocReport()
    list(iter_text_corpus(folder, report=report))
    reasons = {x["path"]: x["reason"] for x in report.summary()["skipped"]}
    assert "pip install 'dgpo-edge[edge]'" in reasons["report.pdf"] and "pypdf" in reasons["report.pdf"]


def test_index_build_prints_the_summary_and_records_it(folder, tmp_path):
    out = tmp_path / "idx"
    r = invoke("index", "build", folder, "--out", out, "--kind", "bm25")
    assert r.exit_code == 0, r.output
    assert "read 3 file(s) (1 .html, 1 .md, 1 .pdf) into 5 passages; skipped 3" in r.plain
    assert "skipped slides.pptx: unsupported type .pptx" in r.plain
    assert "skipped scan.pdf: no text layer" in r.plain
    m = json.loads((out / "manifest.json").read_text())
    assert m["source"]["documents"]["read"] == 3 and m["source"]["files"] == 5  # .pdf/.html/.md, skipped too
    info = invoke("index", "info", out)
    assert info.exit_code == 0 and "skipped broken.pdf: unreadable PDF" in info.plain
    hits = invoke("index", "search", out, "volcano survey", "--json")
    assert json.loads(hits.output)["result"][0][0]["document"]["id"] == "report.pdf#1"


def test_a_folder_of_only_unreadable_files_is_one_error_line(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "scan.pdf").write_bytes(make_pdf([[]]))
    r = invoke("index", "build", d, "--out", tmp_path / "idx", "--kind", "bm25")
    assert r.exit_code == 2 and "no text in any .txt, .md, .pdf or .html file" in r.output
    assert not (tmp_path / "idx").exists()


def test_encrypted_pdfs_are_read_with_an_empty_password_else_skipped():
    import io

    from pypdf import PdfReader, PdfWriter

    from dgpo_edge.retrieval.documents import Skip, pdf_sections

    def encrypted(user_password: str) -> bytes:
        w = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf([["Owner-locked but readable."]]))))
        w.encrypt(user_password=user_password, owner_password="owner", algorithm="RC4-128")
        out = io.BytesIO()
        w.write(out)
        return out.getvalue()

    assert pdf_sections(encrypted("")) == [("p. 1", ["Owner-locked but readable."])]
    with pytest.raises(Skip, match="encrypted PDF"):
        pdf_sections(encrypted("secret"))


def test_html_the_parser_cannot_walk_is_skipped_not_a_crash():
    from dgpo_edge.retrieval.documents import Skip, html_sections

    deep = b"<html><body>" + b"<div>" * 5000 + b"deep text" + b"</div>" * 5000 + b"</body></html>"
    with pytest.raises(Skip, match="nested too deeply"):
        html_sections(deep)
    utf16 = "<p>caf\u00e9 notes</p>".encode("utf-16")  # the parser finds the encoding from the BOM
    assert html_sections(utf16) == [("", ["caf\u00e9 notes"])]


def _notes_with_a_pipe_and_a_socket(tmp_path):
    """A folder whose .md names include a named pipe and a socket: opening the pipe blocks forever."""
    import os
    import socket

    d = tmp_path / "notes"
    d.mkdir()
    (d / "alice.md").write_text("The meeting with Alice is on Tuesday.\n", encoding="utf-8")
    os.mkfifo(d / "pipe.md")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock.md"))
    sock.close()
    return d


def _unblock_readers(pipe, seconds: float = 20.0) -> None:
    """Open `pipe` for writing whenever a reader waits on it, for `seconds`, so that a build that
    opens it (the old code did) gets end-of-file instead of hanging the test run."""
    import os
    import threading
    import time

    def writer():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))   # ENXIO while no reader waits
            except OSError:
                pass
            time.sleep(0.05)

    threading.Thread(target=writer, daemon=True).start()


def test_pipes_and_sockets_named_like_notes_are_skipped_not_opened(tmp_path):
    notes = _notes_with_a_pipe_and_a_socket(tmp_path)
    _unblock_readers(notes / "pipe.md")
    out = tmp_path / "idx"
    r = invoke("index", "build", notes, "--out", out, "--kind", "bm25")   # hung on the pipe before
    assert r.exit_code == 0, r.output
    assert "read 1 file(s) (1 .md) into 1 passages; skipped 2" in r.plain
    assert "skipped pipe.md: not a regular file" in r.plain and "skipped sock.md: not a regular file" in r.plain
    up = invoke("index", "update", notes, "--out", out)   # and they stay skipped, not "changed" each time
    assert up.exit_code == 0 and "up to date: 3 file(s) unchanged" in up.plain, up.output


def test_a_note_that_cannot_be_read_is_skipped_with_the_reason(tmp_path, monkeypatch):
    """Permissions (root reads anything, so simulated) or a file removed after the folder was listed:
    that note is skipped and named, the rest of the folder is indexed (a traceback before)."""
    from pathlib import Path

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "alice.md").write_text("The meeting with Alice is on Tuesday.\n", encoding="utf-8")
    (notes / "locked.md").write_text("private\n", encoding="utf-8")
    (notes / "gone.md").write_text("saved by an editor, then renamed away\n", encoding="utf-8")
    real_open, real_read = open, Path.read_bytes

    def refusing_open(file, *a, **k):
        if str(file).endswith("locked.md"):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)

    def read_bytes(self):
        if self.name == "gone.md":   # listed and hashed, then removed before it is read
            self.unlink()
        return real_read(self)

    monkeypatch.setattr("builtins.open", refusing_open)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: refusing_open(self, *a, **k))
    out = tmp_path / "idx"
    r = invoke("index", "build", notes, "--out", out, "--kind", "bm25")
    assert r.exit_code == 0, r.output
    assert "skipped locked.md: could not be read (Permission denied)" in r.plain
    assert "skipped gone.md: could not be read (No such file or directory)" in r.plain
    assert "read 1 file(s) (1 .md) into 1 passages; skipped 2" in r.plain


def test_a_note_of_nul_bytes_is_skipped_as_binary_not_indexed(tmp_path):
    """NUL bytes are valid UTF-8, so a zero-filled file (left by a crash) or UTF-16 text without a BOM
    passed the UTF-8 check and became passages of NULs that searches returned."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "alice.md").write_text("The meeting with Alice is on Tuesday.\n", encoding="utf-8")
    (notes / "zeros.md").write_bytes(b"\0" * 4096)
    (notes / "windows.txt").write_bytes("first line\nnotes about Bob".encode("utf-16-le"))
    report = DocReport()
    passages = list(iter_text_corpus(notes, report=report))
    assert [p.id for p in passages] == ["alice.md#0"]
    reasons = {x["path"]: x["reason"] for x in report.summary()["skipped"]}
    assert reasons["zeros.md"].startswith("binary, not text (a NUL byte on line 1, byte 0)")
    assert reasons["windows.txt"].startswith("binary, not text (a NUL byte on line 1, byte 1)")
    assert "save it as UTF-8" in reasons["windows.txt"]


def test_an_unreadable_corpus_keeps_an_interrupted_builds_work(tmp_path, monkeypatch):
    """A corpus that cannot be read now (permissions, a network folder that is away) is one error
    line; a fresh build leaves no folders, but an interrupted build's work (hours of embeddings, say)
    is kept for when it can be read again."""
    import builtins

    from dgpo_edge.retrieval.build import WORK_DIR, WORK_MARKER

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"A\\"\\nalpha"}\n', encoding="utf-8")
    real_open = builtins.open

    def refusing(file, *a, **k):
        if str(file) == str(corpus):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", refusing)
    fresh = tmp_path / "fresh"
    assert_one_line_error(invoke("index", "build", corpus, "--out", fresh, "--kind", "bm25"), "cannot read it")
    assert not fresh.exists()
    resumable = tmp_path / "idx" / WORK_DIR
    resumable.mkdir(parents=True)
    (resumable / WORK_MARKER).write_text("made by dgpo-edge\n")
    (resumable / "embeddings-0000.npy").write_bytes(b"work")
    assert_one_line_error(invoke("index", "build", corpus, "--out", tmp_path / "idx", "--kind", "bm25"),
                          "cannot read it")
    assert (resumable / "embeddings-0000.npy").read_bytes() == b"work"
