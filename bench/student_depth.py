"""What a student's depth costs on the laptop: SmolLM2-135M cut to N of its 30 layers, as shipped (Q8_0 GGUF).

For each depth: `dgpo-edge model prune --keep-layers N` of the converted base, `export gguf --quant q8_0`,
then the agent's llama.cpp engine (`LlamaCppEngine`, as `ask` and `eval` run it) evaluates the prompts of
the first `--contexts` FactbookQA dev questions and decodes `--tokens` tokens after each, ignoring
stops, `--repeats` times. Speed does not depend on what the weights learned, so the pruned base stands in
for a trained student of that depth. Reported per depth: parameters, GGUF bytes, prompt tokens/s and
decode tokens/s (the median over runs of each run's median), peak RSS of a fresh process holding the model.

    python bench/student_depth.py --base out/models/smollm2-135m --depths 15,20,24,30 --threads 2 \
        --work out/bench-depth --out bench/results/student_depth.json

`--base`: the 30-layer SmolLM2 converted by `dgpo-edge model from-gguf`. Each depth's GGUF is kept in
WORK and reused by a rerun.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

DE = [sys.executable, "-m", "dgpo_edge"]


def build(base: Path, depth: int, work: Path) -> Path:
    """The depth-N student as a Q8_0 GGUF (pruned, exported; skipped when present)."""
    gguf = work / f"smollm2-{depth}l-q8_0.gguf"
    if gguf.exists():
        return gguf
    pruned = work / f"smollm2-{depth}l"
    if depth == 30:
        pruned = base
    elif not pruned.exists():
        subprocess.run([*DE, "model", "prune", str(base), "--keep-layers", str(depth), "--out", str(pruned)],
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*DE, "export", "gguf", str(pruned), "--out", str(gguf), "--quant", "q8_0", "--no-verify"],
                   check=True, stdout=subprocess.DEVNULL)
    return gguf


def params_of(gguf: Path) -> int:
    from gguf import GGUFReader

    return sum(int(t.n_elements) for t in GGUFReader(str(gguf)).tensors)


def measure(gguf: Path, args: argparse.Namespace) -> dict:
    """One run: this script with `--measure GGUF` in a fresh process (its peak RSS is the model's)."""
    cmd = [sys.executable, __file__, "--measure", str(gguf), "--data", str(args.data), "--contexts",
           str(args.contexts), "--tokens", str(args.tokens), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_here(gguf: Path, questions: list[str], tokens: int, repeats: int, threads: int) -> dict:
    """Prompt and decode tokens/s of the agent's engine (medians), in this process."""
    import resource

    from dgpo_edge.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(gguf, n_ctx=4096, threads=threads)
    engine.eos_ids = frozenset()   # decode exactly `tokens` tokens
    contexts = [engine.encode(engine.render_prompt(q)) for q in questions]
    prompt, decode = [], []
    for _ in range(repeats):
        for ctx in contexts:
            engine.reset()
            r = engine.generate(ctx, tokens + 1, stop=()).result
            prompt.append(len(ctx) / r.prompt_s)
            decode.append(r.new_tokens / r.decode_s)
    engine.close()
    return {"prompt_tok_s": statistics.median(prompt), "decode_tok_s": statistics.median(decode),
            "prompt_tokens": statistics.median(len(c) for c in contexts),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, help="the converted 30-layer SmolLM2 (model from-gguf)")
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)   # one run on this GGUF (a child process)
    ap.add_argument("--depths", default="15,20,24,30")
    ap.add_argument("--data", type=Path, default=Path("out/factbookqa/dev.jsonl"))
    ap.add_argument("--contexts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="fresh processes per depth (the median is reported)")
    ap.add_argument("--work", type=Path, default=Path("out/bench-depth"))
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from dgpo_edge.datasets import read_qa

    questions = [x.question for x in read_qa(str(args.data), limit=args.contexts)]
    if args.measure:
        print(json.dumps(measure_here(args.measure, questions, args.tokens, args.repeats, args.threads)))
        return
    if args.base is None:
        ap.error("--base is required")
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for depth in (int(d) for d in args.depths.split(",")):
        t0 = time.perf_counter()
        gguf = build(args.base, depth, args.work)
        runs = [measure(gguf, args) for _ in range(args.runs)]
        row = {"layers": depth, "params": params_of(gguf), "gguf_bytes": gguf.stat().st_size,
               **{key: statistics.median(r[key] for r in runs) for key in runs[0]},
               "decode_tok_s_runs": [round(r["decode_tok_s"], 1) for r in runs]}
        rows.append({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})
        print(f"{depth} layers: {row['params'] / 1e6:.1f} M params, decode {row['decode_tok_s']:.0f} tok/s, "
              f"prompt {row['prompt_tok_s']:.0f} tok/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    result = {"card": f"{cpu_name()}, {args.threads} threads",   # the device it ran on (here a CPU)
              "commit": args.commit, "tokens": args.tokens, "contexts": args.contexts, "repeats": args.repeats,
              "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("| layers | parameters | Q8_0 GGUF (MiB) | prompt tokens/s | decode tokens/s | peak RSS (MiB) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layers']} | {r['params'] / 1e6:.1f} M | {r['gguf_bytes'] / 2**20:.1f} | {r['prompt_tok_s']:,.0f} "
              f"| {r['decode_tok_s']:,.0f} | {r['peak_rss_mib']:,.0f} |")


if __name__ == "__main__":
    main()
