"""How well the laptop's index finds the notes world's notes, the way `index build` makes it.

    .venv/bin/python bench/notes_retrieval.py --work out/bench-notes [--size 100] [--seed 0]

Builds the notes world as a folder (`data build notes --as-folder`), indexes
the folder with `index build`'s defaults (MiniLM-int8 vectors, BM25 alongside)
and, for the dense, BM25 and hybrid retrievers, reports how often the top 3
holds the gold note:

- for every hop of every oracle trajectory, searching the oracle's query
  (what a trained agent should type);
- for every question, searching the question text itself (what an untrained
  agent often does), against the first hop's note.

Prints a markdown table (pasted into docs/worlds.md with date and machine).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from dgpo_edge.retrieval.build import build_index
from dgpo_edge.retrieval.retrievers import open_index
from dgpo_edge.worlds.pipeline import SPLITS
from dgpo_edge.worlds.registry import build

KINDS = ("dense", "bm25", "hybrid")


def _rows(world: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (world / name).read_text(encoding="utf-8").splitlines()]


def probes(world: Path) -> dict[str, list[tuple[str, str]]]:
    """(query, gold note path) pairs by probe name."""
    questions = [q for s in SPLITS for q in _rows(world, f"{s}.jsonl")]
    by_id = {q["id"]: q for q in questions}
    oracle = [(query, by_id[o["id"]]["notes"][hop]) for o in _rows(world, "oracle.jsonl")
              for hop, query in enumerate(re.findall(r"<search> (.*?) </search>", o["response"]))]
    out = {"oracle queries, every hop": oracle}
    for hops in sorted({q["hops"] for q in questions}):
        out[f"question text, {hops}-hop questions"] = [(q["question"], q["notes"][0])
                                                        for q in questions if q["hops"] == hops]
    return out


def hit_rate(index: Path, kind: str, pairs: list[tuple[str, str]]) -> float:
    results = open_index(index, kind=kind).search([q for q, _ in pairs], k=3)
    hits = sum(gold in {p.id.partition("#")[0] for p in ps} for (_, gold), ps in zip(pairs, results))
    return hits / len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--size", type=int, default=100, help="people in the notes world")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    world, index = args.work / "world", args.work / "index"
    stats = build("notes", world, seed=args.seed, size=args.size, as_folder=True)
    build_index(world / "notes", index, overwrite=True)
    print(f"notes world, seed {args.seed}, {args.size} people: {stats['passages']} notes, "
          f"{stats['questions']} questions\n")
    print("| probe | n | " + " | ".join(f"{k} hit@3" for k in KINDS) + " |")
    print("|---|---:|" + "---:|" * len(KINDS))
    for name, pairs in probes(world).items():
        rates = " | ".join(f"{hit_rate(index, k, pairs):.3f}" for k in KINDS)
        print(f"| {name} | {len(pairs)} | {rates} |")


if __name__ == "__main__":
    main()
