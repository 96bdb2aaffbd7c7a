"""Greedy multi-turn EM of trained checkpoints on whole FactbookQA splits, or any world's (GPU).

For each model and split: EM, F1, EM per question type and per hop count, ARC (hit ratio,
search steps, invalid-action rate), the parameter count, and the per-question EM in file order
(so two rows can be compared question by question: the paired bootstrap in bench/table1.py).
Rows are appended to a JSONL file; a (model name, split) already there is skipped, so a cut
call resumes. A model that cannot be loaded or evaluated is named on stderr and the others are
still evaluated; the exit status is then 1.

    python bench/factbook_eval.py --data out/factbookqa --out out/eval/rows.jsonl \
        --model teacher=out/runs/factbook-teacher-sft/checkpoints/best \
        --model kd=out/runs/factbook-kd/checkpoints/best --splits dev,test

Rollouts: BM25 over the corpus (the retriever training uses), top-3, 4 searches, 128 new
tokens per turn (the FactbookQA configs' evaluation limits), the fast decoder when it applies.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--data", default="out/factbookqa", help="a world or mixture folder: corpus.jsonl + SPLIT.jsonl")
    p.add_argument("--splits", default="dev,test")
    p.add_argument("--out", required=True, help="rows .jsonl (appended; finished rows skipped)")
    p.add_argument("--limit", type=int, default=None, help="first N questions of each split")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--max-turn-tokens", type=int, default=128)
    p.add_argument("--card", default="", help="recorded in each row (e.g. 'H100 80GB')")
    p.add_argument("--commit", default="", help="recorded in each row")
    return p.parse_args()


def done_rows(out: Path) -> set[tuple[str, str]]:
    if not out.exists():
        return set()
    from dgpo_edge.jsonio import read_jsonl

    return {(row["method"], row["split"]) for _, row in read_jsonl(out)}


def evaluate(model, tokenizer, examples, retriever, args) -> dict:
    from dgpo_edge.protocol import ProtocolConfig
    from dgpo_edge.train.evaluation import evaluate_split
    from dgpo_edge.train.rollout import RolloutConfig

    config = RolloutConfig(protocol=ProtocolConfig(max_turn_tokens=args.max_turn_tokens), greedy=True,
                           batch_size=args.batch_size, engine="auto")
    return evaluate_split(model, tokenizer, examples, retriever, config)


def evaluate_model(name: str, path: str, splits: list[str], data: Path, out: Path, retriever, args) -> None:
    """One model's rows, each appended (one line, one write) as soon as its split is done."""
    import torch

    from dgpo_edge.datasets import read_qa
    from dgpo_edge.train.models import load_lm

    model, tokenizer = load_lm(path)
    model.to("cuda" if torch.cuda.is_available() else "cpu").to(torch.bfloat16)
    for split in splits:
        examples = read_qa(str(data / f"{split}.jsonl"), limit=args.limit)
        row = {"method": name, "split": split, "model": path, "card": args.card, "commit": args.commit}
        row.update(evaluate(model, tokenizer, examples, retriever, args))
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{name} {split}: EM {row['em']:.3f} (n={row['n']}) by type {row['em_by_type']} "
              f"hit {row['hit_ratio']:.3f} searches {row['search_steps']:.2f} {row['seconds']} s", flush=True)


def main() -> None:
    args = parse_args()
    import torch

    from dgpo_edge.train.evaluation import open_retriever

    data, out = Path(args.data), Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_rows(out)
    retriever = open_retriever(str(data / "corpus.jsonl"))
    splits = [s for s in args.splits.split(",") if s]
    failed = []
    for spec in args.model:
        name, _, path = spec.partition("=")
        todo = [s for s in splits if (name, s) not in done]
        if not todo:
            continue
        try:
            evaluate_model(name, path, todo, data, out, retriever, args)
        except Exception as e:  # noqa: BLE001 - one bad checkpoint (or an OOM) must not cost the others their rows
            print(f"error: {name}: {path}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            failed.append(name)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if failed:
        sys.exit(f"not evaluated: {', '.join(failed)} (the others' rows are in {out})")


if __name__ == "__main__":
    main()
