"""Which retriever the laptop student should search with: EM per index kind, same student, same questions.

One hybrid index folder (`dgpo-edge index build CORPUS --kind hybrid`) holds both the MiniLM
IVF-PQ vectors and the BM25 tables, so the three kinds read the same passages: `bm25` (what the
shipped student was trained with), `dense` (the vectors alone) and `hybrid` (both, fused by
reciprocal rank). The agent is the bundle's (its model and protocol limits) with only the
retriever swapped; each kind's predictions go to OUT/KIND (resumable, like `dgpo-edge eval`).

    dgpo-edge index build out/factbookqa --kind hybrid --out out/dense/hybrid
    python bench/retriever_choice.py --bundle ~/.cache/dgpo-edge/default-bundle \
        --model student-q8_0.gguf --index out/dense/hybrid --data out/factbookqa/test.jsonl \
        --limit 100 --threads 1 --out out/retriever-choice --json bench/results/retriever_choice.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import provenance  # noqa: E402

KINDS = ("bm25", "dense", "hybrid")


def run_kind(args: argparse.Namespace, kind: str) -> dict:
    from dgpo_edge.agent.evaluate import evaluate, load_questions
    from dgpo_edge.bundle import load_agent
    from dgpo_edge.retrieval.retrievers import open_index

    questions = load_questions([args.data], limit=args.limit)
    agent = load_agent(bundle=args.bundle, model=args.model, threads=args.threads, progress=False)
    bundled, agent.retriever = agent.retriever, open_index(args.index, threads=args.threads, kind=kind)
    bundled.close()
    with agent:
        report = evaluate(agent, questions, args.out / kind,
                          settings={"agent": {"model": str(args.model), "index": str(args.index), "kind": kind}})
    return {"kind": kind, "n": report["n"], **_summary(args.out / kind / "predictions.jsonl")}


def _summary(predictions: Path) -> dict:
    from dgpo_edge.jsonio import read_jsonl

    rows = [r for _, r in read_jsonl(predictions)]
    mean = lambda key: round(statistics.mean(float(r[key]) for r in rows), 4)  # noqa: E731
    return {"em": mean("em"), "hit": mean("hit"), "searches": mean("searches"),
            "s_per_question_median": round(statistics.median(r["seconds"] for r in rows), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--index", type=Path, required=True, help="a hybrid index folder")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--json", type=Path, help="write {card, commit, rows} here")
    p.add_argument("--card", default="2-core x86-64 CPU")
    args = p.parse_args()
    rows = [run_kind(args, kind) for kind in args.kinds.split(",")]
    result = {"card": args.card, "commit": provenance.commit(), "model": args.model.name, "data": str(args.data),
              "limit": args.limit, "threads": args.threads, "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
