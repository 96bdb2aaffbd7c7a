"""A rollout round's BM25 searches: FTS5's bm25() in SQLite against the numpy postings
(`BM25Index(postings=False)` vs the default), side by side on the same batches, no cache.

Two kinds of query, drawn in batches the size of one RL step's searches: the oracle
trajectories' own searches (short: "Peru capital") and the questions themselves, which an
untrained or confused student searches word for word ("what team does lucas belong to"): their
common words make FTS5 score most of the corpus. Prints the median seconds per batch over
`--repeats` batches for each way, the one-off cost of building the postings, and checks that
both ways return the same passages with the same scores.

With `--tokenizer DIR`, also the other host work of a search: the observations of the batch's
passages (top 3, 500 tokens, shortened by a binary search over the text as the episodes do; the
block and its token ids), built with a fresh `protocol.InformationBlocks` one at a time, with a fresh
one as one round (`prefetch` and the ids in batch calls: what RL rollouts do), and again from that
memory (an RL run's next epoch); all three must give the same blocks and ids.

    python bench/bm25_batch.py --data out/factbookqa --batch 192 --repeats 7 --tokenizer TOKENIZER_DIR
    python bench/bm25_batch.py --data out/worlds-mix/notes-out --batch 256 --repeats 7
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
    ap.add_argument("--data", type=Path, default=Path("out/factbookqa"),
                    help="corpus.jsonl, oracle.jsonl and train.jsonl")
    ap.add_argument("--batch", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", type=Path, help="also time the information blocks with this tokenizer")
    args = ap.parse_args()

    from dgpo_edge.fts import BM25Index
    from dgpo_edge.jsonio import read_jsonl
    from dgpo_edge.protocol import Passage

    passages = [Passage(str(r["id"]), r["contents"]) for _, r in read_jsonl(args.data / "corpus.jsonl")]
    kinds = {"oracle_searches": [q for _, r in read_jsonl(args.data / "oracle.jsonl")
                                 for q in SEARCH.findall(r["response"])],
             "questions": [r["question"] for _, r in read_jsonl(args.data / "train.jsonl")]}
    sqlite_only = BM25Index(passages, cache_size=0, postings=False)
    t0 = time.perf_counter()
    postings = BM25Index(passages, cache_size=0)
    postings.search("warm up", 3)   # builds the postings
    result = {"data": str(args.data), "passages": len(passages), "batch": args.batch, "repeats": args.repeats,
              "postings_build_s": round(time.perf_counter() - t0, 3), "median_s": {}}
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    rng = random.Random(args.seed)
    for kind, queries in kinds.items():
        batches = [rng.sample(queries, min(args.batch, len(queries))) for _ in range(args.repeats)]
        times = {name: [] for name in ("sqlite", "postings")}
        for b in batches:
            answers = []
            for name, index in (("sqlite", sqlite_only), ("postings", postings)):
                t0 = time.perf_counter()
                answers.append(index.search_many(b, 3))
                times[name].append(time.perf_counter() - t0)
            assert answers[0] == answers[1], f"{kind}: the postings rank differently from SQLite"
            if tokenizer is not None:
                _time_blocks(tokenizer, answers[1], times)
        result["median_s"][kind] = {name: round(statistics.median(t), 4) for name, t in times.items()}
        result["median_s"][kind]["speedup"] = round(result["median_s"][kind]["sqlite"]
                                                    / max(result["median_s"][kind]["postings"], 1e-9), 1)
    print(json.dumps(result, indent=1))


def _time_blocks(tokenizer, results: list, times: dict) -> None:
    """The batch's observations (block text and ids): from a fresh memory one at a time (as an
    episode alone does), from a fresh memory as one round (fitted by `prefetch` and encoded in
    batch calls, as RL rollouts do), and again from that memory (an RL run's next epoch)."""
    from dgpo_edge import protocol
    from dgpo_edge.train.rollout import observation_blocks
    from dgpo_edge.transcript import encoder_for

    batched = observation_blocks(tokenizer)
    if batched.encode_many is None:
        raise SystemExit("error: this tokenizer has no batch encoder that counts as the episodes do")
    alone = protocol.InformationBlocks(batched.count_tokens)
    plain = encoder_for(tokenizer).plain
    built = []
    for name in ("blocks_fresh", "blocks_fresh_batched", "blocks_remembered"):
        t0 = time.perf_counter()
        if name == "blocks_fresh":
            texts = [alone(passages, 500) for passages in results]
            ids = [plain(t) for t in texts]
        else:
            texts = batched.many(results, 500)
            ids = batched.encode_many(texts)
        times.setdefault(name, []).append(time.perf_counter() - t0)
        built.append((texts, ids))
    assert built[0] == built[1] == built[2]
    assert built[0][0] == [protocol.information_block(p, 500, batched.count_tokens) for p in results]


if __name__ == "__main__":
    main()
