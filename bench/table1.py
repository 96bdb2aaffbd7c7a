"""FactbookQA Table 1: rows from bench/factbook_eval.py, named by method, with paired intervals.

    python bench/table1.py bench/results/factbook_eval_rows.jsonl \
        --as teacher-sft-2ep=teacher --as student-sft-o3=sft --as kd-o3-lr6e4=kd \
        --pair kd:sft --out bench/results/factbook_table1.json

Writes `{"card", "commit", "rows": [{"method", "seed", "split", "n", "em", "em_by_type", ...}],
"pairs": [...]}` and prints the markdown table (test split; dev beside it, since choices are
made on dev). `--as RUN=METHOD[@SEED]` names an evaluated run; runs not named are left out.
`--rl-step N` names every RL report row of step N (bench/report_rows.py's `rlN-METHOD-sSEED`)
METHOD@SEED, so the step a table compares is one argument, fixed before the rows are read;
`--as` still names the others (and wins for a row both would name).
`--pair A:B` adds a paired bootstrap 95% interval of EM(A) - EM(B) on the same test questions
(seed means per question when a method has several seeds), and with `--per-seed` one more
interval for each seed the two methods share (RL rows: the same prompts and steps per seed).
A row's `rl_steps` (the RL steps of the evaluated checkpoint) is kept and shown.
A rows file given as `LABEL=PATH` (the rows of another lease, say) has its run names read as
`LABEL/RUN`: `--rl-step` leaves them alone, so they join the table only by `--as LABEL/RUN=...`
and never collide with a run of the same name in another file.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import NoReturn

from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import read_jsonl

TYPES = ("fact", "bridge", "comparison", "neighbour", "neighbour_bridge")
KEEP = ("n", "em", "f1", "em_by_type", "em_by_hops", "hit_ratio", "search_steps",
        "invalid_action_rate", "params", "card", "commit", "model", "rl_steps", "scores")


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit status 2."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def read_rows(path: str | Path) -> list[dict]:
    """A jsonl file's rows; a missing or damaged file is one line, as every bad input here."""
    try:
        return [row for _, row in read_jsonl(path)]
    except InputError as e:
        fail(f"error: {e}")


def load_rows(paths: list[str], names: dict[str, tuple[str, int]], rl_step: int | None = None) -> list[dict]:
    rows = []
    at_step = re.compile(rf"rl{rl_step}-(.+)-s(\d+)") if rl_step is not None else None
    for spec in paths:
        label, path = _label_and_path(spec)
        for raw in read_rows(path):
            run = f"{label}/{raw['method']}" if label else raw["method"]
            name = names.get(run)
            if name is None and at_step and (m := at_step.fullmatch(run)):
                name = (m.group(1), int(m.group(2)))
            if name is None:
                continue
            method, seed = name
            rows.append({"method": method, "seed": seed, "split": raw["split"], "run": run,
                         **{k: raw[k] for k in KEEP if k in raw}})
    return rows


def _label_and_path(spec: str) -> tuple[str, str]:
    """LABEL=PATH, or a plain PATH (which may itself hold '=')."""
    if Path(spec).is_file() or "=" not in spec:
        return "", spec
    label, _, path = spec.partition("=")
    if "/" in label:
        fail(f"error: {spec}: no such rows file (a label, LABEL=PATH, has no '/')")
    return label, path


def paired_bootstrap(a: list[float], b: list[float], n_boot: int = 10_000, seed: int = 0) -> dict:
    """Mean difference a - b over the same questions, with a percentile 95% interval."""
    if len(a) != len(b) or not a:
        raise ValueError("paired scores must cover the same, non-empty question list")
    rng = random.Random(seed)
    n = len(a)
    diffs = [x - y for x, y in zip(a, b)]
    means = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    return {"diff": sum(diffs) / n, "lo": means[int(0.025 * n_boot)], "hi": means[int(0.975 * n_boot) - 1]}


