"""The training curves of RL runs as one JSON file, the raw numbers behind a `dgpo-edge plot` image.

    python bench/curves.py out/runs/rl-dgpo-s0 out/runs/rl-ppo-s0 --card "NVIDIA H100 80GB HBM3" \
        --commit 4c715e9 --what "..." --out bench/results/factbook_rl_curves.json

Writes `{"card", "commit", "date", "what", "runs": {RUN: {"metrics": {COLUMN: [...]},
"dev": {"step": [...], "dev_em": [...]}}}}` with the per-step columns the Fig. 5 panels draw
(those a run lacks are left out) and its dev evaluations.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
from pathlib import Path

COLUMNS = ("step", "reward", "em", "response_length", "kl_teacher", "entropy", "teacher_share",
           "time_step_s", "peak_mem_gb")


def _floats(path: Path, columns: tuple[str, ...]) -> dict[str, list[float]]:
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    have = [c for c in columns if rows and c in rows[0]]
    # a column logged as "nan" (no teacher in a PPO run) is kept as null
    return {c: [None if r[c] in ("", "nan", "na") else round(float(r[c]), 5) for r in rows] for c in have}


def run_curves(run: Path) -> dict:
    out = {"metrics": _floats(run / "metrics.csv", COLUMNS)}
    dev = _floats(run / "eval.csv", ("step", "dev_em")) if (run / "eval.csv").is_file() else {}
    if dev.get("step"):   # a run cut before its first evaluation has a header only
        out["dev"] = {**dev, "step": [int(s) for s in dev["step"]]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--card", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--what", required=True, help="one line: which runs, where")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    missing = [str(r) for r in args.runs if not (r / "metrics.csv").is_file()]
    if missing:
        p.error(f"no metrics.csv in {', '.join(missing)}")   # exit status 2
    doc = {"card": args.card, "commit": args.commit, "date": dt.date.today().isoformat(), "what": args.what,
           "runs": {r.name: run_curves(r) for r in args.runs}}
    args.out.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(doc['runs'])} runs)")


if __name__ == "__main__":
    main()
