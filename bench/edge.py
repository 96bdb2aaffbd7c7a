"""Edge agent benchmark: decode speed, KV reuse, latency, memory, EM and ARC of the base model.

    .venv/bin/python bench/edge.py --limit 60 --naive-limit 20 --threads 2 --out out/bench-edge

Uses the default bundle (built on first use: SmolLM2-135M-Instruct Q4_1 + FactbookQA, int8 MiniLM
IVF-PQ) or `--bundle B`; questions from the bundle's `data/dev.jsonl` or `--data FILE`. Parts:

1. agent: the first `--limit` dev questions through `dgpo_edge.agent.evaluate` (greedy): EM, F1,
   cover-EM, ARC figures, seconds per question p50/p95, prompt tokens evaluated / final transcript
   length per question, the agent's own decode tokens/s, and peak RSS of this process at that
   point (the agent alone is loaded then).
2. naive: the first `--naive-limit` questions again with an agent whose engine forgets its KV cache
   before every turn (re-prompting, what an agent without cache reuse does): seconds per question and
   prompt tokens, against the cached agent's on the same questions.
3. decode: side by side in one process, raw llama-cpp-python (`Llama.generate`, greedy) and the
   agent's engine (`LlamaCppEngine.generate`) continue the same contexts (prompts of part 1's
   questions) by `--decode-tokens` tokens each, ignoring EOS and stop strings, alternating raw and
   engine `--repeats` times; tokens/s = tokens / time after the prompt was evaluated.

Results go to OUT/results.json; the markdown for docs/benchmarks.md is printed.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dgpo_edge.agent import Agent  # noqa: E402
from dgpo_edge.agent.evaluate import evaluate, load_questions, run_one  # noqa: E402
from dgpo_edge.bundle import ensure_default_bundle, open_bundle  # noqa: E402
from dgpo_edge.bundle.loader import load_agent  # noqa: E402
from dgpo_edge.engines.llama_cpp import LlamaCppEngine  # noqa: E402
from dgpo_edge.jsonio import read_jsonl  # noqa: E402


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class NaiveEngine(LlamaCppEngine):
    """Re-prompts every turn: the cache is dropped before each call."""

    def generate(self, ids, max_new_tokens, sampling=None, stop=None):  # type: ignore[override]
        self.reset()
        return super().generate(ids, max_new_tokens, *(() if sampling is None else (sampling,)), stop=stop)


def part_agent(bundle: Any, data: Path, limit: int, threads: int, out: Path) -> dict[str, Any]:
    agent = load_agent(bundle=bundle.path, threads=threads, progress=False)
    questions = load_questions([data], limit=limit)
    t0 = time.perf_counter()
    report = evaluate(agent, questions, out / "agent", overwrite=True,
                      on_record=lambda r, d, n: print(f"  agent {d}/{n} em={r['em']:.0f} {r['seconds']:.1f}s "
                                                      f"{r['stop_reason']}", flush=True))
    wall = time.perf_counter() - t0
    rss = peak_rss_mib()
    recs = [rec for _, rec in read_jsonl(out / "agent" / "predictions.jsonl")]
    ratios = [r["prompt_tokens"] / r["transcript_tokens"] for r in recs if r["transcript_tokens"]]
    new = sum(r["new_tokens"] for r in recs)
    dec = sum(r["decode_s"] for r in recs)
    agent.close()
    return {"n": len(recs), "wall_s": wall, "peak_rss_mib": rss, "report": report,
            "prompt_over_transcript": {"mean": statistics.mean(ratios), "max": max(ratios),
                                       "total": sum(r["prompt_tokens"] for r in recs)
                                       / sum(r["transcript_tokens"] for r in recs)},
            "agent_decode_tok_s": new / dec if dec else 0.0,
            "records": [{k: r[k] for k in ("key", "seconds", "prompt_tokens", "transcript_tokens", "new_tokens",
                                           "em", "stop_reason")} for r in recs]}


def part_naive(bundle: Any, data: Path, limit: int, threads: int, cached: list[dict[str, Any]]) -> dict[str, Any]:
    from dgpo_edge.bundle.loader import bundle_encoder
    from dgpo_edge.retrieval.retrievers import open_index

    engine = NaiveEngine(bundle.model_path, n_ctx=4096, threads=threads)
    retriever = open_index(bundle.index_path, encoder=bundle_encoder(bundle, threads), threads=threads)
    agent = Agent(engine, retriever, bundle.protocol())
    questions = load_questions([data], limit=limit).examples
    recs = []
    for i, ex in enumerate(questions, 1):
        recs.append(run_one(agent, ex))
        print(f"  naive {i}/{len(questions)} {recs[-1]['seconds']:.1f}s", flush=True)
    agent.close()
    by_key = {r["key"]: r for r in cached}
    pairs = [(by_key[r["key"]], r) for r in recs if r["key"] in by_key]
    same = sum(1 for c, n in pairs if c["transcript_tokens"] == n["transcript_tokens"])
    c_s = sum(c["seconds"] for c, _ in pairs)
    n_s = sum(n["seconds"] for _, n in pairs)
    return {"n": len(pairs), "cached_s": c_s, "naive_s": n_s, "latency_ratio": n_s / c_s if c_s else 0.0,
            "cached_prompt_tokens": sum(c["prompt_tokens"] for c, _ in pairs),
            "naive_prompt_tokens": sum(n["prompt_tokens"] for _, n in pairs),
            "same_transcript_length": same,
            "cached_p50": statistics.median([c["seconds"] for c, _ in pairs]),
            "naive_p50": statistics.median([n["seconds"] for _, n in pairs])}


def part_replay(bundle: Any, data: Path, limit: int, threads: int) -> dict[str, Any]:
    """Same transcripts, cached vs re-prompting: each turn's context is evaluated (all of it, or only
    the part after the cache) and its generated ids are fed back one at a time (forced decoding, the
    cost of sampling them). Cached and naive alternate per question, so load changes hit both."""
    from dgpo_edge.bundle.loader import bundle_encoder
    from dgpo_edge.retrieval.retrievers import open_index

    engine = LlamaCppEngine(bundle.model_path, n_ctx=4096, threads=threads)
    retriever = open_index(bundle.index_path, encoder=bundle_encoder(bundle, threads), threads=threads)
    agent = Agent(engine, retriever, bundle.protocol())
    questions = load_questions([data], limit=limit).examples
    out = {"n": 0, "cached_s": 0.0, "naive_s": 0.0, "cached_prompt_tokens": 0, "naive_prompt_tokens": 0,
           "per_question": []}
    for i, ex in enumerate(questions, 1):
        t = agent.answer(ex.question).transcript
        turns: list[tuple[list[int], list[int]]] = []
        ids: list[int] = []
        for seg in t.segments:
            seg_ids = list(seg.token_ids) if seg.token_ids is not None else engine.encode(seg.text)
            if seg.kind == "turn":
                turns.append((list(ids), seg_ids))
            ids += seg_ids
        times = {}
        for mode in ("cached", "naive"):
            engine.reset()
            t0 = time.perf_counter()
            evaluated = 0
            for ctx, gen in turns:
                if mode == "naive":
                    engine.reset()
                n_eval, _ = engine._prefill(ctx)
                evaluated += n_eval
                for tok in gen:
                    engine._evaluate([tok])
                    engine._cache.append(tok)
            times[mode] = (time.perf_counter() - t0, evaluated)
        out["n"] += 1
        out["cached_s"] += times["cached"][0]
        out["naive_s"] += times["naive"][0]
        out["cached_prompt_tokens"] += times["cached"][1]
        out["naive_prompt_tokens"] += times["naive"][1]
        out["per_question"].append({"transcript_tokens": len(ids), "turns": len(turns), "cached_s": times["cached"][0],
                                    "naive_s": times["naive"][0]})
        print(f"  replay {i}/{len(questions)}: cached {times['cached'][0]:.1f}s, naive {times['naive'][0]:.1f}s",
              flush=True)
    agent.close()
    out["latency_ratio"] = out["naive_s"] / out["cached_s"] if out["cached_s"] else 0.0
    return out


def part_decode(bundle: Any, data: Path, n_contexts: int, tokens: int, repeats: int, threads: int) -> dict[str, Any]:
    import llama_cpp

    engine = LlamaCppEngine(bundle.model_path, n_ctx=4096, threads=threads)
    engine.eos_ids = frozenset()   # decode exactly `tokens` tokens
    raw = llama_cpp.Llama(model_path=str(bundle.model_path), n_ctx=4096, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    questions = load_questions([data], limit=n_contexts).examples
    contexts = [engine.encode(engine.render_prompt(q.question)) for q in questions]
    raw_rates: list[float] = []
    eng_rates: list[float] = []
    for rep in range(repeats):
        for ctx in contexts:
            # raw llama-cpp-python, greedy
            raw.reset()
            gen = raw.generate(ctx, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
            next(gen)                          # prompt evaluated, first token sampled
            t = time.perf_counter()
            for _ in range(tokens):
                next(gen)
            raw_rates.append(tokens / (time.perf_counter() - t))
            gen.close()
            # the agent's engine
            engine.reset()
            r = engine.generate(ctx, tokens + 1, stop=()).result
            eng_rates.append(r.new_tokens / r.decode_s)
        print(f"  decode repeat {rep + 1}/{repeats}: raw {statistics.median(raw_rates):.1f} tok/s, "
              f"engine {statistics.median(eng_rates):.1f} tok/s", flush=True)
    raw.close()
    engine.close()
    r_med, e_med = statistics.median(raw_rates), statistics.median(eng_rates)
    return {"contexts": len(contexts), "tokens": tokens, "repeats": repeats, "raw_tok_s_median": r_med,
            "engine_tok_s_median": e_med, "ratio": e_med / r_med, "raw_tok_s": raw_rates, "engine_tok_s": eng_rates}


def markdown(res: dict[str, Any]) -> str:
    a, n, d = res["agent"], res.get("naive"), res.get("decode")
    rep = a["report"]
    sc, arc = rep["scores"]["all"], rep["arc"]["all"]
    lines = [
        f"Questions: the first {a['n']} of FactbookQA dev (seed 0). Wall time of the agent part: {a['wall_s']:.0f} s.",
        "",
        "| figure | value | target |",
        "|---|---:|---:|",
    ]
    if d:
        lines.append(f"| decode tok/s, agent's engine ÷ raw llama-cpp-python (median of {len(d['raw_tok_s'])} runs "
                     f"of {d['tokens']} tokens) | {d['engine_tok_s_median']:.1f} ÷ {d['raw_tok_s_median']:.1f} = "
                     f"**{d['ratio']:.3f}** | ≥ 0.95 |")
    po = a["prompt_over_transcript"]
    lines += [
        f"| prompt tokens evaluated ÷ final transcript tokens, per question (mean / max) | "
        f"**{po['mean']:.3f}** / {po['max']:.3f} | ≤ 1.1 |",
    ]
    if n:
        lines.append(f"| latency, naive re-prompting agent ÷ cached agent ({n['n']} questions) | "
                     f"{n['naive_s']:.1f} s ÷ {n['cached_s']:.1f} s = **{n['latency_ratio']:.2f}×** | |")
        lines.append(f"| prompt tokens evaluated, naive ÷ cached | {n['naive_prompt_tokens']:,} ÷ "
                     f"{n['cached_prompt_tokens']:,} = {n['naive_prompt_tokens'] / max(1, n['cached_prompt_tokens']):.2f}× | |")
    s = rep["seconds"]
    lines += [
        f"| seconds per question p50 / p95 | {s['p50']:.2f} / {s['p95']:.2f} | |",
        f"| agent decode tok/s (all turns) | {a['agent_decode_tok_s']:.1f} | |",
        f"| peak RSS (agent loaded, after the run) | {a['peak_rss_mib']:.0f} MiB | |",
        f"| EM / F1 / cover-EM | {sc['em']:.3f} / {sc['f1']:.3f} / {sc['cover_em']:.3f} | |",
        f"| hit ratio / search steps / invalid-action rate / answered | {arc['hit_ratio']:.3f} / "
        f"{arc['search_steps']:.2f} / {arc['invalid_action_rate']:.3f} / {arc['answered_rate']:.3f} | |",
        "",
        "Stop reasons: " + ", ".join(f"{k} {v}" for k, v in rep["stop_reasons"].items()) + ".",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, help="bundle folder (default: the default bundle)")
    ap.add_argument("--data", type=Path, help="questions (default: the bundle's data/dev.jsonl)")
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--naive-limit", type=int, default=20)
    ap.add_argument("--decode-contexts", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="agent,naive,decode")
    ap.add_argument("--out", type=Path, default=Path("out/bench-edge"))
    args = ap.parse_args()
    bundle = open_bundle(args.bundle) if args.bundle else ensure_default_bundle(
        progress=lambda s, d, t: print(f"  building default bundle: {s} {d}/{t}", flush=True))
    data = args.data or bundle.path / "data" / "dev.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    res: dict[str, Any] = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                                       "cpus": __import__("os").cpu_count()},
                           "versions": bundle.manifest.get("versions"), "bundle": str(bundle.path),
                           "args": {k: str(v) for k, v in vars(args).items()},
                           "date": time.strftime("%Y-%m-%d")}
    if "agent" in parts:
        print("part 1: agent", flush=True)
        res["agent"] = part_agent(bundle, data, args.limit, args.threads, args.out)
    if "naive" in parts:
        print("part 2: naive agent", flush=True)
        res["naive"] = part_naive(bundle, data, args.naive_limit, args.threads, res["agent"]["records"])
    if "replay" in parts:
        print("part 2b: replayed transcripts, cached vs naive", flush=True)
        res["replay"] = part_replay(bundle, data, args.naive_limit, args.threads)
    if "decode" in parts:
        print("part 3: decode speed", flush=True)
        res["decode"] = part_decode(bundle, data, args.decode_contexts, args.decode_tokens, args.repeats, args.threads)
    (args.out / "results.json").write_text(json.dumps(res, indent=2))
    print()
    print(markdown(res) if "agent" in res else json.dumps(
        {part: {k: v for k, v in res[part].items() if not isinstance(v, list)}
         for part in ("replay", "decode") if part in res}, indent=2))


if __name__ == "__main__":
    main()
