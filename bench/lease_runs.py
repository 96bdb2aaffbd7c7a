"""What a lease's runs wrote beside their test rows, as one JSON file for bench/results/.

    python bench/lease_runs.py out/runs/rl-dgpo-s1 out/runs/kd-sft-s0 ... --lanes-log out/logs/lanes.log \
        --card "NVIDIA H200" --commit 1be926d --what "..." --out bench/results/factbook_runs_1be926d.json

For each run folder: its `summary.json` (absent for a run the deadline stopped), its dev evaluations
(`eval.csv`), and from `metrics.csv` the steps logged and, for an RL run, how often the collapse
alarm fired; for a KD run (a `loss` column) the first and last logged rows, so a loss that fell
(or did not) is on record. `--lanes-log` adds bench/factbook_lanes.sh's log lines (the times).
Writes `{"card", "commit", "date", "what", "lanes_log": [...], "runs": {RUN: {...}}}`.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
from pathlib import Path


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _number(v: str | None, key: str = "") -> float | int | None:
    """A csv cell as a number (None when empty or nan); steps and counts as integers."""
    if v is None or v in ("", "nan", "na"):
        return None
    return int(float(v)) if key in ("step", "dev_n") else float(v)


def run_record(run: Path) -> dict:
    """One run folder's summary, dev evaluations and what its metrics say about the training."""
    out: dict = {}
    if (run / "summary.json").is_file():
        out["summary"] = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    dev = [{k: _number(v, k) for k, v in r.items()} for r in _rows(run / "eval.csv")]
    if dev:
        out["dev"] = dev
    metrics = _rows(run / "metrics.csv")
    if metrics and "loss" in metrics[0]:   # a KD run: its loss at the first and the last log
        keep = ("step", "loss", "peak_mem_gb", "elapsed_s")
        out["first_logged"] = {k: _number(metrics[0][k], k) for k in keep if k in metrics[0]}
        out["last_logged"] = {k: _number(metrics[-1][k], k) for k in keep if k in metrics[-1]}
    elif metrics:
        if "collapse" in metrics[0]:
            out["collapse_alarms"] = sum(1 for r in metrics if (_number(r["collapse"]) or 0) > 0)
        out["steps_logged"] = len(metrics)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--lanes-log", type=Path, help="bench/factbook_lanes.sh's out/logs/lanes.log")
    p.add_argument("--card", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--what", required=True, help="one line: which lease, which command")
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args()
    bare = [str(r) for r in args.runs if not any((r / f).is_file() for f in ("summary.json", "metrics.csv"))]
    if bare:
        p.error(f"no summary.json or metrics.csv in {', '.join(bare)}")   # exit status 2
    if args.lanes_log is not None and not args.lanes_log.is_file():
        p.error(f"no such lanes log: {args.lanes_log}")
    doc = {"card": args.card, "commit": args.commit, "date": dt.date.today().isoformat(), "what": args.what}
    if args.lanes_log is not None:
        doc["lanes_log"] = [line for line in args.lanes_log.read_text(encoding="utf-8").splitlines() if line.strip()]
    doc["runs"] = {r.name: run_record(r) for r in args.runs}
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({len(doc['runs'])} runs)")


if __name__ == "__main__":
    main()
