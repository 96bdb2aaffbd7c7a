"""A decoder layer's work around attention as two pure functions, for the fast engine to compile.

In the fast engine's decode step the layers without attention took 3.2 of 6.4 ms (H200, Qwen2.5-0.5B
shape, batch 512: bench/decode_profile.py), though their matrix products need about 0.5 ms: the
rest is some twenty small kernels per layer (the RMSNorms' upcasts and reductions, the rotary
embedding's halves and concatenation, SiLU, products and residual adds), each a launch and a round
trip through memory. `torch.compile` fuses those elementwise chains into a few kernels, but it
needs functions without module objects (one compiled graph would be guarded on each layer) and
without in-place writes to the cache. So each layer's step is split as

    q, k, v = before_attention(x, *weights_in, cos, sin)    # norm, q/k/v projections, rotary
    (the engine writes k, v into its cache and attends, as without this module)
    x = after_attention(x, o, *weights_out)                  # o projection, residual, norm, MLP, residual

with the weights passed as tensors, so one compiled graph serves every layer. The math is the
modules' (Llama and Qwen2 layers with SiLU MLPs: SmolLM2, Qwen2.5); `LayerKernels(compiled=False)`
runs the same functions eagerly, which is how CPU tests check them against the modules.

One limit: the compiled functions are shared by every engine in a process, and torch.compile keeps
at most `torch._dynamo.config.recompile_limit` (8) variants of each; each model shape takes about
three (a fixed batch, a symbolic one, batch 1). A process that decodes with a fourth shape runs
these functions eagerly from then on, with the same results and the speed of `layers="model"`.
RL, training and evaluation decode one or two shapes per process.
"""

from __future__ import annotations

from typing import Any

def _rms_norm(x: Any, weight: Any, eps: float) -> Any:
    import torch

    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope(x: Any, cos: Any, sin: Any) -> Any:
    """The rotary embedding applied to x [..., head_dim] (the Llama/Qwen2 rotate-half form)."""
    import torch

    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def compiled_or_eager(fn: Any) -> Any:
    """`fn` through torch.compile, and `fn` itself from the first failure on (compiling is an
    optimisation only: no compiler toolchain or an unsupported build must not stop a run).

    torch.compile compiles on the first call, which the fast engine makes in its warm-up steps
    before any graph capture. dynamic=None: the first new batch size recompiles once with a symbolic
    batch dimension, which then serves every power-of-two bucket a run meets (a static compile per
    size would hit dynamo's recompile limit within one multi-turn rollout and fall back to eager).
    """
    import torch

    use = torch.compile(fn, dynamic=None)

    def call(*args: Any) -> Any:
        nonlocal use
        if use is not fn:
            try:
                return use(*args)
            except Exception:  # noqa: BLE001 - compiling is an optimisation only
                use = fn
        return fn(*args)

    return call


def before_attention(x: Any, norm_w: Any, eps: float, wq: Any, bq: Any, wk: Any, bk: Any, wv: Any, bv: Any,
                     cos: Any, sin: Any, n_heads: int, n_kv: int, head_dim: int) -> tuple[Any, Any, Any]:
    """x [B, T, H] -> rotated q [B, heads, T, d], rotated k and v [B, kv_heads, T, d]."""
    import torch.nn.functional as F

    bsz, t, _ = x.shape
    h = _rms_norm(x, norm_w, eps)
    q = F.linear(h, wq, bq).view(bsz, t, n_heads, head_dim).transpose(1, 2)
    k = F.linear(h, wk, bk).view(bsz, t, n_kv, head_dim).transpose(1, 2)
    v = F.linear(h, wv, bv).view(bsz, t, n_kv, head_dim).transpose(1, 2)
    cos, sin = cos[:, None], sin[:, None]
    return rope(q, cos, sin), rope(k, cos, sin), v


def after_attention(x: Any, o: Any, wo: Any, bo: Any, norm_w: Any, eps: float, w_gate: Any, w_up: Any,
                    w_down: Any) -> Any:
    """x [B, T, H] and attention output o [B, T, heads * d] -> the layer's output."""
    import torch.nn.functional as F

    x = x + F.linear(o, wo, bo)
    h = _rms_norm(x, norm_w, eps)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


PROJECTIONS = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"), ("self_attn", "o_proj"),
               ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))


def supported(model: Any) -> bool:
    """Whether every layer is what these functions compute: SiLU MLPs without biases, and every
    projection a plain `nn.Linear`. A LoRA-injected layer is not (its adapters would be skipped:
    the weight tuples hold the base weights only), so a model in LoRA training keeps its modules."""
    import torch

    if getattr(model.config, "hidden_act", "silu") != "silu":
        return False
    for layer in model.model.layers:
        projections = [getattr(getattr(layer, block), name) for block, name in PROJECTIONS]
        if any(type(p) is not torch.nn.Linear for p in projections) or any(p.bias is not None for p in projections[4:]):
            return False
        if not all(hasattr(norm, "variance_epsilon") for norm in (layer.input_layernorm, layer.post_attention_layernorm)):
            return False
    return True


class LayerKernels:
    """Per-layer weight tuples and the two functions, compiled or eager.

    The tuples hold the modules' own parameters (no copies), so weight updates between calls, as
    in RL, are seen without a refresh. Each function falls back to its eager self if compiling it
    fails (`compiled_or_eager`).
    """

    def __init__(self, model: Any, compiled: bool):
        cfg = model.config
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.weights_in, self.weights_out = [], []
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            self.weights_in.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                                    a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
                                    a.v_proj.weight, a.v_proj.bias))
            self.weights_out.append((a.o_proj.weight, a.o_proj.bias, layer.post_attention_layernorm.weight,
                                     layer.post_attention_layernorm.variance_epsilon,
                                     m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight))
        self._before = compiled_or_eager(before_attention) if compiled else before_attention
        self._after = compiled_or_eager(after_attention) if compiled else after_attention

    def before(self, i: int, x: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        return self._before(x, *self.weights_in[i], cos, sin, self.n_heads, self.n_kv, self.head_dim)

    def after(self, i: int, x: Any, o: Any) -> Any:
        return self._after(x, o, *self.weights_out[i])
