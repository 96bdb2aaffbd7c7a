"""Collect leave-one-world-out EM rows into bench/results/worlds.json (issue 19's shape).

    python bench/worlds_results.py --eval-dir out/worlds-eval --mix-dir out/worlds-mix \
        --out bench/results/worlds.json

Reads the rows bench/factbook_eval.py appended to EVAL_DIR/WORLD.jsonl (one file per evaluated
world; methods named MODEL@MIXTURE, e.g. kd@notes-out, as bench/worlds_loo.sh names them) and
each mixture's manifest.json (MIX_DIR/MIXTURE/) for the worlds it was trained on and the one it
held out. Writes {"card", "commit", "rows": [{"world", "trained_on", "held_out", "split", "n",
"em", "model", "mixture"}, ...]} and prints the table as markdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dgpo_edge.jsonio import read_jsonl, write_json


def collect(eval_dir: Path, mix_dir: Path) -> dict:
    rows, cards, commits = [], set(), set()
    for path in sorted(eval_dir.glob("*.jsonl")):
        for _, r in read_jsonl(path):
            model, _, mixture = r["method"].partition("@")
            manifest = json.loads((mix_dir / mixture / "manifest.json").read_text(encoding="utf-8"))
            rows.append({"world": path.stem, "trained_on": sorted(manifest["weights"]),
                         "held_out": path.stem == manifest["held_out"], "split": r["split"], "n": r["n"],
                         "em": round(r["em"], 4), "model": model, "mixture": mixture})
            cards.add(r.get("card", ""))
            commits.add(r.get("commit", ""))
    rows.sort(key=lambda r: (r["mixture"], r["model"], r["world"]))
    return {"card": " / ".join(sorted(cards)), "commit": " / ".join(sorted(commits)), "rows": rows}


def markdown(result: dict) -> str:
    lines = ["| mixture | model | world | held out | n | EM |", "|---|---|---|---|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['mixture']} | {r['model']} | {r['world']} | {'yes' if r['held_out'] else ''} "
                     f"| {r['n']} | {r['em']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--eval-dir", type=Path, required=True)
    p.add_argument("--mix-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    result = collect(args.eval_dir, args.mix_dir)
    write_json(args.out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
