"""ARC: the agentic-RAG capability figures of the DGPO paper, from transcripts.

Rule-based, as in the paper:

- *query rewriting* = hit ratio: a gold answer appears in the passages the
  model's own searches retrieved (the answer was findable from its queries);
- *search steps* = mean number of `<search>` calls per question;
- invalid-action rate = generated turns with neither a search nor an answer;
- *source referencing* and *thinking* = EM when the gold evidence is handed to
  the model, without and with a think step. This module provides the prompts
  and the scoring for those two; running the model is the evaluator's job.

And a question's outcome (`outcome`): right, or where it was lost, from the
same facts - the evaluators' (`dgpo-edge eval`, train/evaluation.py) breakdown
of misses into retrieval and reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .metrics import exact_match, normalize_answer
from .protocol import Passage, extract_answer, format_docs, normalize_question
from .transcript import Transcript


@dataclass(frozen=True)
class EpisodeARC:
    """ARC facts about one finished episode."""

    searches: int
    hit: bool          # a gold answer occurs in the passages its searches retrieved
    turns: int
    invalid_turns: int
    answered: bool


def gold_in_passages(golds: str | Sequence[str], passages: Iterable[Passage]) -> bool:
    """Does any normalised gold alias occur, as whole words, in any passage?"""
    aliases = [normalize_answer(g) for g in ([golds] if isinstance(golds, str) else golds)]
    aliases = [a for a in aliases if a]  # "" would match everything
    texts = [f" {normalize_answer(p.contents)} " for p in passages]
    return any(f" {a} " in t for a in aliases for t in texts)


def episode_arc(transcript: Transcript, golds: str | Sequence[str]) -> EpisodeARC:
    return EpisodeARC(
        searches=len(transcript.searches()),
        hit=gold_in_passages(golds, transcript.retrieved_passages()),
        turns=len(transcript.turns()),
        invalid_turns=transcript.n_invalid,
        answered=transcript.answer() is not None,
    )


def summarize_arc(episodes: Sequence[EpisodeARC]) -> dict[str, float]:
    """Means over episodes; the invalid-action rate is per generated turn."""
    n = len(episodes)
    turns = sum(e.turns for e in episodes)
    if n == 0:
        return {"n": 0, "hit_ratio": 0.0, "search_steps": 0.0, "invalid_action_rate": 0.0,
                "answered_rate": 0.0}
    return {
        "n": n,
        "hit_ratio": sum(e.hit for e in episodes) / n,
        "search_steps": sum(e.searches for e in episodes) / n,
        "invalid_action_rate": sum(e.invalid_turns for e in episodes) / turns if turns else 0.0,
        "answered_rate": sum(e.answered for e in episodes) / n,
    }


# --- evidence-given modes (source referencing / thinking) -------------------------

EVIDENCE_TEMPLATE = (
    "Answer the given question using the documents below. {how}"
    "Give the final answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>.\n\n"
    "<information>{docs}</information>\n\nQuestion: {question}\n"
)
_HOW = {
    False: "Do not reason step by step; answer directly. ",
    True: "First reason inside <think> and </think> about which document answers it. ",
}


#: Where a question ended, first match wins: it was answered right; no answer came (the turns ran
#: out, or the output broke the protocol); the agent answered without searching; its searches never
#: retrieved a passage holding a gold answer; or they did and it answered something else. The last
#: two tell retrieval failures from reading failures: what to train next depends on which dominates.
OUTCOMES = ("right", "no_answer", "no_search", "not_found", "misread")


def outcome(rec: dict[str, Any]) -> str:
    """One prediction record's outcome (`OUTCOMES`), from its em, answered, searches and hit."""
    if float(rec["em"]) >= 1.0:
        return "right"
    if not rec["answered"]:
        return "no_answer"
    if int(rec["searches"]) == 0:
        return "no_search"
    return "misread" if rec["hit"] else "not_found"


def outcome_tally(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """{outcome: count} over `records`, every outcome present (0 where none)."""
    row = dict.fromkeys(OUTCOMES, 0)
    for r in records:
        row[outcome(r)] += 1
    return row


def outcome_counts(records: Sequence[dict[str, Any]], by: str) -> dict[str, dict[str, int]]:
    """{group: {outcome: count}} with every outcome present, grouped by the records' `by` field
    (records without it are left out)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if by in r:
            groups.setdefault(str(r[by]), []).append(r)
    return {name: outcome_tally(rs) for name, rs in sorted(groups.items())}


def evidence_message(question: str, passages: Sequence[Passage], think: bool) -> str:
    """The user turn for an evidence-given run (think=False: source referencing; True: thinking)."""
    return EVIDENCE_TEMPLATE.format(how=_HOW[think], docs=format_docs(passages).strip(),
                                    question=normalize_question(question))


def evidence_score(generated: str, golds: str | Sequence[str], think: bool) -> dict[str, float]:
    """EM of one evidence-given generation; `followed_format` says whether it kept the format."""
    answer = extract_answer([generated])
    thought = "<think>" in generated and "</think>" in generated
    return {"em": exact_match(answer, golds),
            "followed_format": float(answer is not None and (thought or not think))}
