"""The LM head's log-prob passes (train/rl/models.py `HeadLogps`), the first version against today's.

RL scores every generated token of a step under the actor, the teacher and the reference: per
chunk of `rows` positions the head forms a [rows, vocabulary] float32 logit tensor, its log-sum-exp,
and the log-prob of each target. The first version also wrote z / T and log softmax(z) as two more
[rows, vocabulary] tensors; `HeadLogps` now divides in place (not at all at T = 1) and subtracts the
log-sum-exp at the targets only. The update's pass (--backward: entropies too, and the backward that
recomputes each chunk's logits) wrote a tensor per operation, eight of that size a chunk; it now
works in place, in two. Same float operations on the same numbers, so the same bits (checked on the
warm-up call here, and in tests/test_rl_head.py). This times both, alternating, at Qwen2.5's
vocabulary:

    python bench/head_logps.py                                   # scoring pass, CPU, float32
    python bench/head_logps.py --backward                        # the update's pass
    python bench/head_logps.py --device cuda --dtype bf16 --positions 65536 --rows 2048 [--backward]

The results record the commit from git, or from COMMIT where the checkout has none (a GPU machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import provenance  # noqa: E402
from rollout import _import_train  # noqa: E402  (dgpo_edge.train from this checkout)


def before_forward(hidden, weight, targets, temperature: float, rows: int, dtype, entropy: bool = False):
    """The first version's forward: z / T and log softmax(z) as whole tensors, then the gather
    (and the entropies: -sum p log p)."""
    import torch

    logps, ents = [], []
    for i in range(0, hidden.shape[0], rows):
        z = torch.nn.functional.linear(hidden[i:i + rows].to(dtype), weight).float() / temperature
        log_p = z - torch.logsumexp(z, dim=-1)[:, None]
        logps.append(log_p.gather(-1, targets[i:i + rows, None])[:, 0])
        if entropy:
            ents.append(-(torch.exp(log_p) * log_p).sum(-1))
    return torch.cat(logps), torch.cat(ents) if entropy else None


def before_backward(hidden, weight, targets, g_logp, g_ent, ent, temperature: float, rows: int, dtype):
    """The first version's backward, expression by expression (a tensor per operation), given the
    forward's entropies `ent`; g_ent None: no entropy term. Returns (grad of hidden, grad of weight)."""
    import torch

    w = weight.to(dtype)
    grad_h = torch.empty_like(hidden)
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    for i in range(0, hidden.shape[0], rows):
        h = hidden[i:i + rows].to(dtype)
        z = torch.nn.functional.linear(h, w).float() / temperature
        shifted = z - torch.logsumexp(z, dim=-1)[:, None]
        p = torch.exp(shifted)
        g1 = g_logp[i:i + rows, None]
        gz = -p * g1
        if g_ent is not None:
            gz -= p * (shifted + ent[i:i + rows, None]) * g_ent[i:i + rows, None]
        gz.scatter_add_(-1, targets[i:i + rows, None], g1)
        gz = (gz / temperature).to(dtype)
        grad_h[i:i + rows] = (gz @ w).to(hidden.dtype)
        grad_w += (gz.t() @ h).float()
    return grad_h, grad_w.to(weight.dtype)


def passes(args, hidden, weight, targets, dtype) -> dict:
    """name -> a call timing one variant: the scoring pass (no gradient, no entropy) or, with
    --backward, the update's (entropies, forward and backward)."""
    import torch

    from dgpo_edge.train.rl.models import HeadLogps

    T, rows = args.temperature, args.rows
    if not args.backward:
        @torch.no_grad()
        def scoring(first_version: bool):
            if first_version:
                return before_forward(hidden, weight, targets, T, rows, dtype)[:1]
            return HeadLogps.apply(hidden, weight, targets, T, rows, False, dtype)[:1]

        return {"before": lambda: scoring(True), "after": lambda: scoring(False)}
    g = torch.Generator().manual_seed(1)
    g_logp, g_ent = (torch.randn(hidden.shape[0], generator=g).to(hidden.device) for _ in range(2))

    def after():
        h, w = hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)
        logp, ent = HeadLogps.apply(h, w, targets, T, rows, True, dtype)
        ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
        return logp, ent, h.grad, w.grad

    def first_version():
        with torch.no_grad():
            logp, ent = before_forward(hidden, weight, targets, T, rows, dtype, entropy=True)
            return (logp, ent, *before_backward(hidden, weight, targets, g_logp, g_ent, ent, T, rows, dtype))

    return {"before": first_version, "after": after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="the logits' matmul dtype")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=512, help="positions per chunk (head_rows)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--backward", action="store_true",
                    help="the update's pass instead: entropies too, forward and backward")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    _import_train()
    import torch

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.positions, args.hidden, generator=g).to(args.device, dtype)
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.05).to(args.device, dtype)
    targets = torch.randint(0, args.vocab, (args.positions,), generator=g).to(args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    runs = passes(args, hidden, weight, targets, dtype)
    # one warm-up call each, which also compares every output bit for bit
    same = all(torch.equal(a, b) for a, b in zip(runs["before"](), runs["after"]()))
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):   # alternating
        for name, fn in runs.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result = {"card": card, "commit": provenance.commit(), "pass": "update" if args.backward else "scoring",
              "device": args.device, "dtype": args.dtype, "vocab": args.vocab,
              "positions": args.positions, "rows": args.rows, "temperature": args.temperature,
              "bitwise_equal": same, **{f"{k}_s": round(statistics.median(v), 4) for k, v in times.items()},
              "times": {k: [round(x, 4) for x in v] for k, v in times.items()}}
    result["speedup"] = round(result["before_s"] / result["after_s"], 2)
    print(json.dumps({k: v for k, v in result.items() if k != "times"}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
