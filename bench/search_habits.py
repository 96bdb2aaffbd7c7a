"""How a student searched, from `dgpo-edge eval` predictions: the habits behind its misses.

    python bench/search_habits.py bench/results/laptop_records_dgpo.predictions.jsonl.gz --prefix Project

For each predictions file (jsonl, or jsonl.gz as committed under bench/results/): the questions'
outcomes (dgpo_edge.arc.outcome: right, no answer, no search, not found, misread), how many
questions repeated an identical search (a student that searches the same words again until its
turns run out gives no answer), and with `--prefix WORD` how many had a search starting with that
word and what EM those questions got (a held-out world's student searching "Project X" brought the
notes world's habit with it). One JSON object per file on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table1 import fail  # noqa: E402

from dgpo_edge.arc import outcome_tally  # noqa: E402


def read_predictions(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError, EOFError) as e:
        fail(f"error: {path}: {e}")


def habits(rows: list[dict], prefix: str | None = None) -> dict:
    """Outcome counts, repeated searches and (with `prefix`) searches starting with that word."""
    counts = outcome_tally(rows)
    repeated = [r for r in rows if len(r["search_queries"]) != len(set(r["search_queries"]))]
    out = {"n": len(rows), "em": round(sum(r["em"] for r in rows) / len(rows), 4) if rows else 0.0,
           "outcomes": counts, "repeated_a_search": len(repeated),
           "repeated_and_no_answer": sum(1 for r in repeated if not r["answered"])}
    if prefix:
        word = prefix.lower()
        has = [any(q.lower() == word or q.lower().startswith(word + " ") for q in r["search_queries"]) for r in rows]
        with_it = [r for r, h in zip(rows, has) if h]
        rest = [r for r, h in zip(rows, has) if not h]
        em = lambda rs: round(sum(r["em"] for r in rs) / len(rs), 4) if rs else None  # noqa: E731
        out["prefix"] = {"word": prefix, "questions": len(with_it), "em": em(with_it), "em_of_the_rest": em(rest)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("predictions", nargs="+", type=Path, help="predictions.jsonl files (or .jsonl.gz)")
    p.add_argument("--prefix", help="count the questions with a search starting with this word")
    args = p.parse_args()
    for path in args.predictions:
        if not path.is_file():
            fail(f"error: no such predictions file: {path}")
        print(json.dumps({"file": str(path), **habits(read_predictions(path), args.prefix)}))


if __name__ == "__main__":
    main()
