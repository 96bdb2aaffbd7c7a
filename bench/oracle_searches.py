"""What an oracle's searches are made of, from built world or mixture folders.

    python bench/oracle_searches.py out/worlds/notes out/worlds/club out/worlds-mix/all

For each folder (a mixture: each of its worlds): its train questions, the oracle trajectories kept
for them, how many of those have a first search holding a word the question does not (a note's
title: "Sholto Rudd" searched for "Sholto side", a surname the searcher cannot know and a student
learns to invent), and the share of the train questions whose every search finds that hop's
evidence in BM25's top 3 over the folder's own corpus (searched again here: the check a build or
a mixture makes). `oracle_search` is what the world's build recorded (`data build --oracle-search`;
"default" where it recorded none: notes and club searched titles). Words are BM25's, compared case-insensitively (`fts.unasked_words`). One JSON
object per folder and world on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table1 import fail, read_rows  # noqa: E402

from dgpo_edge.fts import BM25Index, unasked_words  # noqa: E402
from dgpo_edge.protocol import Passage  # noqa: E402

TOP_K = 3   # the oracle's (worlds.oracle, worlds.mixture)


def searches(trajectory: dict) -> list[str]:
    return [seg.get("query", "") for seg in trajectory["segments"] if seg["kind"] == "information"]


def hits(trajectory: dict, evidence: list[str], index: BM25Index) -> bool:
    """Whether every search of the trajectory finds its hop's evidence in the top 3."""
    queries = searches(trajectory)
    return len(queries) <= len(evidence) and all(
        evidence[hop] in {p.id for p in index.search(q, k=TOP_K)} for hop, q in enumerate(queries))


def report(folder: Path) -> list[dict]:
    """One row per world of the folder (a world folder: itself)."""
    for name in ("corpus.jsonl", "train.jsonl", "oracle.jsonl", "manifest.json"):
        if not (folder / name).is_file():
            fail(f"error: {folder}: no {name} (not a built world or mixture)")
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    index = BM25Index(Passage(r["id"], r["contents"]) for r in read_rows(folder / "corpus.jsonl"))
    train = {r["id"]: r for r in read_rows(folder / "train.jsonl")}
    oracle = read_rows(folder / "oracle.jsonl")
    world_of = (lambda row: row["world"]) if manifest.get("kind") == "mixture" else (lambda row: manifest["kind"])
    questions, kept, invents, hit = (defaultdict(int) for _ in range(4))
    for row in train.values():
        questions[world_of(row)] += 1
    for t in oracle:
        row = train[t["id"]]
        world, first = world_of(row), searches(t)[:1]
        kept[world] += 1
        invents[world] += bool(first and unasked_words(first[0], row["question"]))
        hit[world] += hits(t, row["evidence"], index)
    searched = {w: (manifest.get("worlds", {}).get(w) or manifest).get("oracle_search", "default")
                for w in questions}
    return [{"folder": str(folder), "world": w, "oracle_search": searched[w], "train": n, "oracle": kept[w],
             "first_search_word_not_in_question": invents[w],
             "first_search_word_not_in_question_share": round(invents[w] / max(kept[w], 1), 4),
             "bm25_top3_hit_share": round(hit[w] / max(n, 1), 4)} for w, n in sorted(questions.items())]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folders", nargs="+", type=Path, help="world or mixture folders (data build, data mix)")
    for folder in p.parse_args().folders:
        for row in report(folder):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
