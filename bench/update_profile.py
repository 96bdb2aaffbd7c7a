"""Where a PPO/DGPO update's time goes at the paper's shape, and what each speed path saves (GPU).

One micro-batch of the update, timed alone: the actor's forward and backward through `PolicyHead`
(log-probs and entropies of the generated tokens) and the critic's through `ValueModel`, on random
Qwen2.5-0.5B-shaped models in float32 under bf16 autocast, as `train dgpo` runs them; plus the
no-grad passes of a step (old log-probs, and the Qwen2.5-3B-shaped teacher). Rows are padded on the
right to different lengths, as a step's length-bucketed micro-batches are.

    python bench/update_profile.py --out out/results/update_profile.json            # one GPU
    python bench/update_profile.py --tiny --device cpu --out /tmp/u.json             # a smoke run

Variants (each row of the output), from what the first version computed to today's default:
  masked+kept       the attention mask passed, the head's logits kept for the backward
  unmasked+kept     right padding needs no mask: PyTorch's fused causal attention
  unmasked+recomp   ... and the head's backward recomputes its logits (train/rl/models.py: the default)
each with gradient checkpointing on and off, and `--profile` adds torch.profiler's top kernels of
the first and the default variant, `--fused-norm` a row with every RMSNorm through torch's fused
rms_norm, and `--compile` a row with each decoder layer compiled (ppo.compile). The update of a step is about (rollouts / micro-batch) times a
micro-batch (512 / 4 = 128 at the paper's shape) plus two optimizer steps per mini-batch.
Output: {"card", "commit", "shape", "rows": [{"variant", "checkpointing", "actor_s", "critic_s",
"micro_batch_s", "update_estimate_s", "peak_gb"}], "no_grad": [...], "profile": {...}}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]   # the installed package is used (dgpo_edge.train lives in train/)
sys.path.insert(0, str(ROOT / "bench"))
import provenance  # noqa: E402

STUDENT = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2)
TEACHER = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
VARIANTS = (("masked+kept", True, False), ("unmasked+kept", False, False), ("unmasked+recomp", False, True))


def qwen2(shape: dict, vocab: int, device, seed: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, max_position_embeddings=32768, tie_word_embeddings=True,
                         rope_theta=1000000.0, use_sliding_window=False, attn_implementation="sdpa", **shape)
    with torch.device(device):   # initialised where it runs: a 3B model's random init on a CPU takes minutes
        return Qwen2ForCausalLM(config)


def batch(rows: int, width: int, generated: float, vocab: int, device, seed: int = 0):
    """Right-padded rows of lengths width, width - 3%, ... with the last `generated` share generated."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, width + 1), generator=g)
    attention = torch.zeros(rows, width + 1, dtype=torch.long)
    mask = torch.zeros(rows, width + 1)
    for i in range(rows):
        n = width - round(i * 0.03 * width)
        attention[i, :n] = 1
        mask[i, n - round(generated * n):n] = 1
    return ids.to(device), attention.to(device), mask.to(device)


def use_variant(masked: bool, recompute: bool) -> None:
    """Switch the training passes to a variant (module globals their forwards look up at call time:
    train/attention.py's mask, train/rl/models.py's head)."""
    from dgpo_edge.train import attention
    from dgpo_edge.train.rl import models

    if not hasattr(models, "_speed_paths"):
        models._speed_paths = (attention.model_mask, models.head_logps)
    mask_fn, head_fn = models._speed_paths
    attention.model_mask = (lambda m: m) if masked else mask_fn
    models.head_logps = head_fn if recompute else models.kept_logits_logps


