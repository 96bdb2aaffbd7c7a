"""Laptop EM against GPU EM, question by question, for the export formats of one student.

Reads `dgpo-edge eval --out DIR` folders (one per format, over the first N questions of a split)
and the GPU's per-question scores from bench/factbook_eval.py's rows, and reports per format:
EM on the laptop, EM on the GPU over the same questions, how many questions agree, file size
and seconds per question (median).

    for f in q8_0 f16 q4_0 q4_k_m; do
      dgpo-edge eval --bundle B --model student-$f.gguf --data B/data/test.jsonl --limit 100 \
          --threads 1 --out out/parity/$f
    done
    python bench/laptop_parity.py --gpu-rows bench/results/factbook_eval_rows.jsonl --method kd-lora-r32 \
        --split test --run q8_0=out/parity/q8_0:student-q8_0.gguf ... --card "2-core x86-64 CPU" \
        --commit "$(git rev-parse --short HEAD)" --out bench/results/laptop_parity.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from dgpo_edge.jsonio import read_jsonl


def gpu_scores(rows: Path, method: str, split: str) -> list[int]:
    for _, row in read_jsonl(rows):
        if row["method"] == method and row["split"] == split:
            return row["scores"]
    raise SystemExit(f"error: {rows}: no {split} row for {method!r}")


def model_bytes(model: Path) -> int:
    """A GGUF file's size, or an ONNX folder's: the sum of the files in it."""
    if model.is_dir():
        return sum(f.stat().st_size for f in model.rglob("*") if f.is_file())
    return model.stat().st_size


def parity_row(name: str, run: Path, model: Path | None, gpu: list[int]) -> dict:
    preds = [p for _, p in read_jsonl(run / "predictions.jsonl")]
    n = len(preds)
    laptop = [int(p["em"]) for p in preds]
    same = gpu[:n]
    return {"format": name, "n": n, "laptop_em": sum(laptop) / n, "gpu_em": sum(same) / n,
            "agree": sum(a == b for a, b in zip(laptop, same)) / n,
            "laptop_only": sum(a > b for a, b in zip(laptop, same)), "gpu_only": sum(b > a for a, b in zip(laptop, same)),
            "s_per_question_median": statistics.median(p["seconds"] for p in preds),
            "decode_tok_s": round(sum(p["new_tokens"] for p in preds) / sum(p["decode_s"] for p in preds), 1),
            "prompt_tok_s": round(sum(p["prompt_tokens"] for p in preds) / sum(p["prompt_s"] for p in preds), 1),
            "bytes": model_bytes(model) if model else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpu-rows", type=Path, required=True)
    p.add_argument("--method", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--run", action="append", required=True, metavar="NAME=EVAL_DIR[:MODEL]",
                   help="MODEL: a .gguf file or an ONNX folder (its size: the sum of its files)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--card", required=True, help="the laptop side's machine, e.g. '2-core x86-64 CPU'")
    p.add_argument("--commit", required=True, help="the commit the laptop evaluations ran at")
    p.add_argument("--note", default="")
    args = p.parse_args()
    gpu = gpu_scores(args.gpu_rows, args.method, args.split)
    rows = []
    for spec in args.run:
        name, _, rest = spec.partition("=")
        run, _, model = rest.partition(":")
        rows.append(parity_row(name, Path(run), Path(model) if model else None, gpu))
    args.out.write_text(json.dumps({"card": args.card, "commit": args.commit, "method": args.method,
                                    "split": args.split, "note": args.note, "rows": rows}, indent=1) + "\n",
                        encoding="utf-8")
    print("| format | size (MiB) | questions | laptop EM | GPU EM, same questions | agree | laptop only / GPU only | s per question (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        size = f"{r['bytes'] / 2**20:.1f}" if r["bytes"] else "–"
        print(f"| {r['format']} | {size} | {r['n']} | {r['laptop_em']:.3f} | {r['gpu_em']:.3f} | {r['agree']:.2f} | "
              f"{r['laptop_only']} / {r['gpu_only']} | {r['s_per_question_median']:.1f} |")


if __name__ == "__main__":
    main()
