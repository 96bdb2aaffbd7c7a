"""Gold trajectories for the train questions of every world.

An oracle trajectory is what a perfect agent would write: think, search with a
query that really retrieves the evidence (checked against a BM25 index of the
corpus), read, and answer. The information blocks hold what the BM25 index
returned, so the trajectory is consistent with a real retriever; training can
re-render them with its own index.
"""

from __future__ import annotations

from collections import Counter

from ..fts import BM25Index
from ..transcript import Transcript
from .. import protocol
from .base import Question


def oracle_trajectory(q: Question, index: BM25Index, top_k: int = 3,
                      dropped: Counter[str] | None = None) -> dict | None:
    """The response segments of a gold trajectory, or None when a query misses its evidence
    (counted in `dropped` under the step's `missed` reason)."""
    t = Transcript(q.question)
    t.append_prompt(protocol.user_message(q.question))
    for step in q.steps:
        found = _first_hit(step.queries, step.evidence, index, top_k)
        if found is None:
            if dropped is not None:
                dropped[step.missed] += 1
            return None
        query, hits = found
        t.append_turn(f"<think> {step.think} </think>\n<search> {query} </search>")
        t.append_information(query, hits)
    t.append_turn(f"<think> {q.final_think} </think>\n<answer> {q.answers[0]} </answer>")
    segments = t.to_dict()["segments"][1:]  # the prompt depends on the model's chat template
    return {"id": q.id, "question": q.question, "golden_answers": q.answers,
            "response": t.response, "segments": segments}


def _first_hit(queries, evidence: str, index: BM25Index, top_k: int):
    """The first candidate query whose top-k contains the evidence, with its hits."""
    for query in queries:
        hits = index.search(query, k=top_k)
        if evidence in {p.id for p in hits}:
            return query, hits
    return None
