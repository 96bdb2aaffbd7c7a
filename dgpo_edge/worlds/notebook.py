"""What the worlds of personal Markdown notes share: notes, dates, the asker, the build.

A notes world (`notes`, a workplace; `club`, a rowing club) is a `NoteWorld`: it generates its
subjects from the seed, renders each as one short `Note` with [[links]] to other notes, and asks
questions through an `Asker`: 1-hop facts read one note, chains follow links across two or three.
`build_notebook` turns the notes into passages (one each), verifies, splits and writes the
world's files, and with `as_folder` writes the notes as Markdown under DIR/notes/.

How the oracle's first search is made (`oracle_search`): `title` searches the note's title, as
the worlds always did, so a question naming only "Sholto" is searched "Sholto Rudd", a surname
the searcher cannot know and a student trained on it learns to invent; `asked` searches the
question's own words (`asked_queries`). Later hops search a title either way: the [[link]] of
the note read before names it.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .. import jsonio
from ..errors import InputError
from ..fts import query_words
from .base import Question, Step, WorldPassage
from .phrasing import Phraser
from .pipeline import HOLDOUT, WorldSpec, assign_splits, build_options, build_world, check_holdout

ORACLE_SEARCHES = ("title", "asked")   # the first is the default, the worlds' oracle before the option
ASKED_MISSED = "oracle_question_words_missed_note"   # stats.json's drop reason for an `asked` first hop
# Words an `asked` query leaves out (but for the whole question): what a question asks with, not about.
QUESTION_WORDS = frozenset("""a an the of for to in on at by with from and or is are was were be do does did s
    what whats which who whos whom whose where when how i me my we us our you your it its their there that this
    name someone""".split())

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


def typed(question: str, mention: str) -> str:
    """`mention` as the question types it ("gustavo" in a lowercased question); the mention itself
    where the question does not hold it (phrasing protects it from typos, so it always should)."""
    at = question.lower().find(mention.lower())
    return question[at:at + len(mention)] if at >= 0 else mention


def asked_queries(question: str, mention: str, title: str) -> tuple[str, ...]:
    """The first hop's candidate queries, each of the question's own words, in a fixed order:
    1. the entity as typed with the question's other words that name the note (in its `title`, less
       those a question asks with): "Bison kickoff" of "When was the Bison kickoff?", "Sholto" of
       "Sholto side" (the note is "Sholto Rudd"), "Project Otter";
    2. the entity as typed alone ("Bison", "Emil's trip to Pune");
    3. the entity with all the question's other words less those it asks with ("gustavo phone extension");
    4. the whole question.
    The entity with the note's kind comes first because a mixture re-searches each query on the union
    of several worlds' notes: "Bison" finds the kickoff note among one world's notes, but in the union
    three notes worlds' "Project Bison" fill the top 3, and "Bison kickoff" still finds it."""
    name = typed(question, mention)
    before, _, after = question.partition(name)
    naming = {w.lower() for w in query_words(title)}
    named = [*_content_words(before, naming), name, *_content_words(after, naming)]
    every = [*_content_words(before), name, *_content_words(after)]
    return tuple(dict.fromkeys((" ".join(named), name, " ".join(every), question.rstrip("?").rstrip())))


def _content_words(text: str, among: set[str] | None = None) -> list[str]:
    """The words of `text` a question is about, not those it asks with; with `among`, only those in it."""
    return [w for w in query_words(text) if w.lower() not in QUESTION_WORDS and (among is None or w.lower() in among)]


def asked_step(question: str, mention: str, title: str, step: Step) -> Step:
    """`step` (the first hop) searched and thought about with the question's words only: its think
    names the note as the first query does, not by its title ("I need Sholto Rudd's note" invents the
    surname as the search "Sholto Rudd" does)."""
    queries = asked_queries(question, mention, title)
    return Step(f"I need the note on {queries[0]}.", queries, step.evidence, ASKED_MISSED)


@dataclass
class Asker:
    """Questions over one world's notes: `hop` names a note to search for, `ask` phrases the question."""

    w: object                                  # the generated world the notes describe
    notes: dict[tuple[str, str], Note]         # (kind, key) -> note
    pid: dict[str, str]                        # note path -> passage id
    ph: Phraser
    facts: dict[str, tuple[tuple[str, ...], str]]   # 1-hop relation -> (templates with {x}, label)
    chains: dict[str, tuple[str, ...]]              # chain relation -> templates with {x}
    search: str = ORACLE_SEARCHES[0]                # how the first hop searches (module docstring)

    @cached_property
    def titles(self) -> dict[str, str]:
        """Passage id -> its note's title."""
        return {self.pid[n.path]: n.title for n in self.notes.values()}

    def hop(self, kind: str, key: str, think: str, *queries: str) -> Step:
        return Step(think, queries, self.pid[self.notes[(kind, key)].path])

    def ask(self, rel: str, x: str, answers: list[str], steps: list[Step], entities: tuple[str, ...],
            final: str, bridge: str | None = None) -> Question:
        chain = rel in self.chains
        templates = self.chains[rel] if chain else self.facts[rel][0]
        paths = [p for s in steps for p, pid in self.pid.items() if pid == s.evidence]
        question = self.ph.ask(templates, x=x)
        if self.search == "asked":   # every question's first hop is the note on `x`, the entity it names
            steps = [asked_step(question, x, self.titles[steps[0].evidence], steps[0]), *steps[1:]]
        return Question(question, answers, len(steps), "chain" if chain else "fact", rel,
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


def build_notebook(world: NoteWorld, out: str | Path, seed: int = 0, holdout: float = HOLDOUT, size: int | None = None,
                   as_folder: bool = False, oracle_search: str = ORACLE_SEARCHES[0],
                   say: Callable[[str], None] = lambda msg: None) -> dict:
    """Build a world of notes into `out`: one passage per note, the world's files; returns stats.json's content.
    `oracle_search` other than the default is recorded in stats.json and manifest.json."""
    check_holdout(holdout)
    if oracle_search not in ORACLE_SEARCHES:
        raise InputError(f"--oracle-search must be {' or '.join(ORACLE_SEARCHES)}, got {oracle_search!r}")
    if size is not None and not world.least <= size <= world.most:
        raise InputError(f"--size for {world.spec.kind} counts {world.unit}: {world.least} to {world.most}, "
                         f"got {size}")
    say(f"generating {world.subject}")
    w = world.make(seed, size or world.default)
    notes = world.render(w)
    passages = [WorldPassage(str(i), n.title, n.text) for i, n in enumerate(notes.values())]
    pid = {n.path: p.id for n, p in zip(notes.values(), passages)}
    say(f"generating questions over {len(notes)} notes")
    candidates = world.questions(Asker(w, notes, pid, Phraser(seed, world.spec.kind), world.facts, world.chains,
                                       oracle_search))
    split_of = assign_splits({n.key for n in notes.values()}, seed, holdout)
    options = build_options(holdout, size, world.default,
                            None if oracle_search == ORACLE_SEARCHES[0] else oracle_search)
    stats = build_world(out, world.spec, passages, candidates, split_of, seed, say, options)
    if as_folder:
        for n in notes.values():
            path = Path(out) / "notes" / n.path
            path.parent.mkdir(parents=True, exist_ok=True)
            jsonio.write_text(path, n.markdown)
    return stats
