"""Where a student's misreads came from, from `dgpo-edge eval` predictions.

    python bench/misreads.py bench/results/laptop_records_dgpo_bm25.predictions.jsonl.gz \
        --data records/test.jsonl --index records-bm25
    python bench/misreads.py out/worlds-eval/records.jsonl --method kd-24l@records-out \
        --data out/worlds/records/test.jsonl --index records-bm25

The second form reads bench/factbook_eval.py's rows (a GPU lane's evaluations, which keep each
question's answer and searches since 2026-11-29): the test row of --method, its questions in
--data's order.

A misread (dgpo_edge.arc.outcome) is a question lost with a passage holding the answer in front of
the student. For each one this says where the student's wrong answer stands:
- `name_or_kind`: in the head of an evidence passage of the question, its title or opening
  sentence ("Tanzen Joinery is a workshop."): it answered with what the record is, not a field;
- `another_field`: elsewhere in an evidence passage, i.e. another field of the right record;
- `other_passage`: only in another passage its searches returned (the asked field, say, of
  another record);
- `nowhere`: in no passage it was shown (made up, cut short, or a paraphrase).
The searches are run again through INDEX with --top-k (3, the agent commands' default), so INDEX
must be the index the predictions were made with (a BM25 index gives the same passages again); a
misread whose passages, searched again, hold no answer is counted as `not_found_again` and left out.
Matching is dgpo_edge.arc's: normalized, whole words. One JSON object per predictions file on
stdout: the counts per question type and all, and a few examples of each kind.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_habits import read_predictions  # noqa: E402
from table1 import fail  # noqa: E402

from dgpo_edge.arc import gold_in_passages, outcome  # noqa: E402
from dgpo_edge.errors import InputError  # noqa: E402
from dgpo_edge.jsonio import read_jsonl  # noqa: E402
from dgpo_edge.protocol import Passage  # noqa: E402

KINDS = ("name_or_kind", "another_field", "other_passage", "nowhere")


def head(passage: Passage) -> Passage:
    """The passage's title line and opening sentence: what the record is, before its fields."""
    title, _, body = passage.contents.partition("\n")
    return Passage(passage.id, f"{title}\n{body.split('. ', 1)[0]}", passage.score)


def where(prediction: str, shown: list[Passage], evidence_ids: set[str]) -> str:
    """Which of KINDS the wrong answer `prediction` falls in, given the passages shown."""
    evidence = [p for p in shown if p.id in evidence_ids]
    if gold_in_passages(prediction, [head(p) for p in evidence]):
        return "name_or_kind"
    if gold_in_passages(prediction, evidence):
        return "another_field"
    if gold_in_passages(prediction, [p for p in shown if p.id not in evidence_ids]):
        return "other_passage"
    return "nowhere"


def rows_as_predictions(path: Path, method: str, questions: list[dict]) -> list[dict]:
    """bench/factbook_eval.py's test row of `method` as one prediction per question."""
    found = [r for _, r in read_jsonl(path) if r.get("method") == method and r.get("split") == "test"]
    if not found:
        fail(f"error: {path}: no test row of method {method!r}")
    row = found[-1]
    if "answers" not in row:
        fail(f"error: {path}: the row of {method!r} keeps no answers (evaluated before they were kept)")
    if row["n"] > len(questions):
        fail(f"error: {path}: the row of {method!r} has {row['n']} questions, --data only {len(questions)}")
    return [{"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"], "prediction": a,
             "search_queries": s, "outcome": o}
            for q, a, s, o in zip(questions, row["answers"], row["search_queries"], row["outcomes"])]


def predictions_of(path: Path, method: str | None, questions: list[dict]) -> list[dict]:
    """A predictions file's rows, or with `method` the factbook_eval row of it; bad input is one error line."""
    if not path.is_file():
        fail(f"error: no such predictions file: {path}")
    try:
        return rows_as_predictions(path, method, questions) if method else read_predictions(path)
    except InputError as e:
        fail(f"error: {e}")


def misreads(rows: list[dict], questions: dict[str, dict], retriever, k: int, examples: int = 3) -> dict:
    counts: dict[str, Counter] = defaultdict(Counter)
    shown_examples: dict[str, list] = defaultdict(list)
    unmatched = 0
    for r in rows:
        if (r["outcome"] if "outcome" in r else outcome(r)) != "misread":   # GPU rows carry theirs
            continue
        q = questions.get(r["id"])
        if q is None:
            fail(f"error: question {r['id']} of the predictions is not in --data")
        shown, seen = [], set()
        for hits in retriever.search(r["search_queries"], k=k) if r["search_queries"] else []:
            for p in hits:
                if p.id not in seen:
                    seen.add(p.id)
                    shown.append(p)
        if not gold_in_passages(r["golden_answers"], shown):   # the run saw a passage with the answer
            unmatched += 1
            continue
        kind = where(r["prediction"] or "", shown, {str(e) for e in q.get("evidence", [])})
        counts[q.get("type", "?")][kind] += 1
        counts["all"][kind] += 1
        if len(shown_examples[kind]) < examples:
            shown_examples[kind].append({"question": r["question"], "gold": r["golden_answers"],
                                         "prediction": r["prediction"], "searches": r["search_queries"]})
    # searched again, a misread whose passages no longer hold the answer: another index than the run's
    return {"misread": sum(counts["all"].values()) + unmatched, "not_found_again": unmatched,
            "where": {t: {kind: c[kind] for kind in KINDS} for t, c in sorted(counts.items())},
            "examples": dict(shown_examples)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("predictions", nargs="+", type=Path, help="predictions.jsonl files (or .jsonl.gz)")
    p.add_argument("--data", required=True, type=Path, help="the questions (with type and evidence ids)")
    p.add_argument("--index", required=True, type=Path, help="the index the predictions searched")
    p.add_argument("--top-k", type=int, default=3, help="passages a search returned (3)")
    p.add_argument("--method", help="the files are bench/factbook_eval.py rows: the test row of this method")
    args = p.parse_args()
    from dgpo_edge.retrieval.retrievers import open_index

    try:
        ordered = [q for _, q in read_jsonl(args.data)]
        retriever = open_index(args.index)
    except InputError as e:
        fail(f"error: {e}")
    questions = {q["id"]: q for q in ordered}
    with retriever:
        for path in args.predictions:
            rows = predictions_of(path, args.method, ordered)
            print(json.dumps({"file": str(path), **misreads(rows, questions, retriever, args.top_k)}))


if __name__ == "__main__":
    main()
