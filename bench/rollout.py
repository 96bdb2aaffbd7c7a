"""Rollout decoding speed: transformers `generate` vs the fast engine, side by side in one run.

A Qwen2.5-0.5B-shaped model with random weights (or a SmolLM2-135M shape),
the real Qwen tokenizer, Search-R1 prompts; both engines decode the same
left-padded batch for exactly `--new-tokens` tokens per row (no EOS), greedy.
Reported per engine: wall time, generated tokens/s, time per decoding step,
peak GPU memory. The fast engine's first call (graph capture) is timed apart.

Also checks, on the same GPU, that the fast engine (CUDA graphs) and the plain
reference engine agree token for token on a tiny fp32 model, greedy and sampled.

    python bench/rollout.py --tokenizer device/qwen2 --batch 256 --new-tokens 256 --out result.json

With `--turns 5 --new-tokens 500` two more rows decode the way an RL rollout at the paper's shape
does (bench/rl_cost.py: five 500-token turns over a growing context), the like-for-like standalone
figure for the rollout tokens/s measured inside RL: one prefilling the whole conversation each
turn, one keeping the engine's cache between turns (`resume`, the rollouts' `reuse_cache`).

Runs from a source checkout without installing (the device machine has torch
and transformers but not this package).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPES = {
    # Qwen2.5-0.5B: 24 layers, d=896, 14 query / 2 KV heads of 64, tied embeddings.
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0),
    # SmolLM2-135M: 30 layers, d=576, 9 query / 3 KV heads of 64 (Llama), on the Qwen vocabulary here.
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0),
}

QUESTIONS = [
    "What is the capital of Tanzania", "How long is the coastline of United States",
    "What is the internet country code of Tanzania", "Which countries border Bhutan",
    "What is the lowest point in Svalbard", "What is the highest point of Nepal",
    "Who wrote the novel that the film Blade Runner is based on", "When was the Eiffel Tower finished",
]


def _import_train():
    """`dgpo_edge.train` from this checkout, installed or not (train/ maps to it in pyproject)."""
    sys.path.insert(0, str(ROOT))
    try:
        import dgpo_edge.train  # noqa: F401
    except ModuleNotFoundError:
        spec = importlib.util.spec_from_file_location(
            "dgpo_edge.train", ROOT / "train" / "__init__.py", submodule_search_locations=[str(ROOT / "train")])
        module = importlib.util.module_from_spec(spec)
        sys.modules["dgpo_edge.train"] = module
        spec.loader.exec_module(module)


def build_model(shape: str, vocab: int, dtype, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = dict(SHAPES[shape])
    kind = spec.pop("model_type")
    common = dict(vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, **spec)
    cfg = Qwen2Config(**common, use_sliding_window=False) if kind == "qwen2" else LlamaConfig(**common)
    torch.manual_seed(0)
    with torch.device(device):
        model = (Qwen2ForCausalLM if kind == "qwen2" else LlamaForCausalLM)(cfg)
    return model.to(dtype).eval()


def prompts(tokenizer, batch: int) -> list[list[int]]:
    from dgpo_edge import protocol

    out = []
    for i in range(batch):
        q = QUESTIONS[i % len(QUESTIONS)] + " " * (i % 5)  # vary lengths a little: real left padding
        text = protocol.render_prompt(q.strip() + ("" if i % 3 else " in 2024"), tokenizer)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_generate(model, tokenizer, prefixes, new_tokens: int) -> dict:
    """Plain transformers generate: greedy, exactly `new_tokens` per row."""
    import torch
    from dgpo_edge.train.decoding import left_pad

    ids, mask = left_pad(prefixes, tokenizer.pad_token_id, model.device)
    kw = dict(do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=None,
              top_k=None, top_p=None, temperature=None)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, **kw)  # warm-up
    torch.cuda.reset_peak_memory_stats()
    _sync()
    t0 = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, **kw)
    _sync()
    wall = time.perf_counter() - t0
    gen = out[:, ids.shape[1]:]
    return _report(wall, gen.shape[0] * gen.shape[1], new_tokens) | {"tokens": gen.tolist()}


#: The engine as first written; the fast rows without a suffix use the engine's defaults.
BEFORE = dict(attention="matmul", fused_sampling=False, lm_head="model", layers="model")
#: One option at a time on top of SDPA + compiled sampling (the defaults before compiled layers).
OPTIONS = {"modules": dict(layers="model", lm_head="model"),
           "layers_compiled": dict(layers="compiled", lm_head="model"),
           "lm_head_transposed": dict(layers="model", lm_head="transposed")}


def run_fast(model, tokenizer, prefixes, new_tokens: int, check_every: int, greedy: bool,
             cuda_graphs: bool = True, repeats: int = 1, **options) -> dict:
    import torch
    from dgpo_edge.train.decoding import RolloutSampling
    from dgpo_edge.train.fast_decode import FastDecoder

    from dgpo_edge import protocol

    engine = FastDecoder(model, tokenizer, protocol.STOP_STRINGS, eos_ids=(), check_every=check_every,
                         cuda_graphs=cuda_graphs, **options)
    sampling, gen = RolloutSampling(greedy=greedy), _generator(model.device)
    _sync()
    t0 = time.perf_counter()
    engine.decode(prefixes, [new_tokens] * len(prefixes), sampling, gen)   # first call: capture
    _sync()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    engine.decode(prefixes, [1] * len(prefixes), sampling, gen)            # prefill + 1 token
    _sync()
    prefill = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    walls = []
    for _ in range(repeats):  # the median of `repeats` timed calls
        t0 = time.perf_counter()
        outs = engine.decode(prefixes, [new_tokens] * len(prefixes), sampling, gen)
        _sync()
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    n = sum(len(o.ids) for o in outs)
    rep = _report(wall, n, new_tokens)
    rep["walls_s"] = [round(w, 3) for w in walls]
    rep["first_call_s"] = round(first, 3)
    rep["prefill_s"] = round(prefill, 4)
    rep["decode_step_ms"] = round((wall - prefill) / max(1, new_tokens - 1) * 1000, 3)
    rep["stops"] = sorted({o.finish for o in outs})
    return rep | {"tokens": [o.ids for o in outs]}


def run_turns(model, tokenizer, prefixes, new_tokens: int, turns: int, check_every: int,
              resume: bool = False) -> dict:
    """The shape of a random-weight RL rollout (bench/rl_cost.py): `turns` sampled turns of
    `new_tokens` each, every turn's prefix the last one's plus its tokens and the protocol's
    invalid-action feedback, each turn a `decode` call: its prefill over the whole prefix, or with
    `resume` over what the turn appended (the engine keeps its cache). The engine's defaults; the
    first pass (captures; with `resume`, up to three, until the cache has grown to what resuming
    needs) is timed apart. Its step_ms includes each turn's prefill; `resumed_turns` counts the
    timed turns that kept the cache."""
    import torch
    from dgpo_edge.train.decoding import RolloutSampling
    from dgpo_edge.train.fast_decode import FastDecoder

    from dgpo_edge import protocol

    engine = FastDecoder(model, tokenizer, protocol.STOP_STRINGS, eos_ids=(), check_every=check_every,
                         cuda_graphs=model.device.type == "cuda")
    feedback = tokenizer.encode(protocol.INVALID_ACTION_FEEDBACK, add_special_tokens=False)
    sampling, gen = RolloutSampling(greedy=False), _generator(model.device)

    def episode() -> tuple[list[float], int, list[int]]:
        rows, walls, n = [list(p) for p in prefixes], [], 0
        for _ in range(turns):
            _sync()
            t0 = time.perf_counter()
            outs = engine.decode(rows, [new_tokens] * len(rows), sampling, gen, resume=resume and walls != [])
            _sync()
            walls.append(time.perf_counter() - t0)
            n += sum(len(o.ids) for o in outs)
            rows = [r + list(o.ids) + feedback for r, o in zip(rows, outs)]
        return walls, n, [len(r) for r in rows]

    first, _, _ = episode()
    for _ in range(2 if resume else 0):   # a turn without room falls back and grows the cache
        before = engine.resumed_calls
        episode()
        if engine.resumed_calls - before == turns - 1:
            break
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()   # this row's own peak
    before = engine.resumed_calls
    walls, n, lengths = episode()
    wall = sum(walls)
    return _report(wall, n, turns * new_tokens) | {
        "resumed_turns": engine.resumed_calls - before, "turns": turns, "turn_walls_s": [round(w, 3) for w in walls], "first_pass_s": round(sum(first), 3),
        "final_context": [min(lengths), max(lengths)]}


def _generator(device):
    import torch

    return torch.Generator(device=device).manual_seed(0)


def _report(wall: float, n_tokens: int, steps: int) -> dict:
    import torch

    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    return {"wall_s": round(wall, 3), "generated_tokens": n_tokens,
            "tokens_per_s": round(n_tokens / wall, 1), "step_ms": round(wall / steps * 1000, 3),
            "peak_mem_gib": round(peak, 2)}


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """How far two engines' greedy tokens agree (bf16 numerics may diverge late)."""
    prefix = []
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        prefix.append(k)
    return {"rows_identical": sum(x == y for x, y in zip(a, b)), "rows": len(a),
            "mean_common_prefix": round(sum(prefix) / len(prefix), 1)}