def timed(fn, repeats: int, sync) -> float:
    """Median seconds of `fn` over `repeats` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def update_rows(args, device, sync, peak, reset_peak) -> list[dict]:
    import torch

    from dgpo_edge.train.rl.models import PolicyHead, ValueModel

    shape = TINY if args.tiny else STUDENT
    actor = qwen2(shape, args.vocab, device, 0)
    critic = ValueModel(qwen2(shape, args.vocab, device, 1).model, shape["hidden_size"]).to(device)
    policy = PolicyHead(actor, args.head_rows)
    ids, attention, mask = batch(args.micro_batch, args.width, args.generated, args.vocab, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def actor_step():
        with autocast:
            logp, ent = policy(ids, attention, mask, 1.0, True)
        (-(logp * mask).sum() / mask.sum() - 0.001 * (ent * mask).sum() / mask.sum()).backward()

    def critic_step():
        with autocast:
            values = critic(ids, attention)
        ((values * mask).square().sum() / mask.sum()).backward()

    def checkpoint(on: bool) -> None:
        for model in (actor, critic.body):
            model.gradient_checkpointing_enable() if on else model.gradient_checkpointing_disable()
            model.train()

    def measure(name: str, checkpointing: bool) -> dict:
        reset_peak()
        a = timed(actor_step, args.repeats, sync)
        c = timed(critic_step, args.repeats, sync)
        actor.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        return timing_row(name, checkpointing, a, c, args, peak())

    rows = []
    for checkpointing in (True, False):
        checkpoint(checkpointing)
        for name, masked, recompute in VARIANTS:
            use_variant(masked, recompute)
            rows.append(measure(name, checkpointing))
    if args.profile:
        checkpoint(True)
        args.profile_out = {}
        for name, masked, recompute in (VARIANTS[0], VARIANTS[-1]):
            use_variant(masked, recompute)
            args.profile_out[name] = profile(lambda: (actor_step(), critic_step()), device)
    use_variant(False, True)
    checkpoint(False)
    if args.fused_norm:   # an experiment: the RMSNorms through torch's rms_norm (no switch in train)
        with fused_rms_norms([actor, critic.body]):
            rows.append(measure("unmasked+recomp+fused-norm", False))
    # last: compiling changes the layers in place, and the rows and profiles above are eager
    if args.compile:   # each decoder layer through torch.compile, as ppo.compile does
        from dgpo_edge.train.compiled_layers import compile_decoder_layers

        for model in (actor, critic.body):
            compile_decoder_layers(model)
        rows.append(measure("unmasked+recomp+compiled", False))
    use_variant(False, True)
    return rows


@contextlib.contextmanager
def fused_rms_norms(models: list):
    """Every RMSNorm of `models` computed by torch.nn.functional.rms_norm (in float32, then scaled by
    its weight, as the transformers module does for float32 inputs) while inside; restored after."""
    import torch

    def forward(self, x):
        out = torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=self.variance_epsilon)
        return self.weight * out.to(x.dtype)

    norms = [m for model in models for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    for m in norms:
        m.forward = types.MethodType(forward, m)
    try:
        yield norms
    finally:
        for m in norms:
            del m.forward


def timing_row(variant: str, checkpointing: bool, actor_s: float, critic_s: float, args, peak_gb: float) -> dict:
    """One output row (printed as it is made): a micro-batch's times and the step's estimate."""
    row = {"variant": variant, "checkpointing": checkpointing, "actor_s": round(actor_s, 4),
           "critic_s": round(critic_s, 4), "micro_batch_s": round(actor_s + critic_s, 4),
           "update_estimate_s": round((actor_s + critic_s) * args.step_rows / args.micro_batch, 1),
           "peak_gb": round(peak_gb, 2)}
    print(json.dumps(row), flush=True)
    return row


def profile(fn, device, top: int = 15) -> list[dict]:
    """The top kernels (or CPU ops) of one call of `fn` by total device time."""
    import torch
    from torch.profiler import ProfilerActivity

    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in prof.key_averages() if e.device_type.name == ("CUDA" if device.type == "cuda" else "CPU"))
    return [{"name": e.key[:90], "ms": round(getattr(e, key) / 1e3, 2), "calls": e.count,
             "share": round(getattr(e, key) / total, 3) if total else None} for e in events[:top]]


def no_grad_rows(args, device, sync) -> list[dict]:
    """The scoring passes of a step: old log-probs (the actor) and the teacher, without gradients."""
    import torch

    from dgpo_edge.train.rl.models import frozen_logps

    out = []
    # as train dgpo runs them: the actor's old log-probs in fp32 weights under bf16 autocast, the
    # frozen teacher in bf16 weights (load_frozen)
    models = [("logp (student)", TINY if args.tiny else STUDENT, 0, torch.float32)]
    if not args.skip_teacher:
        models.append(("teacher (3B shape)", TINY if args.tiny else TEACHER, 2, torch.bfloat16))
    ids, attention, mask = batch(args.forward_batch, args.width, args.generated, args.vocab, device)
    for label, shape, seed, dtype in models:
        lm = qwen2(shape, args.vocab, device, seed).to(dtype).eval()
        for name, masked, recompute in VARIANTS:
            use_variant(masked, recompute)
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
                s = timed(lambda: frozen_logps(lm, ids, attention, mask, 1.0, args.head_rows), args.repeats, sync)
            out.append({"pass": label, "variant": name, "rows": args.forward_batch, "s": round(s, 4),
                        "step_estimate_s": round(s * args.step_rows / args.forward_batch, 1)})
            print(json.dumps(out[-1]), flush=True)
        del lm
    use_variant(False, True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="2-layer d=64 models and short rows (a smoke run)")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--forward-batch", type=int, default=4, help="rows per no-grad pass (ppo.forward_batch)")
    ap.add_argument("--width", type=int, default=4096, help="the longest row (the paper's episode limit)")
    ap.add_argument("--generated", type=float, default=0.6, help="share of each row the policy generated")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--head-rows", type=int, default=2048)
    ap.add_argument("--step-rows", type=int, default=512, help="rollouts in a step, for the estimates")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--skip-teacher", action="store_true")
    ap.add_argument("--compile", action="store_true", help="one more row: the default with torch.compile'd layers")
    ap.add_argument("--fused-norm", action="store_true",
                    help="one more row: the default with every RMSNorm through torch.nn.functional.rms_norm")
    ap.add_argument("--card", default="")
    args = ap.parse_args()
    if args.tiny:
        args.width, args.vocab = min(args.width, 64), min(args.vocab, 97)
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    peak = (lambda: torch.cuda.max_memory_allocated() / 2**30) if cuda else (lambda: 0.0)
    reset_peak = torch.cuda.reset_peak_memory_stats if cuda else (lambda: None)
    args.profile_out = None
    result = {"card": args.card or (torch.cuda.get_device_name() if cuda else "cpu"),
              "commit": provenance.commit(),
              "shape": {k: getattr(args, k) for k in ("micro_batch", "forward_batch", "width", "generated", "vocab",
                                                      "head_rows", "step_rows", "repeats", "tiny")}}
    result["rows"] = update_rows(args, device, sync, peak, reset_peak)
    result["no_grad"] = no_grad_rows(args, device, sync)
    result["profile"] = args.profile_out
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
