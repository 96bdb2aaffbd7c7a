"""Words a student put in its searches that it could not have read: in neither the question nor the corpus.

    python bench/invented_words.py bench/results/worlds_club_eval/notes.jsonl --method kd-24l@notes-out-club \
        --data out/worlds/notes/test.jsonl --corpus out/worlds/notes/corpus.jsonl \
        --other club=out/worlds/club/corpus.jsonl
    python bench/invented_words.py eval-notes/predictions.jsonl --data notes/test.jsonl --corpus notes/corpus.jsonl

A searcher has the question and what earlier searches returned; a word of a search found in neither
the question nor the searched corpus was made up (a surname guessed for a first name, say), and a
made-up word that is in another world's corpus (`--other NAME=CORPUS`, e.g. a world of the training
mixture) was brought from there. Words are lowercase runs of letters of 3 or more. Reads `dgpo-edge
eval` predictions (jsonl, or .jsonl.gz) or, with `--method`, bench/factbook_eval.py's rows (the test
row of that method, its questions in --data's order, as bench/misreads.py does). One JSON object per
file on stdout: searches, those holding a made-up word, those holding one from each other corpus,
the EM of questions with and without a made-up word, and the most common made-up words.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from misreads import predictions_of  # noqa: E402
from table1 import fail  # noqa: E402

from dgpo_edge.errors import InputError  # noqa: E402
from dgpo_edge.jsonio import read_jsonl  # noqa: E402

WORD = re.compile(r"[a-z]{3,}")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def corpus_words(path: Path) -> set[str]:
    """Every word of a jsonl corpus's titles and texts (a passage's `contents`, or `title` + `text`)."""
    vocab: set[str] = set()
    for _, p in read_jsonl(path):
        vocab |= words(" ".join(str(p.get(k, "")) for k in ("title", "text", "contents")))
    return vocab


def right(row: dict) -> bool:
    """Eval predictions carry `em`; factbook_eval rows, as read by rows_as_predictions, an `outcome`."""
    return row.get("outcome") == "right" if "outcome" in row else bool(row.get("em"))


def invented(rows: list[dict], corpus: set[str], others: dict[str, set[str]], top: int = 12) -> dict:
    made_up: Counter[str] = Counter()
    searches = with_made_up = 0
    from_other: Counter[str] = Counter()
    flagged = []   # per question: a search of it holds a made-up word
    for r in rows:
        asked, any_made_up = words(r["question"]), False
        for query in r["search_queries"]:
            searches += 1
            new = words(query) - asked - corpus
            made_up.update(new)
            with_made_up += bool(new)
            any_made_up |= bool(new)
            for name, vocab in others.items():
                from_other[name] += bool(new & vocab)
        flagged.append(any_made_up)
    em = lambda rs: round(sum(map(right, rs)) / len(rs), 4) if rs else None  # noqa: E731
    return {"questions": len(rows), "searches": searches, "with_made_up_word": with_made_up,
            "with_a_word_from": {name: from_other[name] for name in others},
            "em_with_made_up": em([r for r, f in zip(rows, flagged) if f]),
            "em_without": em([r for r, f in zip(rows, flagged) if not f]),
            "questions_with_made_up": sum(flagged), "top_made_up": made_up.most_common(top)}


def parse_other(spec: str) -> tuple[str, Path]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        fail(f"error: --other {spec!r}: expected NAME=CORPUS, e.g. club=out/worlds/club/corpus.jsonl")
    return name, Path(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("predictions", nargs="+", type=Path, help="predictions.jsonl files (or .jsonl.gz)")
    p.add_argument("--corpus", required=True, type=Path, help="the corpus the searches ran over (jsonl)")
    p.add_argument("--other", action="append", default=[], help="NAME=CORPUS: another corpus to attribute words to")
    p.add_argument("--data", type=Path, help="the questions, in the rows' order (needed with --method)")
    p.add_argument("--method", help="the files are bench/factbook_eval.py rows: the test row of this method")
    args = p.parse_args()
    if args.method and not args.data:
        fail("error: --method needs --data (the questions the row scored, in order)")
    try:
        corpus = corpus_words(args.corpus)
        others = {name: corpus_words(path) - corpus for name, path in map(parse_other, args.other)}
        ordered = [q for _, q in read_jsonl(args.data)] if args.data else []
    except InputError as e:
        fail(f"error: {e}")
    for path in args.predictions:
        rows = predictions_of(path, args.method, ordered)
        print(json.dumps({"file": str(path), "method": args.method, **invented(rows, corpus, others)}))


if __name__ == "__main__":
    main()
