"""What the worlds of personal Markdown notes share: notes, dates, the asker, the build.

A notes world (`notes`, a workplace; `club`, a rowing club) is a `NoteWorld`: it generates its
subjects from the seed, renders each as one short `Note` with [[links]] to other notes, and asks
questions through an `Asker`: 1-hop facts read one note, chains follow links across two or three.
`build_notebook` turns the notes into passages (one each), verifies, splits and writes the
world's files, and with `as_folder` writes the notes as Markdown under DIR/notes/.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import jsonio
from ..errors import InputError
from .base import Question, Step, WorldPassage
from .phrasing import Phraser
from .pipeline import WorldSpec, assign_splits, build_world, check_holdout

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")


def slug(text: str) -> str:
    """`Tomás` -> `tomas`, `my parents' flat` -> `my-parents-flat`: safe file names on any system."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return re.sub(r"[^a-z0-9]+", "-", ascii_text).strip("-")


def day(d: dt.date) -> str:
    """`4 March 2025`: how the notes write dates, and so how gold answers read."""
    return f"{d.day} {MONTHS[d.month - 1]} {d.year}"  # not strftime: that follows the locale


def roster(rng: random.Random, first: tuple[str, ...], last: tuple[str, ...], n: int,
           least: int) -> list[tuple[str, str]]:
    """`n` people (`least` to len(first)): first names drawn without repeats, so that a first name
    names one person, last names with."""
    n = max(least, min(n, len(first)))
    return list(zip(rng.sample(first, n), rng.choices(last, k=n)))


@dataclass(frozen=True)
class Note:
    key: str      # the entity the note is about, e.g. "person:priya" (split hold-out)
    path: str     # relative path in the folder, e.g. "people/priya.md"
    title: str
    lines: tuple[str, ...]

    @property
    def markdown(self) -> str:
        return f"# {self.title}\n\n" + "\n".join(self.lines) + "\n"

    @property
    def text(self) -> str:
        return " ".join(self.lines)


@dataclass
class Asker:
    """Questions over one world's notes: `hop` names a note to search for, `ask` phrases the question."""

    w: object                                  # the generated world the notes describe
    notes: dict[tuple[str, str], Note]         # (kind, key) -> note
    pid: dict[str, str]                        # note path -> passage id
    ph: Phraser
    facts: dict[str, tuple[tuple[str, ...], str]]   # 1-hop relation -> (templates with {x}, label)
    chains: dict[str, tuple[str, ...]]              # chain relation -> templates with {x}

    def hop(self, kind: str, key: str, think: str, *queries: str) -> Step:
        return Step(think, queries, self.pid[self.notes[(kind, key)].path])

    def ask(self, rel: str, x: str, answers: list[str], steps: list[Step], entities: tuple[str, ...],
            final: str, bridge: str | None = None) -> Question:
        chain = rel in self.chains
        templates = self.chains[rel] if chain else self.facts[rel][0]
        paths = [p for s in steps for p, pid in self.pid.items() if pid == s.evidence]
        return Question(self.ph.ask(templates, x=x), answers, len(steps), "chain" if chain else "fact", rel,
                        tuple(dict.fromkeys(entities)), [s.evidence for s in steps], steps, final, bridge,
                        meta={"notes": paths})


def collect(w: object, kinds) -> dict[tuple[str, str], Note]:
    """Every note by (kind, key), in the order of `kinds`: (kind, its table in `w`, its renderer)."""
    return {(kind, key): render(w, key) for kind, table, render in kinds for key in table}


@dataclass(frozen=True, eq=False)
class NoteWorld:
    """A world of notes: how it is generated, written and asked about, and what --size counts."""

    spec: WorldSpec
    make: Callable[[int, int], object]                        # (seed, size) -> the generated world
    render: Callable[[object], dict[tuple[str, str], Note]]   # its notes by (kind, key), in a fixed order
    facts: dict[str, tuple[tuple[str, ...], str]]
    chains: dict[str, tuple[str, ...]]
    questions: Callable[[Asker], list[Question]]
    subject: str         # "the workplace": what the progress line says it generates
    unit: str            # "people": what --size counts
    least: int
    most: int
    default: int


def build_notebook(world: NoteWorld, out: str | Path, seed: int = 0, holdout: float = 0.15, size: int | None = None,
                   as_folder: bool = False, say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build a world of notes into `out`: one passage per note, the world's files; returns stats.json's content."""
    check_holdout(holdout)
    if size is not None and not world.least <= size <= world.most:
        raise InputError(f"--size for {world.spec.kind} counts {world.unit}: {world.least} to {world.most}, "
                         f"got {size}")
    say(f"generating {world.subject}")
    w = world.make(seed, size or world.default)
    notes = world.render(w)
    passages = [WorldPassage(str(i), n.title, n.text) for i, n in enumerate(notes.values())]
    pid = {n.path: p.id for n, p in zip(notes.values(), passages)}
    say(f"generating questions over {len(notes)} notes")
    candidates = world.questions(Asker(w, notes, pid, Phraser(seed, world.spec.kind), world.facts, world.chains))
    split_of = assign_splits({n.key for n in notes.values()}, seed, holdout)
    stats = build_world(out, world.spec, passages, candidates, split_of, seed, say)
    if as_folder:
        for n in notes.values():
            path = Path(out) / "notes" / n.path
            path.parent.mkdir(parents=True, exist_ok=True)
            jsonio.write_text(path, n.markdown)
    return stats
