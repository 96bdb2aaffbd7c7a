"""Streaming corpus readers: every source becomes an iterator of `Passage`.

Three inputs are understood (docs/retrieval.md, "Corpus input"):

- a Search-R1/FlashRAG jsonl file, one `{"id", "contents": "\\"Title\\"\\ntext"}` per line;
- a folder of documents (.txt, .md, .pdf, .html), cut into ~100-word passages
  titled by file name and nearest heading (or PDF page), see `documents`;
- a FactbookQA directory (corpus.jsonl + stats.json), i.e. its corpus.jsonl.

Readers never hold the corpus in memory (wiki-18 is 21M passages, 14 GB): jsonl
is read line by line and folders file by file. Order is deterministic, because
the i-th passage yielded becomes row i of the store and of any FAISS index.
Bad input raises `InputError` naming the file and line.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import InputError
from ..jsonio import our_manifest, read_jsonl
from ..protocol import Passage
from ..termtext import not_utf8
from .documents import (READABLE_SUFFIXES, DocRecord, DocReport, Section, Skip, html_sections, pdf_sections,
                        record_for, unsupported_reason)

TEXT_SUFFIXES = (".txt", ".md")
FACTBOOK_FILES = ("corpus.jsonl", "stats.json")
DEFAULT_WORDS = 100


# --- format detection --------------------------------------------------------------

def detect_format(path: str | Path) -> str:
    """'jsonl', 'factbook' or 'text' (a .txt/.md file or a folder of them).

    Decided from the path alone, so a wrong guess fails fast with a message
    instead of after reading gigabytes.
    """
    path = Path(path)
    if path.is_dir():
        if all((path / name).is_file() for name in FACTBOOK_FILES):
            return "factbook"
        return "text"
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            return "jsonl"
        if suffix in READABLE_SUFFIXES:
            return "text"
        raise InputError("unknown corpus format: expected a .jsonl file, a document (.txt/.md/.pdf/.html), "
                         "a folder of them, or a FactbookQA folder (corpus.jsonl + stats.json)", path)
    raise InputError("no such file or folder", path)


def iter_corpus(path: str | Path, words: int = DEFAULT_WORDS,
                report: DocReport | None = None) -> Iterator[Passage]:
    """Passages of any supported corpus, in a deterministic order.

    `words` is the target passage length for documents (jsonl passages are
    taken as they are: their ids and rows must match published indexes).
    `report` collects, for a folder of documents, what each file gave.
    """
    fmt = detect_format(path)
    if fmt == "jsonl":
        return iter_jsonl_corpus(path)
    if fmt == "factbook":
        return iter_factbook(path)
    return iter_text_corpus(path, words=words, report=report)


def count_lines(path: str | Path, block: int = 1 << 20) -> int:
    """Number of lines in a file (blank ones included), read in binary blocks.

    A cheap progress total for jsonl corpora: counting newlines in 1 MiB blocks
    takes seconds on wiki-18, where parsing every line would take minutes.
    """
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(block):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def size_hint(path: str | Path) -> int | None:
    """Expected number of passages, for a progress bar; None when unknown.

    Folders of notes are only known after chunking them, so they get None.
    """
    fmt = detect_format(path)
    if fmt == "jsonl":
        return count_lines(path)
    if fmt == "factbook":
        return count_lines(Path(path) / "corpus.jsonl")
    return None


# --- Search-R1 / FlashRAG jsonl -------------------------------------------------------

def iter_jsonl_corpus(path: str | Path) -> Iterator[Passage]:
    """Passages of a `{"id", "contents"}` jsonl file, validated line by line.

    Rejects (naming file and line) a missing or non-string `contents`, a missing
    or non-scalar `id`, a duplicate id, and text that cannot be stored as UTF-8;
    an empty file raises too, since an empty index is never what was meant.
    """
    path = Path(path)
    seen = SeenIds()
    n = 0
    for lineno, row in read_jsonl(path):
        pid = _row_id(row, path, lineno)
        contents = row.get("contents")
        if contents is None:
            raise InputError('missing "contents"', path, lineno)
        if not isinstance(contents, str):
            raise InputError(f'"contents" must be a string, got {type(contents).__name__}', path, lineno)
        _check_encodable(contents, path, lineno)
        if not seen.add(pid):
            raise InputError(f"duplicate id {pid!r}", path, lineno)
        n += 1
        yield Passage(pid, contents)
    if n == 0:
        raise InputError("empty corpus: no passages", path)


def iter_factbook(folder: str | Path) -> Iterator[Passage]:
    """The passages of a FactbookQA directory (its corpus.jsonl)."""
    return iter_jsonl_corpus(Path(folder) / "corpus.jsonl")


def _row_id(row: dict, path: Path, lineno: int) -> str:
    """The row's id as a string; FlashRAG corpora sometimes store integers."""
    pid = row.get("id")
    if pid is None:
        raise InputError('missing "id"', path, lineno)
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise InputError(f'"id" must be a string or an integer, got {type(pid).__name__}', path, lineno)
    pid = str(pid)
    _check_encodable(pid, path, lineno)
    return pid