def per_question(rows: list[dict], method: str, split: str = "test", seed: int | None = None) -> list[float]:
    """Per-question EM of `method`, averaged over its seeds (or of one seed)."""
    runs = [r["scores"] for r in rows if r["method"] == method and r["split"] == split
            and (seed is None or r["seed"] == seed)]
    if not runs:
        fail(f"error: --pair: no {split} rows for method {method!r}")
    return [sum(col) / len(col) for col in zip(*runs)]


def markdown(rows: list[dict]) -> str:
    groups: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[r["method"]][r["split"]].append(r)
    head = ("| method | seeds | RL steps | params | dev EM | test EM | " + " | ".join(TYPES)
            + " | 1-hop | 2-hop | hit ratio | search steps |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for method, splits in groups.items():
        test, dev = splits.get("test", []), splits.get("dev", [])
        if not test:
            continue
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        fmt = lambda rs, f: "–" if not rs else (  # noqa: E731
            f"{mean([f(r) for r in rs]):.3f}" + (f" ± {sd([f(r) for r in rs]):.3f}" if len(rs) > 1 else ""))
        steps = "/".join(str(r["rl_steps"]) for r in test if "rl_steps" in r) or "–"
        cells = [method, str(len(test)), steps, f"{test[0].get('params', 0) / 1e6:.1f}M",
                 fmt(dev, lambda r: r["em"]), fmt(test, lambda r: r["em"])]
        cells += [fmt(test, lambda r, t=t: r["em_by_type"].get(t, 0.0)) for t in TYPES]
        cells += [fmt(test, lambda r, h=h: r["em_by_hops"].get(h, 0.0)) for h in ("1", "2")]
        cells += [fmt(test, lambda r: r["hit_ratio"]), f"{mean([r['search_steps'] for r in test]):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sd(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rows", nargs="+", metavar="[LABEL=]ROWS.jsonl")
    p.add_argument("--as", dest="names", action="append", default=[], metavar="RUN=METHOD[@SEED]")
    p.add_argument("--rl-step", type=int, help="name the RL report rows of this step by method and seed")
    p.add_argument("--pair", action="append", default=[], metavar="A:B")
    p.add_argument("--per-seed", action="store_true", help="also a paired interval per shared seed")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    names = {}
    for spec in args.names:
        run, _, method = spec.partition("=")
        method, _, seed = method.partition("@")
        names[run] = (method, int(seed or 0))
    rows = load_rows(args.rows, names, args.rl_step)
    # a misspelt run (or a rows file left out) would drop its row from the table without a word
    unmatched = sorted(set(names) - {r["run"] for r in rows})
    if unmatched:
        fail(f"error: --as names no row in the rows files: {', '.join(unmatched)}")
    pairs = []
    for spec in args.pair:
        a, colon, b = spec.partition(":")
        if not (a and colon and b):
            fail(f"error: --pair {spec}: give two methods, A:B")
        pairs.append({"a": a, "b": b, "split": "test",
                      **paired_bootstrap(per_question(rows, a), per_question(rows, b))})
        shared = sorted({r["seed"] for r in rows if r["method"] == a} & {r["seed"] for r in rows if r["method"] == b})
        for seed in shared if args.per_seed and len(shared) > 1 else ():
            pairs.append({"a": a, "b": b, "split": "test", "seed": seed,
                          **paired_bootstrap(per_question(rows, a, seed=seed), per_question(rows, b, seed=seed))})
    cards = sorted({r.get("card", "") for r in rows})
    commits = sorted({r.get("commit", "") for r in rows})
    doc = {"card": ", ".join(cards), "commit": ", ".join(commits), "rows": rows, "pairs": pairs}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(markdown(rows))
    for pr in pairs:
        which = f" (seed {pr['seed']})" if "seed" in pr else ""
        print(f"\n{pr['a']} - {pr['b']} on test{which}: {pr['diff']:+.3f} "
              f"(95% paired bootstrap {pr['lo']:+.3f} .. {pr['hi']:+.3f})")


if __name__ == "__main__":
    main()
