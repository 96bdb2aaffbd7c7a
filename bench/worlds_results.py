"""Collect leave-one-world-out EM rows into bench/results/worlds.json (issue 19's shape).

    python bench/worlds_results.py --eval-dir out/worlds-eval --mix-dir out/worlds-mix \
        --out bench/results/worlds.json

Reads the rows bench/factbook_eval.py appended to EVAL_DIR/CORPUS.jsonl (one file per evaluated
world folder; methods named MODEL@MIXTURE, e.g. kd@notes-out, as bench/worlds_loo.sh names them),
each mixture's manifest.json (MIX_DIR/MIXTURE/) for the worlds it was trained on and the one it
held out, and, with --worlds-dir, each evaluated folder's manifest.json for the world it is and its
seed: `notes-s1` is the notes world built with seed 1, so its rows say world "notes", corpus
"notes-s1", seed 1 (notes no model trained on, even where notes were in the mixture). Writes
{"card", "commit", "rows": [{"world", "corpus", "seed", "trained_on", "held_out", "split", "n", "em",
"model", "mixture"}, ...]} and prints the table as markdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dgpo_edge.jsonio import read_jsonl, write_json


def read_manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))


def world_of(corpus: str, worlds_dir: Path | None) -> tuple[str, int]:
    """(world, seed) of an evaluated folder: a folder named after a world is that world, another
    (`notes-s1`, `notes@2`) the world its name starts with, else the world its manifest names; the seed from the manifest (0 without one).
    `mixture-NAME` (bench/worlds_loo.sh's MIX_DEV rows: the mixture's own dev split) is world "mixture"."""
    import re

    from dgpo_edge.worlds.registry import WORLDS

    if corpus.startswith("mixture-"):
        return "mixture", 0

    if worlds_dir is None or not (worlds_dir / corpus / "manifest.json").exists():
        return corpus, 0
    manifest = read_manifest(worlds_dir / corpus)
    base = re.sub(r"(@|-s)\d+$", "", corpus)   # notes-s1, notes@2: the notes world at another seed
    return (base if base in WORLDS else manifest["kind"]), int(manifest.get("seed", 0))


def collect(eval_dir: Path, mix_dir: Path, worlds_dir: Path | None = None) -> dict:
    rows, cards, commits = [], set(), set()
    for path in sorted(eval_dir.glob("*.jsonl")):
        world, seed = world_of(path.stem, worlds_dir)
        for _, r in read_jsonl(path):
            model, _, mixture = r["method"].partition("@")
            manifest = read_manifest(mix_dir / mixture)
            rows.append({"world": world, "corpus": path.stem, "seed": seed, "trained_on": sorted(manifest["weights"]),
                         "held_out": world == manifest["held_out"], "split": r["split"], "n": r["n"],
                         "em": round(r["em"], 4), "model": model, "mixture": mixture})
            cards.add(r.get("card", ""))
            commits.add(r.get("commit", ""))
    rows.sort(key=lambda r: (r["mixture"], r["model"], r["world"], r["seed"]))
    return {"card": " / ".join(sorted(cards)), "commit": " / ".join(sorted(commits)), "rows": rows}


def markdown(result: dict) -> str:
    lines = ["| mixture | model | world | held out | n | EM |", "|---|---|---|---|---:|---:|"]
    for r in result["rows"]:
        world = r["world"] + (f" (seed {r['seed']})" if r.get("seed") else "")
        lines.append(f"| {r['mixture']} | {r['model']} | {world} | {'yes' if r['held_out'] else ''} "
                     f"| {r['n']} | {r['em']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--eval-dir", type=Path, required=True)
    p.add_argument("--mix-dir", type=Path, required=True)
    p.add_argument("--worlds-dir", type=Path, default=None, help="the evaluated world folders (their manifests)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    result = collect(args.eval_dir, args.mix_dir, args.worlds_dir)
    write_json(args.out, result)
    print(markdown(result))


if __name__ == "__main__":
    main()