def _check_encodable(text: str, path: Path, lineno: int) -> None:
    """JSON can carry lone surrogates ("\\ud800") that SQLite and zstd cannot store."""
    if bad := not_utf8(text):
        raise InputError(f"text is not valid Unicode ({bad})", path, lineno)


class SeenIds:
    """A set of passage ids that stays small for wiki-18's 21M numeric ids.

    Canonical decimal ids ("0", "17", not "017") go into a growable bitmap (21M
    ids: 2.6 MB) instead of a Python set (about 1.5 GB); other ids use a set.
    """

    MAX_BITMAP_ID = 1 << 28  # caps the bitmap at 32 MiB whatever the ids say

    def __init__(self) -> None:
        self._bits = bytearray()
        self._other: set[str] = set()

    def add(self, pid: str) -> bool:
        """Record `pid`; False when it was already there."""
        if pid.isascii() and pid.isdigit() and (pid == "0" or pid[0] != "0"):
            i = int(pid)
            if i < self.MAX_BITMAP_ID:
                return self._add_bit(i)
        if pid in self._other:
            return False
        self._other.add(pid)
        return True

    def _add_bit(self, i: int) -> bool:
        byte, bit = divmod(i, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if self._bits[byte] >> bit & 1:
            return False
        self._bits[byte] |= 1 << bit
        return True


# --- folders of documents -----------------------------------------------------------

def iter_text_corpus(path: str | Path, words: int = DEFAULT_WORDS,
                     report: DocReport | None = None) -> Iterator[Passage]:
    """~`words`-word passages of every document under `path` (or of one file).

    Files are visited in sorted relative-path order and hidden files and folders
    (.git, .obsidian, …) are skipped, so the same folder always gives the same
    rows. Ids are `relative/path.md#k` with k counting from 0 within the file.
    `report` gets a `DocRecord` per file: read, or skipped with the reason.
    """
    root = Path(path)
    if not root.exists():
        raise InputError("no such file or folder", root)
    report = report if report is not None else DocReport()
    skipped: list[tuple[str, Path]] = []
    files = [(root.name, root)] if root.is_file() else _text_files(root, skipped)
    n = 0
    for rel, file in sorted(files + skipped):  # the report lists both, in path order
        record, passages = read_document(rel, file, words)
        report.records.append(record)
        n += len(passages)
        yield from passages
    if n == 0:
        why = "; ".join(f"{r.path}: {r.reason}" for r in report.skipped[:3])
        raise InputError("empty corpus: no text in any .txt, .md, .pdf or .html file" + (f" ({why})" if why else ""),
                         root)


def read_document(rel: str, file: Path, words: int = DEFAULT_WORDS) -> tuple[DocRecord, list[Passage]]:
    """One file's record and passages (ids `rel#k`); a file we cannot read gets a reason and none."""
    if rel.endswith("/"):   # a folder `_text_files` could not list
        return _skipped_record(rel, file, f"could not be listed ({_list_error(file)})"), []
    if not file.name.lower().endswith(READABLE_SUFFIXES):
        record = record_for(rel, file, None)
        record.reason = unsupported_reason(file.name)
        return record, []
    try:
        data = read_regular_file(file)
        record = record_for(rel, file, data)
    except Skip as s:
        return _skipped_record(rel, file, s.reason), []
    try:
        chunks = list(chunk_sections(document_sections(file, data), file_title(file.name), words))
    except Skip as s:
        record.reason = s.reason
        return record, []
    if not chunks:
        record.reason = "no text"
    record.passages = len(chunks)
    return record, [Passage(f"{rel}#{k}", f'"{title}"\n{text}') for k, (title, text) in enumerate(chunks)]


# How a note that could not be read is skipped: `index update` tries it again each time, since the
# fix (a chmod) changes neither its size nor its mtime.
UNREADABLE = "could not be read"


def read_regular_file(file: Path) -> bytes:
    """The bytes of a note, or Skip: a named pipe would block the build forever and a socket cannot be
    opened, and a file that cannot be read (permissions, removed since the folder was listed) is one
    note left out with its reason, not a traceback that stops the whole folder's build."""
    try:
        if not stat.S_ISREG(file.stat().st_mode):
            raise Skip("not a regular file (a pipe, socket or device)")
        return file.read_bytes()
    except OSError as e:
        raise Skip(f"{UNREADABLE} ({e.strerror or type(e).__name__})") from None


def _list_error(folder: Path) -> str:
    """Why `folder` cannot be listed (asked again: os.walk's error is gone by the time it is read)."""
    try:
        with os.scandir(folder) as entries:
            next(entries, None)
    except OSError as e:
        return e.strerror or type(e).__name__
    return "an error while the folder was walked"


def _skipped_record(rel: str, file: Path, reason: str) -> DocRecord:
    """The record of a file that could not be read: its size and mtime when it still has them, so
    `index update` takes it as unchanged until it changes."""
    try:
        record = record_for(rel, file, None)
    except OSError:   # removed since the folder was listed
        record = DocRecord(rel, 0, 0, "")
    record.reason = reason
    return record


def document_sections(file: Path, data: bytes) -> list[Section]:
    """(heading, paragraphs) of a document, by type; Skip when it has no readable text."""
    suffix = file.suffix.lower()
    if suffix == ".pdf":
        return pdf_sections(data)
    if suffix in (".html", ".htm"):
        return html_sections(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:   # one note in another encoding does not stop a folder's build
        line = data.count(b"\n", 0, e.start) + 1
        raise Skip(f"not UTF-8 (line {line}, byte {e.start}: {e.reason}); save it as UTF-8") from None
    if (nul := data.find(b"\0")) >= 0:   # valid UTF-8, yet no text file holds NUL: zeroed or binary data
        line = data.count(b"\n", 0, nul) + 1
        raise Skip(f"binary, not text (a NUL byte on line {line}, byte {nul}); if it is UTF-16 text, "
                   "save it as UTF-8")
    return list(_sections(text.removeprefix("\ufeff"), suffix == ".md"))


def _text_files(root: Path, skipped: list[tuple[str, Path]] | None = None) -> list[tuple[str, Path]]:
    """(relative posix path, path) of the readable documents under `root`, sorted.

    os.walk without following symlinks: a link back up the tree cannot loop.
    Other (non-hidden) files go to `skipped`, for the build's summary, and so does a
    subfolder that cannot be listed, as `rel/` (which no file's path is).
    """
    found = []

    def unlisted(e: OSError) -> None:
        # os.walk would pass over it without a word: its notes would be missing from a build
        # unsaid, and deleted from the index by an update
        folder = Path(e.filename) if e.filename is not None else root
        if folder == root:
            raise InputError(f"cannot list this folder ({e.strerror or type(e).__name__})", root)
        if skipped is not None:
            skipped.append((folder.relative_to(root).as_posix() + "/", folder))

    for folder, dirs, names in os.walk(root, onerror=unlisted):
        dirs[:] = _note_dirs(folder, dirs)
        for name in names:
            if not name.startswith("."):
                file = Path(folder) / name
                if leads_out(file, root):  # a link out of the tree is never read
                    continue
                # only regular files are read (and hashed): a pipe named notes.md goes to `skipped`
                readable = name.lower().endswith(READABLE_SUFFIXES) and file.is_file()
                if readable or skipped is not None:
                    (found if readable else skipped).append((file.relative_to(root).as_posix(), file))
    return sorted(found)


def _note_dirs(folder: str, dirs: list[str]) -> list[str]:
    """The subfolders to walk: not hidden (.git, .obsidian), and not an index or a bundle dgpo-edge
    wrote (kept inside the notes, `index build ~/notes --out ~/notes/idx`), whose files are not notes
    and change with every update. A world written as notes (`data build notes --as-folder`) is read."""
    return [d for d in dirs if not d.startswith(".") and not _index_or_bundle(Path(folder) / d)]


def _index_or_bundle(folder: Path) -> bool:
    """An index's manifest has "store"; of dgpo-edge's manifests only a bundle's has "format". Not
    bundle.core.is_bundle: retrieval may import core alone (docs/architecture.md; bundle imports
    retrieval), and test_architecture counts an import inside a function too."""
    manifest = our_manifest(folder)
    return manifest is not None and ("store" in manifest or "format" in manifest)


def leads_out(file: Path, root: Path) -> bool:
    """Whether `file` is a link whose target is not a file inside `root`.

    A notes folder must not pull in whatever a link points at (/etc/passwd,
    ~/.ssh/id_rsa): links are followed only within the tree.
    """
    return file.is_symlink() and not (file.is_file() and file.resolve().is_relative_to(root.resolve()))


def links_not_followed(root: Path) -> list[str]:
    """Relative paths of the folder links and the .txt/.md links out of `root` the walker skips."""
    out = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = _note_dirs(folder, dirs)
        for name in [*dirs, *(n for n in names if n.lower().endswith(TEXT_SUFFIXES))]:
            p = Path(folder) / name
            if not name.startswith(".") and p.is_symlink() and (name in dirs or leads_out(p, root)):
                out.append(p.relative_to(root).as_posix())
    return sorted(out)


def chunk_document(text: str, filename: str, words: int = DEFAULT_WORDS) -> Iterator[tuple[str, str]]:
    """(title, text) passages of one document.

    Markdown headings (in .md files) end a passage and name the ones after
    them: `Notes — Heading`. Within a section, paragraphs are packed into
    passages of at most `words` words; a longer paragraph is cut at sentence
    ends, and a sentence longer than `words` at word boundaries.
    """
    markdown = filename.lower().endswith(".md")
    return chunk_sections(_sections(text, markdown), file_title(filename), words)


def chunk_sections(sections: Iterable[Section], base: str,
                   words: int = DEFAULT_WORDS) -> Iterator[tuple[str, str]]:
    """(title, text) passages of (heading, paragraphs) sections; titles `base — heading`."""
    for heading, paragraphs in sections:
        title = f"{base} — {heading}" if heading else base
        for chunk in _pack(_units(paragraphs, words), words):
            yield title, chunk


def file_title(filename: str) -> str:
    """`my_notes-2024.md` → `my notes 2024`: the stem with _ and - read as spaces."""
    stem = Path(filename).stem
    return re.sub(r"[_\-\s]+", " ", stem).strip() or stem


_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def _sections(text: str, markdown: bool) -> Iterator[tuple[str, list[str]]]:
    """(heading, paragraphs) per section; the heading is '' before the first one.

    ATX headings outside fenced code blocks start a section (a `# comment` in a
    code block is code, not a heading); blank lines separate paragraphs.
    """
    heading, paragraphs, lines = "", [], []
    in_fence = False
    for line in text.splitlines():
        if markdown and _FENCE.match(line):
            in_fence = not in_fence
        m = _HEADING.match(line) if markdown and not in_fence else None
        if m is not None or not line.strip():
            if lines:
                paragraphs.append(" ".join(lines))
                lines = []
            if m is not None:
                if paragraphs:
                    yield heading, paragraphs
                heading, paragraphs = (m.group(2) or "").strip(), []
            continue
        lines.append(line)
    if lines:
        paragraphs.append(" ".join(lines))
    if paragraphs:
        yield heading, paragraphs


_SENTENCE_END = re.compile(r"([.!?][\"'”’)\]]*)\s+")


def _units(paragraphs: list[str], words: int) -> Iterator[list[str]]:
    """Packable pieces as word lists: whole paragraphs that fit, else sentences,
    else `words`-word slices of a run-on sentence."""
    for para in paragraphs:
        tokens = para.split()
        if len(tokens) <= words:
            if tokens:
                yield tokens
            continue
        for sentence in _SENTENCE_END.sub("\\1\n", " ".join(tokens)).split("\n"):
            toks = sentence.split()
            for i in range(0, len(toks), words):
                yield toks[i:i + words]


def _pack(units: Iterator[list[str]], words: int) -> Iterator[str]:
    """Greedily join consecutive units while the passage stays within `words`."""
    chunk: list[str] = []
    for unit in units:
        if chunk and len(chunk) + len(unit) > words:
            yield " ".join(chunk)
            chunk = []
        chunk.extend(unit)
    if chunk:
        yield " ".join(chunk)
