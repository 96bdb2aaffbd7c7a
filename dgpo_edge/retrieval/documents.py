"""Text out of the documents a notes folder holds: .txt and .md as written, a PDF's text
layer (pypdf), an HTML page's main text (BeautifulSoup).

Each reader turns one file's bytes into sections, `(heading, paragraphs)`, which
`corpus.chunk_sections` packs into ~100-word passages titled `file — heading`
(markdown and HTML headings) or `file — p. N` (PDF pages). A file that cannot
give text (a scanned PDF, an encrypted one, a page of only scripts, a type we
do not read, a library that is not installed, a .txt or .md file that is not UTF-8 or holds NUL
bytes, a pipe or a file that cannot be opened) is *skipped with a reason* (for the encoding: the
line and byte), which `DocReport` collects so `index build` can say what it left out.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READABLE_SUFFIXES = (".txt", ".md", ".pdf", ".html", ".htm")
INSTALL_HINT = "pip install 'dgpo-edge[edge]'"

Section = tuple[str, list[str]]


class Skip(Exception):
    """This file gives no passages; `reason` says why (shown in the build summary)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class DocRecord:
    """One file of a notes folder as the index saw it: read (passages > 0) or skipped (reason)."""

    path: str            # relative posix path, the passage ids' prefix
    size: int
    mtime_ns: int
    sha256: str
    passages: int = 0
    reason: str | None = None

    def as_row(self) -> tuple[Any, ...]:
        return (self.path, self.size, self.mtime_ns, self.sha256, self.passages, self.reason)


@dataclass
class DocReport:
    """What a folder read gave: a record per file, and files never opened (unsupported types)."""

    records: list[DocRecord] = field(default_factory=list)

    @property
    def read(self) -> list[DocRecord]:
        return [r for r in self.records if r.reason is None]

    @property
    def skipped(self) -> list[DocRecord]:
        return [r for r in self.records if r.reason is not None]

    def summary(self) -> dict[str, Any]:
        """Counts by file type and the skipped files with reasons (for the manifest and the CLI)."""
        by_type: dict[str, int] = {}
        for r in self.read:
            suffix = Path(r.path).suffix.lower() or "(none)"
            by_type[suffix] = by_type.get(suffix, 0) + 1
        return {"read": len(self.read), "read_by_type": dict(sorted(by_type.items())),
                "passages": sum(r.passages for r in self.records),
                "skipped": [{"path": r.path, "reason": r.reason} for r in self.skipped]}


def record_for(rel: str, file: Path, data: bytes | None) -> DocRecord:
    """A record of `file`'s size, mtime and (when its bytes were read) sha256."""
    st = file.stat()
    digest = hashlib.sha256(data).hexdigest() if data is not None else ""
    return DocRecord(rel, st.st_size, st.st_mtime_ns, digest)


def unsupported_reason(name: str) -> str:
    suffix = Path(name).suffix.lower()
    return f"unsupported type {suffix}" if suffix else "unsupported type (no extension)"


# --- PDF ---------------------------------------------------------------------------------------------

def pdf_sections(data: bytes) -> list[Section]:
    """One section per page with text, headed `p. N`; Skip when there is no text layer."""
    try:
        from pypdf import PdfReader
    except ImportError:
        raise Skip(f"reading PDFs needs pypdf ({INSTALL_HINT})") from None
    # pypdf logs a warning for every file it repairs ("EOF marker not found"): they would tear the
    # progress display, and a file it cannot read is reported as skipped anyway.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Skip("encrypted PDF (no password support)")
        pages = [page.extract_text() or "" for page in reader.pages]
    except Skip:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the parser on one file skips that file
        raise Skip(f"unreadable PDF ({type(e).__name__}: {_short(e)})") from None
    sections = [(f"p. {i}", paras) for i, text in enumerate(pages, start=1) if (paras := paragraphs(text))]
    if not sections:
        raise Skip("no text layer in the PDF (a scan? run OCR on it first)")
    return sections


def paragraphs(text: str) -> list[str]:
    """Blank-line separated paragraphs, each one line (PDF lines are hard-wrapped)."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        joined = " ".join(block.split())
        if joined:
            out.append(joined)
    return out


# --- HTML --------------------------------------------------------------------------------------------

_DROP = ("script", "style", "nav", "header", "footer", "aside", "noscript", "template", "form", "svg",
         "iframe", "button", "select")
_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
_BLOCKS = {"p", "div", "li", "ul", "ol", "pre", "blockquote", "table", "tr", "td", "th", "section",
           "article", "main", "br", "dd", "dt", "dl", "figure", "figcaption", "hr", "body", "details",
           "summary", "caption", "address"}


def html_sections(data: bytes) -> list[Section]:
    """The page's main text by heading: `<main>` (else `<article>`, else `<body>`) without
    scripts, styles, navigation, headers, footers and asides."""
    try:
        from bs4 import BeautifulSoup
    except ImportError:
        raise Skip(f"reading HTML needs beautifulsoup4 ({INSTALL_HINT})") from None
    walker = _HtmlText()
    try:
        soup = BeautifulSoup(data, "html.parser")  # detects the encoding from the bytes and <meta charset>
        for tag in soup.find_all(_DROP):
            tag.decompose()
        walker.walk(soup.find("main") or soup.find("article") or soup.body or soup)
    except RecursionError:
        raise Skip("HTML nested too deeply to read") from None
    except Exception as e:  # noqa: BLE001 - any failure of the parser on one file skips that file
        raise Skip(f"unreadable HTML ({type(e).__name__}: {_short(e)})") from None
    sections = [(h, paras) for h, paras in walker.finish() if paras]
    if not sections:
        raise Skip("no text in the HTML page's main content")
    return sections


class _HtmlText:
    """Collects sections from a DOM walk: headings start sections, block tags end paragraphs."""

    def __init__(self) -> None:
        self.sections: list[Section] = [("", [])]
        self.buf: list[str] = []

    def walk(self, node: Any) -> None:
        from bs4.element import NavigableString, PreformattedString, Tag

        for child in node.children:
            if isinstance(child, NavigableString):
                if not isinstance(child, PreformattedString):  # comments, doctypes, CDATA
                    self.buf.append(str(child))
            elif isinstance(child, Tag):
                name = child.name.lower()
                if name in _HEADINGS:
                    self.flush()
                    self.sections.append((" ".join(child.get_text(" ").split()), []))
                elif name in _BLOCKS:
                    self.flush()
                    self.walk(child)
                    self.flush()
                else:
                    self.walk(child)

    def flush(self) -> None:
        text = " ".join("".join(self.buf).split())
        self.buf = []
        if text:
            self.sections[-1][1].append(text)

    def finish(self) -> list[Section]:
        self.flush()
        return self.sections


def _short(e: BaseException, limit: int = 120) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"

