"""Where the fast engine's decode step spends its time: each part timed alone as a CUDA graph.

The fast engine (train/fast_decode.py) replays one CUDA graph per decode step. This script
fills its static cache to a realistic position, then times, each captured in a graph of its
own and replayed `--reps` times at the same batch and cache length:

- the whole step, greedy and sampled, for the engine as first written and with each of its
  speed options (the noise a sampled step reads is drawn outside the graph, as the engine does);
- its parts: the transformer layers without attention, the attention over the static cache,
  the final norm + LM head, sampling from logits (greedy, sampled), drawing the noise;
- candidate replacements, for the next step of the work: sampling compiled into fused
  kernels (torch.compile) and attention through PyTorch's SDPA with grouped KV heads.

It also prints the top kernels of one eager sampled step from torch.profiler (GPU time per
kernel), so the parts' sum can be checked against what the GPU actually runs.

    python bench/decode_profile.py --tokenizer device/qwen2 --batch 512 --position 384 \
        --out decode_profile.json

Runs from a source checkout without installing (it imports bench/rollout.py's helpers).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rollout  # noqa: E402  (bench/rollout.py: model shapes, prompts, the train import shim)


#: The engine as first written ("before") and with each speed option (train/fast_decode.py).
VARIANTS = {
    "before": rollout.BEFORE,
    "sdpa": dict(attention="sdpa", fused_sampling=False, lm_head="model", layers="model"),
    "sdpa_fused": dict(attention="sdpa", fused_sampling=True, lm_head="model", layers="model"),
    "sdpa_fused_lmT": dict(attention="sdpa", fused_sampling=True, lm_head="transposed", layers="model"),
    "sdpa_fused_lmT_layers": dict(attention="sdpa", fused_sampling=True, lm_head="transposed", layers="compiled"),
}


def graph_ms(fn, reps: int) -> float:
    """Mean time of `reps` replays of `fn` captured in one CUDA graph, in ms."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return event_ms(graph.replay, reps)


def event_ms(fn, reps: int) -> float:
    """Mean time of `reps` calls of `fn` after one warm-up call, by CUDA events, in ms."""
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / reps, 3)


def filled_state(engine, batch: int, length: int, position: int):
    """Engine buffers as they are mid-turn: `position` cache columns written, the rest masked."""
    import torch

    engine._ensure_buffers(batch, length)
    st = engine._state(batch, length)
    for k, v in zip(st.keys, st.values):
        k.normal_()
        v.normal_()
    st.bias.fill_(float("-inf"))
    st.bias[:, :position] = 0.0
    st.tok.random_(0, engine._vocab)
    st.pos.fill_(position)
    st.wpos.fill_(position)
    st.noise.uniform_()
    return st


def one_step(engine, st, sampling, position: int) -> None:
    """The engine's step, always at the same cache column (replays must not run off the buffers)."""
    st.j.zero_()
    st.wpos.fill_(position)
    engine._step(st, sampling)


def parts(engine, st, sampling_cls) -> dict:
    """Callables for each part of the step, reading and writing the engine's buffers."""
    import torch
    from dgpo_edge.train.decoding import sample_next

    m = engine.model.model
    bsz = st.tok.shape[0]
    x0 = m.embed_tokens(st.tok[:, None])
    cos, sin = m.rotary_emb(x0, st.pos[:, None])
    q0, _, _ = engine._qkv(m.layers[0].self_attn, x0, cos, sin)
    logits = engine.model.lm_head(m.norm(x0))[:, 0].contiguous()
    greedy, sampled = sampling_cls(greedy=True), sampling_cls(temperature=1.0)
    lm_t = engine.model.get_output_embeddings().weight.t().contiguous()

    def layers_without_attention():
        x = x0
        for layer in m.layers:
            h = layer.input_layernorm(x)
            engine._qkv(layer.self_attn, h, cos, sin)
            o = torch.zeros((bsz, 1, engine.n_heads * engine.head_dim), dtype=x.dtype, device=x.device)
            x = x + layer.self_attn.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))

    def attention():
        for i in range(len(m.layers)):
            engine._attend(q0, st.keys[i], st.values[i], st.bias)

    def attention_sdpa():
        import torch.nn.functional as F

        mask = st.bias[:, None, None, :]
        for i in range(len(m.layers)):
            F.scaled_dot_product_attention(q0, st.keys[i], st.values[i], attn_mask=mask,
                                           scale=engine.scaling, enable_gqa=True)

    return {
        "layers_without_attention": layers_without_attention,
        "attention": attention,
        "attention_sdpa_gqa": attention_sdpa,
        "norm_lm_head": lambda: engine.model.lm_head(m.norm(x0)),
        "norm_lm_head_transposed": lambda: m.norm(x0) @ lm_t,
        "sample_greedy": lambda: sample_next(logits, greedy, None),
        "sample_sampled": lambda: sample_next(logits, sampled, st.noise),
        "sample_sampled_compiled": _compiled(sample_next, logits, sampled, st.noise),
        "noise_draw": lambda: st.noise.uniform_(),
    }


