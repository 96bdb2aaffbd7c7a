"""A rollout round's BM25 searches: one at a time against `BM25Index.search_many`, side by side.

The queries are the oracle trajectories' own searches (what a trained student asks), drawn in
batches the size of one FactbookQA RL step's searches (128 rollouts, about 1.5 searches each).
Prints the median seconds per batch over `--repeats` runs for each way, and checks that both
return the same passages.

    python bench/bm25_batch.py --data out/factbookqa --batch 192 --repeats 7 --threads 1,2,4
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import time
from pathlib import Path

SEARCH = re.compile(r"<search>\s*(.*?)\s*</search>")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("out/factbookqa"), help="corpus.jsonl + oracle.jsonl")
    ap.add_argument("--batch", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", default="1,2,4")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from dgpo_edge.train.evaluation import open_retriever

    index = open_retriever(str(args.data / "corpus.jsonl")).index
    queries = [q for line in (args.data / "oracle.jsonl").open(encoding="utf-8") for q in SEARCH.findall(line)]
    rng = random.Random(args.seed)
    batches = [rng.sample(queries, args.batch) for _ in range(args.repeats)]
    expected = [[index.search(q, 3) for q in b] for b in batches]
    rows = {"one_by_one": _time(lambda b: [index.search(q, 3) for q in b], batches)}
    for n in (int(x) for x in args.threads.split(",")):
        index.threads = n
        got = [index.search_many(b, 3) for b in batches]   # also warms the threads' copies
        assert got == expected, f"search_many with {n} threads ranks differently"
        rows[f"search_many_{n}_threads"] = _time(lambda b: index.search_many(b, 3), batches)
    print(json.dumps({"batch": args.batch, "repeats": args.repeats, "unique_per_batch":
                      statistics.median(len(set(b)) for b in batches), "median_s": rows}, indent=1))


def _time(fn, batches) -> float:
    times = []
    for b in batches:
        t0 = time.perf_counter()
        fn(b)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 4)


if __name__ == "__main__":
    main()
