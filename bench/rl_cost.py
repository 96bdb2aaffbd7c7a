"""Cost of DGPO steps at the paper's shape: a Qwen2.5-0.5B-shaped student (and critic) with a
Qwen2.5-3B-shaped teacher, random weights, the real Qwen tokenizer, 512 prompts per step.

    python bench/rl_cost.py prepare --tokenizer device/qwen2          # random checkpoints (once)
    python bench/rl_cost.py run --steps 2                             # one GPU
    accelerate launch --config_file train/configs/accelerate-ddp.yaml --num_processes 2 \
        bench/rl_cost.py run --steps 2 --tag 2gpu                     # rollouts split across ranks
    python bench/rl_cost.py report                                    # the markdown for docs/benchmarks.md

The defaults are the fastest settings measured at this shape, those of
train/configs/qwen2.5-3b-to-0.5b-dgpo.yaml: the rollout cache kept between turns (--no-reuse-cache:
every turn prefills the whole conversation again), no gradient checkpointing (50 GiB peak on one H200
since the LM head recomputes its logits; --checkpointing for less memory), --forward-batch 16
(fewer, larger no-grad passes; 0: the micro-batch) and compiled decoder layers (--no-compile: eager;
the first step pays the compilation).

Before and after the RL speed work, side by side on one card (`--variant before` decodes with the
training weights, the two-matmul attention and eager sampling, without the kept cache, and updates
with checkpointing and no-grad passes of one micro-batch, as the first version did; the
length-bucketed micro-batches, the unmasked forward passes and the recomputing LM head have no
switch), then the JSON of bench/results/rl_speed.json:

    python bench/rl_cost.py run --steps 2 --variant before --tag before
    python bench/rl_cost.py run --steps 2 --variant after --tag after
    python bench/rollout.py --tokenizer device/qwen2 --batch 512 --skip-generate --out rollout-b512.json
    python bench/rollout.py --tokenizer device/qwen2 --batch 256 --skip-generate --out rollout-b256.json
    python bench/rl_cost.py speed --rollout-json rollout-b512.json --standalone-json rollout-b256.json \
        --factbook-metrics runs/dgpo/metrics.csv --card "NVIDIA H200" --out bench/results/rl_speed.json

Random weights never answer, so every rollout fails (the teacher term applies to all of them:
the worst case for its cost) and every turn runs to its 500-token budget: 4 turns with feedback
plus a final one, up to the 4,096-token episode limit. Questions and the BM25 corpus are
FactbookQA's. The step-time split comes from the run's metrics.csv (time_rollout_s, time_logp_s,
time_critic_s, time_teacher_s, time_update_s); the last step is reported (the first also
captures the rollout engine's CUDA graphs).

`run` prints the run's summary as one JSON line on stdout (then, compiled as by default, dynamo's graph
counts as another); the trainer's plain progress lines (`train dgpo: step 1/2, reward 0.0000,
elapsed 0:02:51, eta 0:02:51`, one a step at this size; log.progress=false asks for them on a
terminal too, where the rich bar would vanish) go to stderr, so `run > summary.jsonl` keeps the
JSON alone.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]   # the installed package is used (dgpo_edge.train lives in train/)
sys.path.insert(0, str(ROOT / "bench"))
import provenance  # noqa: E402

STUDENT = {"layers": 24, "hidden": 896, "heads": 14, "kv_heads": 2, "intermediate": 4864}      # Qwen2.5-0.5B
TEACHER = {"layers": 36, "hidden": 2048, "heads": 16, "kv_heads": 2, "intermediate": 11008}    # Qwen2.5-3B
PHASES = ("rollout", "logp", "critic", "teacher", "update")


def prepare(args: argparse.Namespace) -> None:
    from dgpo_edge.train.models import random_qwen2

    for name, shape in (("student", STUDENT), ("teacher", TEACHER)):
        out = args.work / name
        if not (out / "config.json").is_file():
            random_qwen2(args.tokenizer, out, vocab_size=151936, seed=1 if name == "teacher" else 0, **shape)
            print(f"wrote {out}")


def run(args: argparse.Namespace) -> None:
    from dgpo_edge.train.models import quiet_transformers
    from dgpo_edge.train.rl.loop import run_rl
    from dgpo_edge.train.rl.config import RLConfig, validate_rl

    quiet_transformers()
    config = RLConfig(algorithm="dgpo")
    config.run.out_dir = str(args.work / f"run-{args.tag}")
    config.run.resume = False
    config.run.precision = "bf16"
    config.model.path = str(args.work / "student")
    config.model.gradient_checkpointing = args.checkpointing
    config.teacher.path = str(args.work / "teacher")
    config.data.train = str(args.data)
    config.data.retriever = str(args.retriever)
    config.rollout.prompts_per_step = args.prompts
    config.rollout.batch_size = args.batch_size
    config.ppo.mini_batch = min(256, args.prompts)   # the paper: 256 of 512
    config.ppo.micro_batch = args.micro_batch
    config.ppo.forward_batch = args.forward_batch
    config.ppo.compile = args.compile
    config.optim.steps = args.steps
    config.rollout.reuse_cache = args.reuse_cache
    config.log.tensorboard = False
    config.log.progress = False
    if args.variant == "before":   # and the update as it ran then: checkpointed, no-grad passes of a micro-batch
        config.model.gradient_checkpointing, config.ppo.forward_batch, config.ppo.compile = True, 0, False
        config.rollout.weights, config.rollout.attention, config.rollout.fused_sampling = "training", "matmul", False
        config.rollout.layers, config.rollout.lm_head = "model", "model"
        config.rollout.reuse_cache = False
    validate_rl(config, "bench/rl_cost.py")
    summary = run_rl(config)
    print(json.dumps(summary))
    if config.ppo.compile:   # how many graphs torch.compile made: a recompile storm shows here
        from torch._dynamo.utils import counters
        print(json.dumps({"dynamo_stats": dict(counters["stats"])}))


def report(args: argparse.Namespace) -> None:
    rows = []
    for run_dir in sorted(args.work.glob("run-*")):
        last = _last_row(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else None
        if last is None:
            print(f"skipped {run_dir.name}: no step finished")
            continue
        summary_file = run_dir / "summary.json"   # absent when the run was cut after a step
        summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        step = float(last["time_step_s"])
        # a cut run has no summary: its process count is unknown (None), its peak from the metrics
        rows.append({"run": run_dir.name, "processes": summary.get("processes"), "step": int(float(last["step"])),
                     "step_s": step,
                     **{p: float(last[f"time_{p}_s"] or 0) for p in PHASES},
                     "teacher_share_of_step": float(last["time_teacher_s"] or 0) / step,
                     "response_length": float(last["response_length"]),
                     "rollout_tokens_per_s": float(last["rollout_tokens_per_s"]),
                     "peak_mem_gb": summary.get("peak_mem_gb", float(last["peak_mem_gb"] or 0))})
    result = {"card": args.card, "commit": args.commit, "rows": rows}
    (args.work / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| run | processes | step (s) | rollout | old log-probs | critic | teacher | update | "
          "teacher share | generated tokens/rollout | rollout tokens/s | peak GPU memory (GiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['run']} | {r['processes'] or '?'} | {r['step_s']:.1f} | " + " | ".join(f"{r[p]:.1f}" for p in PHASES)
              + f" | {r['teacher_share_of_step']:.1%} | {r['response_length']:.0f} | "
              f"{r['rollout_tokens_per_s']:,.0f} | {r['peak_mem_gb']:.1f} |")


def _last_row(metrics: Path) -> dict | None:
    """The last step's row of a metrics.csv, None when no step was written (a header alone)."""
    with open(metrics, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def speed(args: argparse.Namespace) -> None:
    """bench/results/rl_speed.json from the before/after runs, bench/rollout.py JSONs (at batch 512,
    and at the RL run's own rollout batch for the in-RL ratio) and a FactbookQA DGPO run's
    metrics.csv (median step time over its steps after the first, which captures the CUDA graphs)."""
    import statistics

    before, after = (_last_row(args.work / f"run-{t}" / "metrics.csv") for t in ("before", "after"))
    if before is None or after is None:
        raise SystemExit(f"error: {args.work}/run-before and run-after each need a finished step")
    b512 = json.loads(args.rollout_json.read_text())
    same_batch = json.loads((args.standalone_json or args.rollout_json).read_text())
    commit = args.commit or provenance.commit()
    in_rl = float(after["rollout_tokens_per_s"])
    standalone = same_batch["qwen2.5-0.5b"]["fast_sampled"]["tokens_per_s"]
    factbook = None
    if args.factbook_metrics:
        with open(args.factbook_metrics, newline="") as f:
            steps = [float(r["time_step_s"]) for r in csv.DictReader(f)][1:]
        factbook = statistics.median(steps) if steps else None
    result = {
        "card": args.card,
        "commit": commit,
        "paper_step_s_before": float(before["time_step_s"]),
        "paper_step_s_after": float(after["time_step_s"]),
        "rollout_tok_s_in_rl": in_rl,
        "engine_tok_s_standalone": standalone,
        "engine_standalone_batch": same_batch["batch"],
        "rollout_in_rl_vs_standalone": round(in_rl / standalone, 3),
        "engine_b512_sampled_tok_s": b512["qwen2.5-0.5b"]["fast_sampled"]["tokens_per_s"] if b512["batch"] == 512 else None,
        "engine_b512_sampled_tok_s_before": (b512["qwen2.5-0.5b"].get("fast_sampled_before") or {}).get("tokens_per_s"),
        "factbook_step_s": factbook,
        "phases_before": {p: float(before[f"time_{p}_s"] or 0) for p in PHASES},
        "phases_after": {p: float(after[f"time_{p}_s"] or 0) for p in PHASES},
    }
    result["speedup"] = round(result["paper_step_s_before"] / result["paper_step_s_after"], 2)
    # Earlier measurements kept in the file as blocks (each with its own commit) stay; top-level
    # fields and notes of the run this one replaces do not.
    old = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result.update({k: v for k, v in old.items() if isinstance(v, dict) and "commit" in v})
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("prepare", "run", "report", "speed"))
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "bench-rl-cost")
    ap.add_argument("--tokenizer", type=Path, default=ROOT / "device" / "qwen2")
    ap.add_argument("--data", type=Path, default=ROOT / "out" / "factbookqa" / "train.jsonl")
    ap.add_argument("--retriever", type=Path, default=ROOT / "out" / "factbookqa" / "corpus.jsonl")
    ap.add_argument("--prompts", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=256, help="episodes decoded together (per process)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="ppo.compile: the actor's, critic's and teacher's decoder layers through torch.compile "
                         "(on by default, as in the paper config)")
    ap.add_argument("--forward-batch", type=int, default=16, help="rows per no-grad pass (ppo.forward_batch; 0: micro-batch)")
    ap.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=False,
                    help="gradient checkpointing (less memory, a recomputed forward; off by default)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--reuse-cache", action=argparse.BooleanOptionalAction, default=True,
                    help="keep the rollout engine's cache between an episode's turns (rollout.reuse_cache, "
                         "the default; --no-reuse-cache prefills the whole conversation every turn)")
    ap.add_argument("--tag", default="1gpu")
    ap.add_argument("--variant", choices=("before", "after"), default="after",
                    help="before: the first version's rollouts (training weights, matmul attention, eager sampling, "
                         "no kept cache) and update (checkpointed, --forward-batch 0, --no-compile)")
    ap.add_argument("--rollout-json", type=Path, help="speed: bench/rollout.py's output at --batch 512")
    ap.add_argument("--standalone-json", type=Path,
                    help="speed: bench/rollout.py's output at the RL run's rollout batch (--batch-size; default: --rollout-json)")
    ap.add_argument("--commit", default="", help="report, speed: the commit that ran (speed's default: this checkout's HEAD)")
    ap.add_argument("--factbook-metrics", type=Path, help="speed: metrics.csv of a FactbookQA DGPO run")
    ap.add_argument("--card", default="", help="report, speed: the GPU, as nvidia-smi names it")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rl_speed.json")
    args = ap.parse_args()
    {"prepare": prepare, "run": run, "report": report, "speed": speed}[args.what](args)


if __name__ == "__main__":
    main()
