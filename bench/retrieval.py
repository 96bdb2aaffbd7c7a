"""Retrieval benchmark on FactbookQA: compact indexes against Flat, BM25, hybrid, speed, server.

    .venv/bin/python bench/retrieval.py --factbook out/factbookqa --work out/bench-retrieval

Builds (once, then reuses) a Flat MiniLM-int8 index of the FactbookQA corpus
with `dgpo-edge`'s own index builder, then rebuilds IVF-PQ variants from the
Flat vectors and compares every retriever on the dev + test questions:

- recall@1/3/10 against Flat's top-k (neighbour recall);
- gold-answer hit ratio in the top 3 (a gold alias occurs in a retrieved
  passage; `arc.gold_in_passages`) and evidence hit (a gold passage in the top 3);
- bytes per passage: vectors (+ store) against Flat + jsonl;
- single-query latency p50/p95 at 1 and 2 threads, encoding and search apart
  (median over `--repeats` runs);
- passages embedded per second (from the Flat build; first build only);
- the Search-R1 server under concurrent clients (p50/p99, errors);
- a projection to wiki-18's 21,015,324 passages.

Results go to WORK/results.json and a markdown summary to stdout (pasted into
docs/benchmarks.md with the machine, date and command).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from dgpo_edge.arc import gold_in_passages
from dgpo_edge.jsonio import read_jsonl, write_json
from dgpo_edge.retrieval import dense
from dgpo_edge.retrieval.build import build_index
from dgpo_edge.retrieval.encoders import load_encoder
from dgpo_edge.retrieval.retrievers import DenseRetriever, rrf
from dgpo_edge.retrieval.store import PassageStore

WIKI18 = 21_015_324
K = 10


def main() -> None:
    args = parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    factbook = ensure_factbook(Path(args.factbook))
    flat_dir, embed_rate = ensure_flat(factbook, work / "flat", args.build_threads)
    store = PassageStore(flat_dir / "store.sqlite")
    flat = dense.read_index(flat_dir / "vectors.faiss")
    vectors = flat.reconstruct_n(0, flat.ntotal)
    questions = load_questions(factbook)
    encoder = load_encoder("minilm-int8", threads=args.build_threads)
    t0 = time.perf_counter()
    qv = encoder.encode_queries([q["question"] for q in questions], batch_size=64)
    query_rate = len(questions) / (time.perf_counter() - t0)
    _, truth = flat.search(qv, K)

    results = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
               "passages": len(store), "questions": len(questions),
               "passages_per_s_embedded": embed_rate, "queries_per_s_batched": round(query_rate, 1),
               "rows": []}
    jsonl_bytes = (factbook / "corpus.jsonl").stat().st_size
    store_plain = plain_store_bytes(store, work)
    flat_bytes = (flat_dir / "vectors.faiss").stat().st_size
    base = {"flat_bytes": flat_bytes, "jsonl_bytes": jsonl_bytes, "store_bytes_fts": store.bytes(),
            "store_bytes_plain": store_plain}
    results["bytes"] = base

    rows = results["rows"]
    rows.append(evaluate("Flat (exact)", truth, truth, questions, store, flat_bytes, base))
    indexes = {}
    for label, plan in ivfpq_plans(len(store), vectors.shape[1], args.configs):
        index, nbytes = build_ivfpq(vectors, plan, args.build_threads)
        indexes[label] = index
        for nprobe in sorted({plan.nprobe, *args.nprobe}):
            dense.set_nprobe(index, nprobe)
            _, ids = index.search(qv, K)
            rows.append(evaluate(f"{label} nprobe={nprobe}", ids, truth, questions, store, nbytes, base))
        dense.set_nprobe(index, plan.nprobe)
    bm25_ids = bm25_search(store, questions)
    rows.append(evaluate("BM25 (FTS5)", bm25_ids, truth, questions, store, 0, base))
    default_label = next(iter(indexes))
    hybrid_ids = hybrid_search(indexes[default_label], qv, bm25_ids)
    rows.append(evaluate(f"hybrid RRF ({default_label} + BM25)", hybrid_ids, truth, questions, store,
                         0, base))

    if args.quality_only:
        print(markdown_rows(results))
        return
    results["embed_passages_per_s"] = embed_rates(store, args)
    results["latency"] = latency(store, indexes[default_label], flat, questions, args)
    results["server"] = server_load(store, indexes[default_label], questions, args)
    results["wiki18_projection"] = projection(args.wiki_sample, work, rows)
    write_json(work / "results.json", results)
    print(markdown(results))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--factbook", default="out/factbookqa", help="FactbookQA dir (built when missing)")
    p.add_argument("--work", default="out/bench-retrieval", help="where the Flat index and results go")
    p.add_argument("--configs", default="IVF,PQ48;IVF,PQ96;OPQ,IVF,PQ48;IVF64,PQ32;IVF64,PQ48;OPQ,IVF64,PQ32",
                   help="';'-separated: PQ code bytes, with OPQ when the item starts with OPQ")
    p.add_argument("--nprobe", default="4,64", help="extra nprobe values besides each plan's default")
    p.add_argument("--quality-only", action="store_true", help="skip latency, embedding and server runs")
    p.add_argument("--build-threads", type=int, default=2)
    p.add_argument("--latency-queries", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=25, help="requests per client")
    p.add_argument("--wiki-sample", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"
                                                 / "corpus" / "wiki18_sample_1000.jsonl"))
    args = p.parse_args()
    args.nprobe = [int(x) for x in args.nprobe.split(",") if x]
    return args


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''} {_cpus()} CPUs, {platform.system()}".strip()


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


# --- inputs ---------------------------------------------------------------------------------------

def ensure_factbook(path: Path) -> Path:
    if not (path / "corpus.jsonl").exists():
        from dgpo_edge.worlds.factbook.build import build_factbook

        print(f"building FactbookQA into {path}", file=sys.stderr)
        build_factbook(path)
    return path


def ensure_flat(factbook: Path, out: Path, threads: int) -> tuple[Path, float | None]:
    """The Flat index, built once; returns the embedding rate of that build (or the saved one)."""
    rate_file = out.parent / "embed_rate.json"
    if (out / "manifest.json").exists():
        saved = json.loads(rate_file.read_text()) if rate_file.exists() else {}
        return out, saved.get("passages_per_s")
    marks: dict[str, float] = {}

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage == "embed":
            marks.setdefault("start", time.perf_counter())
            marks["start_done"] = marks.get("start_done", done)
            marks["end"], marks["done"] = time.perf_counter(), done
            print(f"\rembedding {done}/{total}", end="", file=sys.stderr)

    build_index(factbook, out, kind="flat", threads=threads, progress=progress)
    print(file=sys.stderr)
    rate = (marks["done"] - marks["start_done"]) / max(marks["end"] - marks["start"], 1e-9)
    write_json(rate_file, {"passages_per_s": round(rate, 1), "threads": threads})
    return out, round(rate, 1)


def load_questions(factbook: Path) -> list[dict]:
    return [row for split in ("dev", "test") for _, row in read_jsonl(factbook / f"{split}.jsonl")]


def plain_store_bytes(store: PassageStore, work: Path) -> int:
    """Size of the same store without the BM25 index (what a dense-only bundle ships)."""
    path = work / "store-plain.sqlite"
    if not path.exists():
        PassageStore.build(path, store.iter_passages(), fts=False).close()
    return path.stat().st_size


# --- indexes and searches ---------------------------------------------------------------------------

def ivfpq_plans(n: int, dim: int, configs: str):
    """Items like "IVF,PQ48" (default nlist), "IVF64,PQ32" or "OPQ,IVF64,PQ48"."""
    for item in configs.split(";"):
        opq = item.startswith("OPQ")
        ivf = item.split("IVF", 1)[1].split(",", 1)[0]
        code = int(item.rsplit("PQ", 1)[1])
        plan = dense.plan_index("ivfpq", dim, n, nlist=int(ivf) if ivf else None, pq=code, opq=opq)
        yield plan.factory, plan


def build_ivfpq(vectors: np.ndarray, plan: dense.IndexPlan, threads: int):
    train = vectors[dense.sample_rows(len(vectors), plan.train_points)]
    index = dense.train_and_add([vectors], plan, vectors.shape[1], train=train, threads=threads)
    with tempfile.TemporaryDirectory() as tmp:
        dense.write_index(index, Path(tmp) / "x.faiss")
        nbytes = (Path(tmp) / "x.faiss").stat().st_size
    return index, nbytes


def bm25_search(store: PassageStore, questions: list[dict]) -> np.ndarray:
    ids = np.full((len(questions), K), -1, dtype=np.int64)
    row_of = {}
    for i, q in enumerate(questions):
        for j, p in enumerate(store.bm25(q["question"], K)):
            ids[i, j] = row_of.setdefault(p.id, int(p.id))  # FactbookQA ids are row numbers
    return ids


def hybrid_search(index, qv: np.ndarray, bm25_ids: np.ndarray) -> np.ndarray:
    from dgpo_edge.protocol import Passage

    _, dense_ids = index.search(qv, 50)
    out = np.full((len(qv), K), -1, dtype=np.int64)
    for i in range(len(qv)):
        lists = [[Passage(str(r), "") for r in row if r >= 0] for row in (dense_ids[i], bm25_ids[i])]
        fused = rrf(lists, K)
        out[i, :len(fused)] = [int(p.id) for p in fused]
    return out


# --- quality ------------------------------------------------------------------------------------------

def evaluate(label, ids, truth, questions, store, index_bytes, base) -> dict:
    recall = {f"recall@{k}": round(float(np.mean([len(set(ids[i, :k]) & set(truth[i, :k])) / k
                                                   for i in range(len(ids))])), 4) for k in (1, 3, 10)}
    hits, evidence = [], []
    for i, q in enumerate(questions):
        top = [int(r) for r in ids[i, :3] if r >= 0]
        hits.append(gold_in_passages(q["golden_answers"], store.get_rows(top)))
        evidence.append(bool(set(map(str, top)) & set(q["evidence"])))
    row = {"retriever": label, **recall, "gold_hit@3": round(float(np.mean(hits)), 4),
           "evidence_hit@3": round(float(np.mean(evidence)), 4), "index_bytes": index_bytes}
    if index_bytes:
        row["vector_compression"] = round(base["flat_bytes"] / index_bytes, 1)
        row["bytes_per_passage"] = round((index_bytes + base["store_bytes_plain"]) / len(store), 1)
    return row


# --- speed ------------------------------------------------------------------------------------------

def latency(store, index, flat, questions, args) -> dict:
    """Single-query p50/p95 (ms), encode and search apart, median over repeats."""
    qs = [q["question"] for q in questions[: args.latency_queries]]
    out = {}
    for threads in (1, 2):
        enc = load_encoder("minilm-int8", threads=threads)
        enc.encode_queries(qs[:5])  # warm-up
        runs = {"encode": [], "ivfpq_search": [], "flat_search": [], "bm25": []}
        for _ in range(args.repeats):
            t = {key: [] for key in runs}
            for q in qs:
                t0 = time.perf_counter()
                v = enc.encode_queries([q])
                t1 = time.perf_counter()
                with dense.faiss_threads(threads):
                    index.search(v, 3)
                    t2 = time.perf_counter()
                    flat.search(v, 3)
                    t3 = time.perf_counter()
                store.bm25(q, 3)
                t4 = time.perf_counter()
                for key, (a, b) in zip(runs, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
                    t[key].append((b - a) * 1000)
            for key in runs:
                runs[key].append(_pcts(t[key]))
        out[f"{threads}_threads"] = {key: {p: round(statistics.median(r[p] for r in rs), 3)
                                           for p in ("p50", "p95")} for key, rs in runs.items()}
    return out


def embed_rates(store, args, n: int = 300) -> dict:
    """Passages embedded per second (int8 MiniLM, batch 32), median over repeats, at 1 and 2 threads."""
    texts = [p.contents for p in store.get_rows(list(range(0, len(store), max(1, len(store) // n))))][:n]
    out = {}
    for threads in (1, 2):
        enc = load_encoder("minilm-int8", threads=threads)
        enc.encode_passages(texts[:8])  # warm-up
        rates = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            enc.encode_passages(texts, batch_size=32)
            rates.append(len(texts) / (time.perf_counter() - t0))
        out[f"{threads}_threads"] = round(statistics.median(rates), 1)
    return out


def _pcts(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"p50": ms[len(ms) // 2], "p95": ms[min(len(ms) - 1, int(len(ms) * 0.95))],
            "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))]}


def server_load(store, index, questions, args) -> dict:
    """N concurrent clients against `index serve`'s server on loopback, one query per request."""
    from dgpo_edge.retrieval.http import HttpRetriever
    from dgpo_edge.retrieval.server import make_server

    retriever = DenseRetriever(store, index, load_encoder("minilm-int8", threads=2))
    server = make_server(retriever, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    latencies, errors, lock = [], [], threading.Lock()

    def client(c: int) -> None:
        http = HttpRetriever(server.url)
        for r in range(args.requests):
            q = questions[(c * args.requests + r) % len(questions)]["question"]
            t0 = time.perf_counter()
            try:
                got = http.search([q], 3)
                ok = len(got) == 1 and len(got[0]) == 3
            except Exception as e:  # noqa: BLE001 - every failure counts as an error
                ok, got = False, e
            with lock:
                latencies.append((time.perf_counter() - t0) * 1000)
                if not ok:
                    errors.append(repr(got)[:200])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    server.shutdown()
    server.server_close()
    p = _pcts(latencies)
    return {"clients": args.clients, "requests": len(latencies), "errors": len(errors),
            "p50_ms": round(p["p50"], 1), "p99_ms": round(p["p99"], 1),
            "requests_per_s": round(len(latencies) / wall, 1), "first_errors": errors[:3]}


# --- wiki-18 ------------------------------------------------------------------------------------------

def projection(sample: str, work: Path, rows: list[dict]) -> dict:
    """Bytes for 21,015,324 wiki-18 passages: e5 768-d Flat + jsonl against IVF-PQ64 + store.

    Store bytes per passage come from the real 1,000-passage wiki-18 sample
    (with and without BM25); IVF-PQ64 codes are 64 B + 8 B id per vector.
    """
    out = {"passages": WIKI18, "flat_bytes": WIKI18 * 768 * 4, "jsonl_bytes": 14 * 10**9}
    sample = Path(sample)
    if sample.exists():
        for fts in (False, True):
            path = work / f"wiki-sample-{'fts' if fts else 'plain'}.sqlite"
            if not path.exists():
                from dgpo_edge.retrieval.corpus import iter_jsonl_corpus

                PassageStore.build(path, iter_jsonl_corpus(sample), fts=fts).close()
            per = path.stat().st_size / 1000
            out[f"store_bytes_{'fts' if fts else 'plain'}"] = int(per * WIKI18)
        out["jsonl_bytes_from_sample"] = int(sample.stat().st_size / 1000 * WIKI18)
    out["ivfpq64_bytes"] = WIKI18 * (64 + 8)
    if "store_bytes_plain" in out:
        out["ratio_plain"] = round((out["ivfpq64_bytes"] + out["store_bytes_plain"])
                                   / (out["flat_bytes"] + out["jsonl_bytes_from_sample"]), 4)
        out["ratio_fts"] = round((out["ivfpq64_bytes"] + out["store_bytes_fts"])
                                 / (out["flat_bytes"] + out["jsonl_bytes_from_sample"]), 4)
    return out


def markdown_rows(r: dict) -> str:
    flat_hit = r["rows"][0]["gold_hit@3"]
    lines = [f"Machine: {r['machine']}; date {r['date']}; {r['passages']:,} passages, "
             f"{r['questions']:,} dev+test questions.", "",
             "| retriever | recall@1 | recall@3 | recall@10 | gold hit@3 | ÷ Flat's | evidence hit@3 | "
             "vectors ÷ (file) | B/passage (vectors+store) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['retriever']} | {row['recall@1']:.3f} | {row['recall@3']:.3f} | "
                     f"{row['recall@10']:.3f} | {row['gold_hit@3']:.3f} | {row['gold_hit@3'] / flat_hit:.3f} | "
                     f"{row['evidence_hit@3']:.3f} | {row.get('vector_compression', '')} | "
                     f"{row.get('bytes_per_passage', '')} |")
    return "\n".join(lines)


def markdown(r: dict) -> str:
    lines = [markdown_rows(r)]
    b = r["bytes"]
    per = (b["flat_bytes"] + b["jsonl_bytes"]) / r["passages"]
    lines += ["", f"Flat {b['flat_bytes']:,} B + jsonl {b['jsonl_bytes']:,} B = {per:.1f} B/passage; store "
              f"{b['store_bytes_plain']:,} B without BM25, {b['store_bytes_fts']:,} B with it.", "",
              "| single query, ms | threads | p50 | p95 |", "|---|---:|---:|---:|"]
    for t, parts in r["latency"].items():
        for key, v in parts.items():
            lines.append(f"| {key} | {t.split('_')[0]} | {v['p50']:.2f} | {v['p95']:.2f} |")
    s = r["server"]
    lines += ["", f"Embedding (int8 MiniLM, batch 32): {r['embed_passages_per_s']} passages/s; during the "
              f"Flat build {r['passages_per_s_embedded']}/s; queries batched: "
              f"{r['queries_per_s_batched']}/s.",
              f"Server: {s['clients']} clients, {s['requests']} requests, {s['errors']} errors, "
              f"p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, {s['requests_per_s']} req/s.",
              "", "wiki-18 projection: " + json.dumps(r["wiki18_projection"])]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