def graph_check(tokenizer) -> dict:
    """Fast engine with CUDA graphs == plain engine, tiny fp32 model, greedy and sampled."""
    import torch
    from dgpo_edge.train.decoding import PlainDecoder, RolloutSampling
    from dgpo_edge.train.fast_decode import FastDecoder
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dgpo_edge import protocol

    torch.manual_seed(1)
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).to("cuda").eval()
    model.config._attn_implementation = "eager"
    # TF32 off: the comparison is about the engines, not matmul precision.
    torch.backends.cuda.matmul.allow_tf32 = False
    pre = prompts(tokenizer, 8)
    res = {}
    for name, sampling in (("greedy", RolloutSampling(greedy=True)), ("sampled", RolloutSampling(temperature=1.0))):
        outs = []
        for eng in (PlainDecoder(model, tokenizer, protocol.STOP_STRINGS, ()),
                    FastDecoder(model, tokenizer, protocol.STOP_STRINGS, (), check_every=16)):
            gen = torch.Generator(device="cuda").manual_seed(3)
            outs.append(eng.decode(pre, [64] * len(pre), sampling, gen))
        res[name] = agreement([o.ids for o in outs[0]], [o.ids for o in outs[1]])
        res[name]["max_logprob_diff"] = max(
            abs(x - y) for a, b in zip(*outs) for x, y in zip(a.logprobs, b.logprobs))
    # One engine across calls of changing batch and length (new graphs, cache growth), as in
    # multi-turn rollouts: still equal to the plain engine.
    fast = FastDecoder(model, tokenizer, protocol.STOP_STRINGS, (), check_every=16)
    plain = PlainDecoder(model, tokenizer, protocol.STOP_STRINGS, ())
    same = []
    for rows, extra, new in ((8, 0, 40), (3, 0, 20), (8, 300, 100), (5, 700, 300), (2, 0, 10)):
        pre_i = [p + p[:extra] for p in pre[:rows]]
        a = fast.decode(pre_i, [new] * rows, RolloutSampling(greedy=True), None)
        b = plain.decode(pre_i, [new] * rows, RolloutSampling(greedy=True), None)
        same.append([x.ids for x in a] == [y.ids for y in b])
    res["multi_call_identical"] = same
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="folder with the Qwen tokenizer.json + config")
    ap.add_argument("--shapes", default="qwen2.5-0.5b", help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--check-every", type=int, default=32)
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--check-only", action="store_true", help="only the engine agreement check")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per row (the median is reported)")
    ap.add_argument("--turns", type=int, default=0,
                    help="also decode TURNS sampled turns of --new-tokens each over a growing prefix, "
                         "as a random-weight RL rollout does: a whole prefill each turn (row "
                         "fast_sampled_TURNSturns) and the cache kept between turns (..._kept_cache)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--commit", default="", help="recorded in the results (the GPU machine's copy has no git)")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoTokenizer

    _import_train()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    results = {"card": torch.cuda.get_device_name(), "commit": args.commit, "torch": torch.__version__,
               "transformers": transformers.__version__, "batch": args.batch, "new_tokens": args.new_tokens}
    try:
        results["graph_check"] = graph_check(tokenizer)
    except Exception as e:  # noqa: BLE001 - report and go on to the timings
        import traceback

        traceback.print_exc()
        results["graph_check"] = f"failed: {type(e).__name__}: {e}"
    print(json.dumps(results, indent=1), flush=True)
    if args.check_only:
        args.shapes = ""
    torch.backends.cuda.matmul.allow_tf32 = True
    pre = prompts(tokenizer, args.batch)
    results["prompt_tokens"] = [min(map(len, pre)), max(map(len, pre))]
    for shape in filter(None, args.shapes.split(",")):
        model = build_model(shape, len(tokenizer), torch.bfloat16, "cuda")
        r: dict = {}
        kw = dict(repeats=args.repeats)
        r["fast_greedy"] = run_fast(model, tokenizer, pre, args.new_tokens, args.check_every, greedy=True, **kw)
        r["fast_sampled"] = run_fast(model, tokenizer, pre, args.new_tokens, args.check_every, greedy=False, **kw)
        for name, options in OPTIONS.items():
            r[f"fast_sampled_{name}"] = run_fast(model, tokenizer, pre, args.new_tokens, args.check_every,
                                                 greedy=False, **options, **kw)
        for greedy in (True, False):
            name = "greedy" if greedy else "sampled"
            r[f"fast_{name}_before"] = run_fast(model, tokenizer, pre, args.new_tokens, args.check_every,
                                                greedy=greedy, **BEFORE, **kw)
            r[f"speedup_{name}_vs_before"] = round(
                r[f"fast_{name}"]["tokens_per_s"] / r[f"fast_{name}_before"]["tokens_per_s"], 2)
        if args.turns:
            for resume, tag in ((False, ""), (True, "_kept_cache")):
                r[f"fast_sampled_{args.turns}turns{tag}"] = run_turns(
                    model, tokenizer, pre, args.new_tokens, args.turns, args.check_every, resume=resume)
        r["agreement_greedy_before"] = agreement(r["fast_greedy_before"]["tokens"], r["fast_greedy"]["tokens"])
        r["static_cache_no_graphs_greedy"] = run_fast(model, tokenizer, pre, args.new_tokens, args.check_every,
                                                      greedy=True, cuda_graphs=False)
        if not args.skip_generate:
            r["generate_greedy"] = run_generate(model, tokenizer, pre, args.new_tokens)
            r["agreement_greedy"] = agreement(r["generate_greedy"]["tokens"], r["fast_greedy"]["tokens"])
            r["speedup"] = round(r["fast_greedy"]["tokens_per_s"] / r["generate_greedy"]["tokens_per_s"], 2)
        for v in r.values():
            if isinstance(v, dict):
                v.pop("tokens", None)
        results[shape] = r
        print(shape, json.dumps(r, indent=1), flush=True)
        del model
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