def _compiled(sample_next, logits, sampling, noise):
    import torch

    fn = torch.compile(lambda lg, nz: sample_next(lg, sampling, nz), mode="max-autotune-no-cudagraphs")
    return lambda: fn(logits, noise)


def kernel_table(engine, st, sampling, rows: int = 25) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    position = int(st.wpos.item())
    one_step(engine, st, sampling, position)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        st.noise.uniform_()
        one_step(engine, st, sampling, position)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="folder with the Qwen tokenizer.json + config")
    ap.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(rollout.SHAPES))
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--length", type=int, default=512, help="static cache length (the engine's bucket)")
    ap.add_argument("--position", type=int, default=384, help="cache columns already written")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--commit", default="", help="recorded in the results (the GPU machine's copy has no git)")
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    rollout._import_train()
    from dgpo_edge.train.decoding import RolloutSampling
    from dgpo_edge.train.fast_decode import FastDecoder

    from dgpo_edge import protocol

    torch.backends.cuda.matmul.allow_tf32 = True
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    model = rollout.build_model(args.shape, len(tokenizer), torch.bfloat16, "cuda")
    res = {"card": torch.cuda.get_device_name(), "commit": args.commit, "torch": torch.__version__, "shape": args.shape,
           "batch": args.batch, "cache_length": args.length, "position": args.position, "ms": {}}
    with torch.inference_mode():
        for label, options in VARIANTS.items():
            engine = FastDecoder(model, tokenizer, protocol.STOP_STRINGS, (), cuda_graphs=True, **options)
            engine._refresh_lm_head()
            st = filled_state(engine, args.batch, args.length, args.position)
            for name, sampling in (("greedy", RolloutSampling(greedy=True)), ("sampled", RolloutSampling(temperature=1.0))):
                key = f"step_{name}_{label}"
                res["ms"][key] = graph_ms(lambda s=sampling: one_step(engine, st, s, args.position), args.reps)
                print(key, res["ms"][key], flush=True)
            del engine, st
            torch.cuda.empty_cache()
        engine = FastDecoder(model, tokenizer, protocol.STOP_STRINGS, (), cuda_graphs=True, **VARIANTS["before"])
        st = filled_state(engine, args.batch, args.length, args.position)
        for name, fn in parts(engine, st, RolloutSampling).items():
            try:
                res["ms"][name] = graph_ms(fn, args.reps)
            except Exception as e:  # noqa: BLE001 - a candidate may not run here; say so and go on
                res["ms"][name] = f"failed: {type(e).__name__}: {str(e)[:200]}"
            print(name, res["ms"][name], flush=True)
        res["ms"]["step_sampled_eager"] = event_ms(
            lambda: one_step(engine, st, RolloutSampling(temperature=1.0), args.position), 10)
        res["kernels"] = kernel_table(engine, st, RolloutSampling(temperature=1.0))
    print(res["kernels"])
    print(json.dumps({k: v for k, v in res.items() if k != "kernels"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
