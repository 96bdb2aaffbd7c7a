"""Cutting Factbook entries into ~100-word passages in the Search-R1 corpus form.

One passage holds whole fields of one section of one country, so a fact is
never split between passages and every question can name its gold passage.
Titles read `Peru — Government`; `contents` is `"Title"\\ntext`, like wiki-18.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..base import CorpusPassage
from .source import Country, clean_text

TARGET_WORDS = 100   # a passage is flushed once adding a field would pass MAX_WORDS
MAX_WORDS = 130
_SENTENCE_END = re.compile(r"(?<=[.;])\s+")


@dataclass(frozen=True)
class FactbookPassage(CorpusPassage):
    id: str
    country: str      # Factbook code, e.g. "pe"
    section: str      # e.g. "Government"
    title: str        # e.g. "Peru — Government"
    text: str


def render_field(name: str, node: object) -> str:
    """One field as prose: `Capital: name: Lima; geographic coordinates: 12 03 S.`"""
    parts = []
    for label, text in _leaves(node):
        # Write each label once: notes already start with "note:", "arable land: 11.1%"
        # sits under "agricultural land: arable land", and "Languages" (or "Climate")
        # can hold a sub-field "Languages" that the field name already says.
        if label.lower() == name.strip().lower():
            label = ""
        heads = (label.split()[-1], label.rsplit(":", 1)[-1].strip()) if label else (name.split()[-1],)
        repeats = text.lower().startswith(tuple(h.lower() + ":" for h in heads))
        if repeats and not label:  # "Geography - note: note: ..."
            text = text.split(":", 1)[1].strip()
        parts.append(f"{label}: {text}" if label and not repeats else text)
    body = "; ".join(p for p in parts if p)
    return f"{name}: {body}." if body and not body.endswith(".") else f"{name}: {body}"


def _leaves(node: object, label: str = "") -> list[tuple[str, str]]:
    if isinstance(node, str):
        text = clean_text(node)
        return [(label, text)] if text else []
    if not isinstance(node, dict):
        return []
    out = []
    for key, child in node.items():
        key = key.strip()
        sub = label if key == "text" else (f"{label} {key}".strip() if label else key)
        out.extend(_leaves(child, sub))
    return out


def _split_long(rendered: str, name: str) -> list[str]:
    """A field longer than MAX_WORDS becomes several pieces at sentence ends."""
    words = rendered.split()
    if len(words) <= MAX_WORDS:
        return [rendered]
    pieces, current = [], []
    for sentence in _SENTENCE_END.split(rendered):
        n = len(sentence.split())
        if current and sum(len(s.split()) for s in current) + n > TARGET_WORDS:
            pieces.append(" ".join(current))
            current = [f"{name} (continued):"]
        if sum(len(s.split()) for s in current) + n > MAX_WORDS:  # too long for one piece: cut by words
            w = sentence.split()
            for i in range(0, len(w), TARGET_WORDS):
                current.append(" ".join(w[i:i + TARGET_WORDS]))
                pieces.append(" ".join(current))
                current = [f"{name} (continued):"]
            continue
        current.append(sentence)
    if len(current) > 1:
        pieces.append(" ".join(current))
    return pieces


def country_passages(country: Country, start_id: int) -> tuple[list[FactbookPassage], dict]:
    """Passages of one country, numbered from `start_id`.

    Returns the passages and a map (section, field) -> passage id of the first
    passage holding that field, so questions can point at their evidence.
    """
    passages: list[FactbookPassage] = []
    where: dict[tuple[str, str], str] = {}
    for section, fields in country.data.items():
        if not isinstance(fields, dict):
            continue
        title = f"{country.name} — {section}"
        buf: list[str] = []
        pending: list[str] = []  # fields whose first piece is in buf

        def flush() -> None:
            if not buf:
                return
            pid = str(start_id + len(passages))
            passages.append(FactbookPassage(pid, country.code, section, title, " ".join(buf)))
            for f in pending:
                where.setdefault((section, f), pid)
            buf.clear()
            pending.clear()

        for name, node in fields.items():
            rendered = render_field(name, node)
            if not rendered.split(":", 1)[1].strip(" ."):
                continue
            for i, piece in enumerate(_split_long(rendered, name)):
                n_buf = sum(len(b.split()) for b in buf)
                if buf and n_buf + len(piece.split()) > MAX_WORDS:
                    flush()
                buf.append(piece)
                if i == 0:
                    pending.append(name)
        flush()
    return passages, where
