"""What every world is made of: passages, questions with their oracle steps.

A world module turns its source package into `WorldPassage`s and candidate
`Question`s; `worlds.pipeline` then verifies, splits, writes oracle
trajectories and the files (the same files for every world).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class CorpusPassage:
    """`contents` and the corpus row for a passage class with `id`, `title` and `text`."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f'"{self.title}"\n{self.text}'

    def to_corpus_row(self) -> dict:
        return {"id": self.id, "contents": self.contents}


@dataclass(frozen=True)
class WorldPassage(CorpusPassage):
    """One corpus passage: `contents` is `"Title"\\ntext`, as in Search-R1's wiki-18."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Step:
    """One oracle search: what it thinks, what it asks, which passage it needs."""

    think: str
    queries: tuple[str, ...]  # candidates, best first; the oracle uses the first that works
    evidence: str  # passage id
    missed: str = "oracle_query_missed_evidence"  # stats.json's drop reason when no candidate retrieves it


@dataclass
class Question:
    question: str
    answers: list[str]
    hops: int
    type: str                  # e.g. fact | bridge | comparison (world-specific names)
    relation: str              # the attribute asked for, e.g. "currency"
    entities: tuple[str, ...]  # the entities involved (split hold-out uses these; FactbookQA: countries)
    evidence: list[str]        # passage ids, hop order
    steps: list[Step]
    final_think: str
    bridge: str | None = None
    id: str = ""
    meta: dict = field(default_factory=dict)  # extra row fields a world adds (e.g. note paths)



MAX_WORDS = 130  # like FactbookQA's passages: about 100 words, never more than 130


def pack(title: str, sentences: list[str], first_id: int, max_words: int = MAX_WORDS) -> list[WorldPassage]:
    """Sentences of one section into passages of at most `max_words` words, ids from `first_id`.

    A sentence is never split, so a fact stated in one sentence lives in exactly
    one passage (a sentence longer than `max_words` gets a passage of its own).
    """
    chunks: list[list[str]] = [[]]
    for s in (s.strip() for s in sentences):
        if not s:
            continue
        n = sum(len(x.split()) for x in chunks[-1])
        if chunks[-1] and n + len(s.split()) > max_words:
            chunks.append([])
        chunks[-1].append(s)
    return [WorldPassage(str(first_id + i), title, " ".join(c)) for i, c in enumerate(chunks) if c]
