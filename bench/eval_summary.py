"""One results row from a `dgpo-edge eval` folder: EM, F1, hit ratio and searches, by question type
and hops, where the questions were lost by type (the eval report's outcomes: no answer, no search,
not found, misread), seconds per question, and the per-question EM and outcome, optionally paired
with an earlier row.

    python bench/eval_summary.py eval-dgpo-records --data records/test.jsonl \
        --questions "records test (seed 0), unseen" --command "dgpo-edge eval ..." \
        --student "..." --card "..." --against bench/results/laptop_records_24l.json \
        --out bench/results/laptop_records_dgpo.json

Writes `{"card", "commit", "student", "date", "note", "rows": [row]}` in the shape of
bench/results/laptop_records_24l.json. `--against FILE` (a file of that shape, its first row) adds
`paired`: this row's EM minus that row's on the same question ids, with a paired bootstrap 95%
interval (bench/table1.py's).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table1 import fail, paired_bootstrap, read_rows  # noqa: E402

from dgpo_edge.arc import outcome, outcome_counts  # noqa: E402


def summarize(predictions: list[dict], questions: dict[str, dict]) -> dict:
    """The row's numbers; every prediction's question must be in `questions`."""
    missing = [p["id"] for p in predictions if p["id"] not in questions]
    if missing:
        fail(f"error: {len(missing)} predictions are not questions of --data (first: {missing[0]})")
    by_type, hit_type, by_hops = defaultdict(list), defaultdict(list), defaultdict(list)
    for p in predictions:
        q = questions[p["id"]]
        by_type[q["type"]].append(p["em"])
        hit_type[q["type"]].append(p["hit"])
        by_hops[str(q["hops"])].append(p["em"])
    mean = lambda xs: round(sum(xs) / len(xs), 4)  # noqa: E731
    return {"n": len(predictions), "em": mean([p["em"] for p in predictions]),
            "f1": mean([p["f1"] for p in predictions]), "hit_ratio": mean([p["hit"] for p in predictions]),
            "searches": mean([p["searches"] for p in predictions]),
            "seconds_p50": round(statistics.median(p["seconds"] for p in predictions), 2),
            "em_by_type": {t: mean(v) for t, v in sorted(by_type.items())},
            "n_by_type": {t: len(v) for t, v in sorted(by_type.items())},
            "em_by_hops": {h: mean(v) for h, v in sorted(by_hops.items())},
            "hit_by_type": {t: mean(v) for t, v in sorted(hit_type.items())},
            "outcomes_by_type": outcome_counts([{**p, "type": questions[p["id"]]["type"]} for p in predictions], "type"),
            "ids": [p["id"] for p in predictions], "em_per_question": [p["em"] for p in predictions],
            "outcome_per_question": [outcome(p) for p in predictions]}


def paired(row: dict, against: dict) -> dict:
    theirs = dict(zip(against["ids"], against["em_per_question"]))
    ids = [i for i in row["ids"] if i in theirs]
    if not ids:
        fail("error: --against shares no question id with these predictions")
    ours = dict(zip(row["ids"], row["em_per_question"]))
    b = paired_bootstrap([ours[i] for i in ids], [theirs[i] for i in ids])
    return {"n": len(ids), **{k: round(v, 4) for k, v in b.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("eval_dir", type=Path, help="a `dgpo-edge eval --out` folder (predictions.jsonl)")
    p.add_argument("--data", type=Path, required=True, help="the questions it answered (type, hops)")
    p.add_argument("--questions", required=True, help="what the questions are, in words")
    p.add_argument("--command", required=True, help="the commands that made the folder")
    p.add_argument("--student", required=True)
    p.add_argument("--card", required=True)
    p.add_argument("--note", default="")
    p.add_argument("--commit", help="the commit the evaluation ran at (default: git's HEAD here), for a "
                                    "folder summarized later")
    p.add_argument("--against", type=Path, help="an earlier results file of this shape, to pair with")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    predictions = read_rows(args.eval_dir / "predictions.jsonl")
    if not predictions:
        fail(f"error: {args.eval_dir / 'predictions.jsonl'} holds no predictions")
    questions = {q["id"]: q for q in read_rows(args.data)}
    row = {"questions": args.questions, "command": args.command, **summarize(predictions, questions)}
    if args.against:
        earlier = json.loads(args.against.read_text())
        row["paired"] = {"against": f"{args.against.name} ({earlier['student']})", **paired(row, earlier["rows"][0])}
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    doc = {"card": args.card, "commit": commit, "student": args.student,
           "date": dt.date.today().isoformat(), "note": args.note, "rows": [row]}
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in row.items() if k not in ("ids", "em_per_question", "outcome_per_question")},
                     indent=1))


if __name__ == "__main__":
    main()
