"""Rows of runs' report.jsonl (`data.report`, evaluated during training) in bench/factbook_eval.py's
row format, appended to a JSONL that bench/table1.py reads.

Each report row of an RL run becomes one row named `rl<STEP>-<run>` (a run folder `rl-dgpo-s0` at
step 150 gives `rl150-dgpo-s0`; other folder names are kept whole), with `rl_steps`; a row of an SFT
or KD run (its config.yaml says which) is named `<run>-step<STEP>` and has no `rl_steps`. Each row
has the split's file stem, and the card and commit given here. A (method, split) already in the
output is skipped, so it can run again.

    python bench/report_rows.py out/runs/rl-dgpo-s0 out/runs/rl-ppo-s0 --out rows.jsonl \
        --card "NVIDIA H200" --commit abc1234 [--step 150]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def report_rows(run: Path, step: int | None, card: str, commit: str) -> list[dict]:
    """The run's report rows (all, or the one at `step`) as evaluation rows."""
    from dgpo_edge.errors import InputError
    from dgpo_edge.jsonio import read_jsonl

    path = run / "report.jsonl"
    if not path.is_file():
        raise InputError("no report.jsonl (was the run given data.report?)", run)
    name = run.name[3:] if run.name.startswith("rl-") else run.name
    rl = _stage(run) not in ("sft", "kd")
    rows = []
    for _, r in read_jsonl(path):
        if step is not None and r["step"] != step:
            continue
        head = {"method": f"rl{r['step']}-{name}", "rl_steps": r["step"]} if rl else {"method": f"{run.name}-step{r['step']}"}
        rows.append({**head, "split": Path(r["split"]).stem, "model": f"{run}@{r['step']}", "card": card,
                     "commit": commit, **{k: v for k, v in r.items() if k not in ("step", "split")}})
    return rows


def _stage(run: Path) -> str | None:
    """The trainer that wrote the run (sft, kd, ppo, dgpo, grpo), from its config.yaml's header."""
    config = run / "config.yaml"
    if not config.is_file():
        return None
    first = config.read_text(encoding="utf-8").split("\n", 1)[0].split()   # "# resolved kd config (...)"
    return first[2] if first[:2] == ["#", "resolved"] and len(first) > 2 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders with report.jsonl")
    ap.add_argument("--out", type=Path, required=True, help="rows .jsonl (appended)")
    ap.add_argument("--step", type=int, help="only this step's rows")
    ap.add_argument("--card", default="")
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    from dgpo_edge.jsonio import read_jsonl

    done = {(r["method"], r["split"]) for _, r in read_jsonl(args.out)} if args.out.exists() else set()
    new = []   # every run read before anything is written
    for run in args.runs:
        for row in report_rows(run, args.step, args.card, args.commit):
            if (row["method"], row["split"]) not in done:
                new.append(row)
                done.add((row["method"], row["split"]))
    with args.out.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in new)
    added = len(new)
    print(f"{added} rows added to {args.out}")


if __name__ == "__main__":
    import sys

    from dgpo_edge.errors import InputError

    try:
        main()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
