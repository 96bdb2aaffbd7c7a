"""Questions as people type them: several surface forms, casual casing, typos.

A world gives each relation a list of templates (full questions, imperatives,
keyword forms such as "{x} capital"); `Phraser.ask` picks one with the world's
seeded generator and then, now and then, types it the way people do: no
question mark, all lowercase, or one typo. Entity names are protected: a typo
never lands in them, so the question still names what it is about.
"""

from __future__ import annotations

import random
import re

_WORD = re.compile(r"[A-Za-z]{5,}")

NO_MARK = 0.3     # drop the trailing "?"
LOWER = 0.25      # type it all in lowercase
TYPO = 0.06       # swap two letters in one longer word


class Phraser:
    """Seeded surface forms; one instance per world build, used in a fixed order."""

    def __init__(self, seed: int, world: str):
        self.rng = random.Random(f"phrasing-{world}-{seed}")

    def ask(self, templates: list[str] | tuple[str, ...], protect: tuple[str, ...] = (), **slots: str) -> str:
        text = self.rng.choice(templates).format(**slots)
        return self.casual(text, protect + tuple(slots.values()))

    def casual(self, text: str, protect: tuple[str, ...] = ()) -> str:
        text = text[:1].upper() + text[1:]
        roll = self.rng.random()
        if roll < TYPO:
            text = typo(text, self.rng, protect)
        if self.rng.random() < NO_MARK:
            text = text.rstrip("?").rstrip()
        if self.rng.random() < LOWER:
            text = text.lower()
        return text

    def pick(self, options):
        return self.rng.choice(options)


def typo(text: str, rng: random.Random, protect: tuple[str, ...] = ()) -> str:
    """Swap two neighbouring letters inside one word of 5+ letters outside `protect`."""
    guarded = [(m.start(), m.end()) for p in protect if p for m in re.finditer(re.escape(p), text, re.IGNORECASE)]
    words = [m for m in _WORD.finditer(text)
             if not any(s < m.end() and m.start() < e for s, e in guarded)]
    if not words:
        return text
    m = rng.choice(words)
    i = rng.randrange(m.start() + 1, m.end() - 2)  # keep the first and last letters
    if text[i] == text[i + 1]:
        return text
    return text[:i] + text[i + 1] + text[i] + text[i + 2:]
