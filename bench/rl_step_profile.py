"""Where one RL step spends its time: phases, GPU kernels and host-side Python.

Builds the trainer of `train ppo|dgpo|grpo` from a config (the same loading code), runs
`--warm` steps (graph capture, allocator and cache warm-up), then:

- `--steps` more steps, timed per phase as the trainer's metrics do (median of those steps);
- one step under torch.profiler: the top operators by self GPU time and by self CPU time;
- one step under cProfile: the host's Python functions by their own time and cumulatively
  (the rollout's turn loop, tokenization, searches and observations are not GPU operators).

Nothing is saved and no checkpoint is written; the steps advance the student as a run would.

    python bench/rl_step_profile.py dgpo --config train/configs/factbook-dgpo.yaml --out prof.json \
        model.path=out/models/kd-start-... teacher.path=... data.dev=null

Prints a summary and writes every number to `--out` (JSON).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys


def _op_rows(prof, key: str, limit: int) -> list[dict]:
    """The top `limit` operators of a torch.profiler run sorted by `key` (self time)."""
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:limit]
    return [{"op": e.key, "calls": e.count, "self_cuda_ms": round(getattr(e, "self_device_time_total", 0) / 1e3, 2),
             "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)} for e in rows]


def _python_rows(profile: cProfile.Profile, sort: str, limit: int) -> list[dict]:
    stats = pstats.Stats(profile)
    rows = []
    for (path, line, name), (_, calls, own, cum, _) in stats.stats.items():
        rows.append({"function": f"{path.rsplit('/', 2)[-1]}:{line}:{name}", "calls": calls,
                     "own_s": round(own, 4), "cumulative_s": round(cum, 4)})
    rows.sort(key=lambda r: r["own_s" if sort == "own" else "cumulative_s"], reverse=True)
    return rows[:limit]


def _next(trainer) -> dict:
    row = trainer.step()
    trainer.state.step += 1
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("algorithm", choices=("ppo", "dgpo", "grpo"))
    ap.add_argument("--config", required=True)
    ap.add_argument("--warm", type=int, default=2, help="steps before any timing")
    ap.add_argument("--steps", type=int, default=5, help="steps timed per phase (median)")
    ap.add_argument("--top", type=int, default=30, help="rows per table")
    ap.add_argument("--out", required=True, help="JSON file for every number")
    ap.add_argument("overrides", nargs="*", help="key=value, as `train` takes them")
    args = ap.parse_intermixed_args(argv)

    import torch

    from dgpo_edge.train.models import quiet_transformers
    from dgpo_edge.train.rl.config import load_rl_config
    from dgpo_edge.train.rl.loop import RLTrainer

    quiet_transformers()
    # The steps are called one by one, not through the trainer's run loop, so no progress bar is drawn.
    config = load_rl_config(args.algorithm, args.config, args.overrides)
    trainer = RLTrainer(config)
    for _ in range(args.warm):
        _next(trainer)
    rows = [_next(trainer) for _ in range(args.steps)]
    timed = sorted(k for k in rows[0] if k.startswith("time_"))
    phases = {k: round(statistics.median(r[k] for r in rows), 3) for k in timed}

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        profiled = _next(trainer)
    python = cProfile.Profile()
    python.enable()
    _next(trainer)
    python.disable()

    device_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    result = {
        "config": args.config, "overrides": args.overrides, "warm": args.warm, "steps": args.steps,
        "card": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "phases_median": phases, "step_rows": rows, "profiled_step": profiled,
        "gpu_ops": _op_rows(prof, device_key, args.top), "cpu_ops": _op_rows(prof, "self_cpu_time_total", args.top),
        "python_own": _python_rows(python, "own", args.top),
        "python_cumulative": _python_rows(python, "cumulative", args.top),
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print("phases (median s):", json.dumps(phases))
    print(prof.key_averages().table(sort_by=device_key, row_limit=args.top))
    text = io.StringIO()
    pstats.Stats(python, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
