"""The LM head's no-gradient log-prob pass (old log-probs, teacher, reference), before and after.

RL scores every generated token of a step under the actor, the teacher and the reference: per
chunk of `rows` positions it forms a [rows, vocabulary] float32 logit tensor, its log-sum-exp, and
the log-prob of each target. The first version also wrote z / T and log softmax(z) as two more
[rows, vocabulary] tensors; `HeadLogps` now divides in place (not at all at T = 1) and subtracts the
log-sum-exp at the targets only. Same float operations on the same numbers, so the same bits (checked
here and in tests/test_rl_head.py). This times both, side by side, at Qwen2.5's vocabulary:

    python bench/head_logps.py                                   # CPU, float32
    python bench/head_logps.py --device cuda --dtype bf16 --positions 65536 --rows 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from rollout import _import_train  # noqa: E402  (dgpo_edge.train from this checkout)


def before(hidden, weight, targets, temperature: float, rows: int, dtype):
    """The first version's chunk: z / T and log softmax(z) as whole tensors, then the gather."""
    import torch

    out = []
    for i in range(0, hidden.shape[0], rows):
        z = torch.nn.functional.linear(hidden[i:i + rows].to(dtype), weight).float() / temperature
        log_p = z - torch.logsumexp(z, dim=-1)[:, None]
        out.append(log_p.gather(-1, targets[i:i + rows, None])[:, 0])
    return torch.cat(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the logits' matmul dtype")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=512, help="positions per chunk (head_rows)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    _import_train()
    import torch

    from dgpo_edge.train.rl.models import HeadLogps

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.positions, args.hidden, generator=g).to(args.device, dtype)
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.05).to(args.device, dtype)
    targets = torch.randint(0, args.vocab, (args.positions,), generator=g).to(args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    runs = {
        "before": lambda: before(hidden, weight, targets, args.temperature, args.rows, dtype),
        "after": lambda: HeadLogps.apply(hidden, weight, targets, args.temperature, args.rows, False, dtype)[0],
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        same = torch.equal(runs["before"](), runs["after"]())
        for _ in range(args.repeats):   # alternating, after one warm-up call each above
            for name, fn in runs.items():
                sync()
                start = time.perf_counter()
                fn()
                sync()
                times[name].append(time.perf_counter() - start)
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    result = {"card": card, "commit": commit, "device": args.device, "dtype": args.dtype, "vocab": args.vocab,
              "positions": args.positions, "rows": args.rows, "temperature": args.temperature,
              "bitwise_equal": same, **{f"{k}_s": round(statistics.median(v), 4) for k, v in times.items()},
              "times": {k: [round(x, 4) for x in v] for k, v in times.items()}}
    result["speedup"] = round(result["before_s"] / result["after_s"], 2)
    print(json.dumps({k: v for k, v in result.items() if k != "times"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
