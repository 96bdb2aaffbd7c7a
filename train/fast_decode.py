"""The fast rollout engine: static KV cache, CUDA-graph decode step, chunked stop checks.

Plain `generate` is launch-bound on a GPU: a 0.5B model's decode step is a
few hundred small kernels whose launches, plus a host sync per step for the
stopping criteria, cost far more than reading the weights. This engine
removes both:

- **Static KV cache.** Keys and values live in preallocated buffers
  `[batch, kv_heads, S, head_dim]`; the step writes one column at a shared
  index (left padding aligns every row's end), and an additive bias row per
  sequence masks padding and unwritten slots. Shapes never change during a
  turn, so the step can be captured once and replayed.
- **CUDA graphs.** The whole decode step - embedding, every layer, the
  LM head, sampling, and the bookkeeping that advances positions - is
  captured in one graph per (batch bucket, length bucket, sampling) and
  replayed; a step is one launch. Sampling noise is drawn outside the graph
  with the caller's generator (one extra launch), which keeps seeds
  reproducible and matches `PlainDecoder` draw for draw.
- **No per-step host sync.** Tokens go to a device buffer; the host reads
  it every `check_every` steps, finds stop strings and EOS, and ends the turn
  when every row has finished. Rows that finished inside a chunk decode a few
  wasted tokens that are cut off.

Where a step's time goes (bench/decode_profile.py, one H100, Qwen2.5-0.5B shape, batch 512,
cache 512 with 384 written; docs/benchmarks.md has the table): with the first version of this
engine a sampled step took 9.97 ms: layers without attention 3.26, attention 2.69, norm + LM head
1.47, sampling 2.36. Two of the parts had measured replacements, now the defaults:

- **Attention** through PyTorch's fused SDPA with grouped KV heads (`attention="sdpa"`):
  1.21 ms instead of 2.69 for the two matmuls and float32 softmax (`attention="matmul"`).
- **Sampling** compiled into fused kernels on CUDA (`fused_sampling`): 0.47 ms instead of
  2.36 for the ten eager passes over the [batch, vocabulary] logits.

Profiled again with those (H200), the layers without attention were half the step (3.2 of
6.4 ms) though their matrix products need about 0.5 ms: small elementwise kernels. Two more
options, the defaults on CUDA (`"auto"`), took the whole engine at batch 512 sampled from 62,042
to 83,853 tokens/s on one H200:

- **Compiled layers** (`layers`, train/fast_layers.py): each layer's work before and after
  attention as two pure functions compiled once for every layer (78,969 tokens/s alone).
- **A transposed LM head** (`lm_head`): a [hidden, vocab] copy of the head's weight, for which
  cuBLAS picks a faster kernel.

**The cache kept between turns** (`decode(..., resume=True)`): an episode's next turn
is its last prefix, the tokens it generated and an observation. Re-reading all of that
costs a prefill over the whole conversation each turn (about a third of a five-turn
episode at the paper's shape, docs/benchmarks.md). With `resume=True` the engine checks
that every prefix extends one of the rows it decoded last call (the same rows or a subset,
in order) and then keeps their cache: rows are gathered, the slots a row wrote after its
kept tokens are masked, and only the appended tokens are prefilled, at the columns after
the last call's. Any prefix that does not match falls back to the full prefill, and so
does a turn that would not fit the cache already allocated (growing it would hold two
caches at once; it grows the buffers for the next batches instead). The kept cache is
longer than a whole prefill's by the slots rows left unused, which the masks skip but
attention still reads. Only the caller knows that the weights did not change between
the calls, so it is never implied.

With `layers="model"` the layers' own modules (norms, projections, MLP, rotary
embedding) are called; the compiled functions compute the same math from the
same weight tensors. Only attention and the cache are ours. Llama and Qwen2
architectures (SmolLM2, Qwen2.5) are supported; on CPU the same code runs
without graphs, which is how tests check it against the plain engine token for
token.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .decoding import (AttentionChoice, LayerChoice, LMHeadChoice, RolloutSampling, StopScanner, TurnOutput,
                       left_pad, new_noise, pad_id_of, sample_next, turn_generator)
from . import fast_layers

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
#: Attention over the static cache: PyTorch's fused SDPA with grouped KV heads, or two matmuls
#: and a float32 softmax (the first version; 2.2x slower at batch 512, see bench/decode_profile.py).
ATTENTION = typing.get_args(AttentionChoice)
#: The LM head: the model's own module, or a matmul with a [hidden, vocab] copy of its weight
#: (cuBLAS picks a faster kernel for that layout on some cards; the copy is refreshed each call).
LM_HEADS = typing.get_args(LMHeadChoice)


def fused_sampler() -> Any:
    """`sample_next` compiled into a few fused kernels (one pass over the [B, V] logits, not ten).

    Same math as the eager function, which takes over if compiling fails (`compiled_or_eager`).
    """
    return fast_layers.compiled_or_eager(sample_next)


def supports(model: Any) -> bool:
    """Whether `FastDecoder` can run this model (architecture and features)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(cfg, "use_sliding_window", False):
        return False
    inner = getattr(model, "model", None)
    return all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb"))


def _bucket(n: int, step: int) -> int:
    return max(step, -(-n // step) * step)


def _pow2(n: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return b


@dataclass
class _State:
    """Device buffers one captured step reads and updates (views of the big ones)."""

    tok: Any      # [B] last sampled token (the step's input)
    pos: Any      # [B] its position id
    wpos: Any     # [1] cache column the step writes
    j: Any        # [1] column of `out_tok` the step writes
    bias: Any     # [B, S] additive attention bias (0 = attend, -inf = masked)
    noise: Any    # [B, V] uniform noise for sampling
    out_tok: Any  # [B, chunk]
    out_lp: Any   # [B, chunk]
    keys: list    # per layer [B, kv_heads, S, head_dim]
    values: list


@dataclass
class _Kept:
    """What the cache holds after a call, for the next call's `resume`."""

    ids: list[list[int]]   # per cache row: the tokens whose keys and values it holds
    fed: list[int]         # per cache row: how many of the call's generated tokens were written
    start: int             # the call's first decode column (its prompts end before it)
    end: int               # the first column no row has written


class FastDecoder:
    """Batched turn decoding with a static cache and (on CUDA) a graph-captured step."""

    name = "fast"

    def __init__(self, model: Any, tokenizer: Any, stop_strings: Sequence[str], eos_ids: Iterable[int],
                 check_every: int = 32, cuda_graphs: bool | None = None, length_bucket: int | None = None,
                 prefill_elements: int = 1 << 26, attention: AttentionChoice = "sdpa",
                 fused_sampling: bool | None = None, lm_head: LMHeadChoice = "auto", layers: LayerChoice = "auto"):
        if not supports(model):
            raise ValueError(f"the fast engine supports {', '.join(SUPPORTED_MODEL_TYPES)} models "
                             f"without sliding-window attention; use engine='plain'")
        cfg = model.config
        self.model = model
        self.scanner = StopScanner(tokenizer, stop_strings, eos_ids)
        self.pad_id = pad_id_of(tokenizer)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scaling = self.head_dim ** -0.5
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.check_every = check_every
        self.use_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.length_bucket = length_bucket or (256 if self.device.type == "cuda" else 64)
        self.prefill_elements = prefill_elements
        if attention not in ATTENTION or lm_head not in LM_HEADS:
            raise ValueError(f"attention must be one of {ATTENTION}, lm_head one of {LM_HEADS}")
        cuda = self.device.type == "cuda"
        self.attention, self.lm_head = attention, ("transposed" if cuda else "model") if lm_head == "auto" else lm_head
        self._kernels = self._layer_kernels(model, layers)
        fused = cuda if fused_sampling is None else fused_sampling
        self._sample = fused_sampler() if fused else sample_next
        self._lm_t = None   # [hidden, vocab] copy of the LM head, refreshed every call ("transposed")
        self._alloc_shape = (0, 0)
        self._buffers: dict[str, Any] = {}
        self._graphs: dict[tuple, Any] = {}
        self._pool = None
        self._vocab = model.get_output_embeddings().weight.shape[0]
        self._kept: _Kept | None = None   # the last call's rows, for `resume`
        self.resumed_calls = 0            # calls that kept the cache (benchmarks report it)

    def _layer_kernels(self, model: Any, layers: str) -> Any:
        """train/fast_layers.py's functions for the layers, or None to call the modules."""
        if layers not in typing.get_args(LayerChoice):
            raise ValueError(f"layers must be one of {typing.get_args(LayerChoice)}, got {layers!r}")
        cuda = self.device.type == "cuda"
        if layers == "auto":
            layers = "compiled" if cuda and fast_layers.supported(model) else "model"
        if layers == "model":
            return None
        if not fast_layers.supported(model):
            raise ValueError(f"layers={layers!r} needs SiLU MLPs without biases and plain linear projections "
                             f"(no LoRA adapters); use layers='model'")
        return fast_layers.LayerKernels(model, compiled=layers == "compiled" and cuda)

    # -- buffers ------------------------------------------------------------------------
    def _ensure_buffers(self, batch: int, length: int) -> None:
        """Allocate (or grow) the cache and step buffers; growing drops captured graphs."""
        import torch

        b0, s0 = self._alloc_shape
        if batch <= b0 and length <= s0:
            return
        batch, length = max(batch, b0), max(length, s0)
        self._buffers.clear()
        # Dropping the graphs frees their memory pool; a new pool is needed for the next
        # capture (capturing into the freed pool's handle trips an allocator assert).
        self._graphs.clear()
        self._pool = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        kv = (batch, self.n_kv, length, self.head_dim)
        dev, n_layers = self.device, len(self.model.model.layers)
        self._buffers = {
            "keys": [torch.zeros(kv, dtype=self.dtype, device=dev) for _ in range(n_layers)],
            "values": [torch.zeros(kv, dtype=self.dtype, device=dev) for _ in range(n_layers)],
            "bias": torch.full((batch, length), float("-inf"), dtype=self.dtype, device=dev),
            "tok": torch.zeros(batch, dtype=torch.long, device=dev),
            "pos": torch.zeros(batch, dtype=torch.long, device=dev),
            "wpos": torch.zeros(1, dtype=torch.long, device=dev),
            "j": torch.zeros(1, dtype=torch.long, device=dev),
            "noise": torch.zeros((batch, self._vocab), dtype=torch.float32, device=dev),
            "out_tok": torch.zeros((batch, self.check_every), dtype=torch.long, device=dev),
            "out_lp": torch.zeros((batch, self.check_every), dtype=torch.float32, device=dev),
        }
        self._alloc_shape = (batch, length)

    def _state(self, batch: int, length: int) -> _State:
        b = self._buffers
        return _State(tok=b["tok"][:batch], pos=b["pos"][:batch], wpos=b["wpos"], j=b["j"],
                      bias=b["bias"][:batch, :length], noise=b["noise"][:batch],
                      out_tok=b["out_tok"][:batch], out_lp=b["out_lp"][:batch],
                      keys=[k[:batch, :, :length] for k in b["keys"]],
                      values=[v[:batch, :, :length] for v in b["values"]])

    # -- the model, piecewise ---------------------------------------------------------------
    def _qkv(self, attn: Any, h: Any, cos: Any, sin: Any) -> tuple[Any, Any, Any]:
        bsz, t, _ = h.shape
        q = attn.q_proj(h).view(bsz, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(bsz, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(bsz, t, self.n_kv, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        return fast_layers.rope(q, cos, sin), fast_layers.rope(k, cos, sin), v

    def _prefill(self, ids: Any, valid: Any, st: _State, start: int = 0, pos0: Any = None) -> Any:
        """Run the prompts through the model into cache columns [start, start + width); logits
        of the last position. With `start` > 0 (a resumed call) they also attend to the cached
        columns before `start` that the bias leaves open, and row r's positions begin at pos0[r]."""
        import torch
        import torch.nn.functional as F

        m = self.model.model
        bsz, width = ids.shape
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        if pos0 is not None:
            pos = pos + pos0[:, None]
        ctx = start + width
        causal = torch.ones((width, width), dtype=torch.bool, device=ids.device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=ids.device)
        rows = max(1, self.prefill_elements // (width * ctx))
        if start:   # a few appended tokens against the whole kept cache: bound its per-head copies too
            rows = min(rows, max(1, self.prefill_elements // (2 * self.n_heads * self.head_dim * ctx)))
        logits = []
        groups = self.n_heads // self.n_kv
        for r0 in range(0, bsz, rows):
            sl = slice(r0, min(bsz, r0 + rows))
            # Padding queries attend to themselves so no row of the softmax is empty (no NaN).
            mask = (causal[None] & valid[sl, None, :]) | eye[None]
            if start:
                cached = (st.bias[sl, :start] == 0)[:, None, :].expand(-1, width, -1)
                mask = torch.cat([cached, mask], dim=-1)
            mask = mask[:, None]
            x = m.embed_tokens(ids[sl])
            cos, sin = m.rotary_emb(x, pos[sl])
            for i, layer in enumerate(m.layers):
                h = layer.input_layernorm(x)
                q, k, v = self._qkv(layer.self_attn, h, cos, sin)
                st.keys[i][sl, :, start:ctx] = k
                st.values[i][sl, :, start:ctx] = v
                if start:
                    k, v = st.keys[i][sl, :, :ctx], st.values[i][sl, :, :ctx]
                if groups > 1:
                    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
                x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(x.shape[0], width, -1))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            logits.append(self.model.lm_head(m.norm(x[:, -1:]))[:, 0])
        return torch.cat(logits)

    def _attend(self, q: Any, keys: Any, values: Any, bias: Any) -> Any:
        """One query per row against the whole static cache; GQA by grouping, no copies."""
        import torch

        if self.attention == "sdpa":
            import torch.nn.functional as F

            return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias[:, None, None, :],
                                                  scale=self.scaling, enable_gqa=True)
        bsz = q.shape[0]
        groups = self.n_heads // self.n_kv
        qg = q.view(bsz, self.n_kv, groups, self.head_dim)
        scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * self.scaling
        scores = scores + bias[:, None, None, :].float()
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        return torch.matmul(probs, values).view(bsz, self.n_heads, 1, self.head_dim)

    def _step(self, st: _State, sampling: RolloutSampling) -> None:
        """One decode step on device buffers only (this is what a CUDA graph captures)."""
        m = self.model.model
        bsz = st.tok.shape[0]
        x = m.embed_tokens(st.tok[:, None])
        cos, sin = m.rotary_emb(x, st.pos[:, None])
        st.bias.index_fill_(1, st.wpos, 0.0)
        kern = self._kernels
        for i, layer in enumerate(m.layers):
            if kern is None:
                q, k, v = self._qkv(layer.self_attn, layer.input_layernorm(x), cos, sin)
            else:
                q, k, v = kern.before(i, x, cos, sin)
            st.keys[i].index_copy_(2, st.wpos, k)
            st.values[i].index_copy_(2, st.wpos, v)
            o = self._attend(q, st.keys[i], st.values[i], st.bias).transpose(1, 2).reshape(bsz, 1, -1)
            if kern is None:
                x = x + layer.self_attn.o_proj(o)
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            else:
                x = kern.after(i, x, o)
        logits = self._logits(m.norm(x))[:, 0]
        tok, lp = self._sample(logits, sampling, st.noise)
        st.out_tok.index_copy_(1, st.j, tok[:, None])
        st.out_lp.index_copy_(1, st.j, lp[:, None])
        st.tok.copy_(tok)
        st.pos.add_(1)
        st.wpos.add_(1)
        st.j.add_(1)

    def _logits(self, h: Any) -> Any:
        if self._lm_t is None:
            return self.model.lm_head(h)
        return h @ self._lm_t

    def _refresh_lm_head(self) -> None:
        """Copy the LM head's current weight into the [hidden, vocab] buffer graphs read."""
        if self.lm_head != "transposed":
            return
        weight = self.model.get_output_embeddings().weight
        if self._lm_t is None:
            self._lm_t = weight.detach().t().contiguous()
        else:
            self._lm_t.copy_(weight.detach().t())

    def _runner(self, st: _State, sampling: RolloutSampling, key: tuple) -> Any:
        """A callable doing one step: a replayed CUDA graph, or the eager step."""
        if not self.use_graphs:
            return lambda: self._step(st, sampling)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(st, sampling)
            self._graphs[key] = graph
        return graph.replay

    def _capture(self, st: _State, sampling: RolloutSampling) -> Any:
        """Warm up on a side stream, then capture; buffers are reset by the caller afterwards."""
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # Warm up on the last two columns: inside the bucket (earlier calls moved these on), and
        # past every column a resumed call keeps (they end before this call's prompts).
        st.wpos.fill_(st.bias.shape[1] - 2)
        st.pos.zero_()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                st.j.zero_()
                self._step(st, sampling)
        torch.cuda.current_stream().wait_stream(stream)
        st.j.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._step(st, sampling)
        return graph

    # -- the public call ----------------------------------------------------------------------
    def decode(self, prefixes: Sequence[Sequence[int]], max_new: Sequence[int], sampling: RolloutSampling,
               generator: Any, resume: bool = False) -> list[TurnOutput]:
        """One turn for every row. `resume=True` promises that the weights have not changed since
        the last call; each prefix that extends one of its rows (in order) then keeps its cache."""
        import torch

        with torch.inference_mode():
            return self._decode(prefixes, max_new, sampling, generator, resume)

    def _decode(self, prefixes, max_new, sampling, generator, resume) -> list[TurnOutput]:
        n = len(prefixes)
        rows = [self.scanner.start(mx) for mx in max_new]
        steps = max(max_new, default=0)
        if n == 0 or steps == 0:
            return [r.output() for r in rows]
        generator = None if sampling.greedy else turn_generator(generator, self.device)
        kept, self._kept = self._kept, None   # what this call leaves is recorded at its end
        src = _match(kept, prefixes) if resume and kept is not None else None
        grow = 0   # the cache length resuming needed, when the buffers were shorter
        if src is not None:
            start, segments = kept.end, [p[len(kept.ids[r]):] for p, r in zip(prefixes, src)]
            width = max(len(p) for p in segments)
            # A kept cache too short for this turn would need a second, longer one beside it while
            # copying (twice the memory): prefill the whole prefixes instead, which also drops the
            # slots the rows left unused, into buffers grown to what resuming needed. They never
            # shrink, so the next batches' turns of this shape resume.
            need = _bucket(start + width + steps, self.length_bucket)
            if need > self._alloc_shape[1]:
                src, grow = None, need
        if src is None:
            start, segments, width = 0, prefixes, max(len(p) for p in prefixes)
        batch = _pow2(n) if self.use_graphs else n
        length = _bucket(start + width + steps, self.length_bucket)
        self._ensure_buffers(batch, max(length, grow))
        self._refresh_lm_head()   # the weights may have changed since the last call (RL)
        st = self._state(batch, length)
        # Capture before filling the cache: warm-up steps scribble on the buffers (past `start`).
        run_step = self._runner(st, sampling, (batch, length, sampling)) if steps > 1 else None
        pos0 = self._gather(kept, src, batch) if src is not None else None
        self.resumed_calls += src is not None

        # Dummy rows (batch padding) get a one-token prompt so no softmax row is empty.
        padded = list(segments) + [[self.pad_id]] * (batch - n)
        ids, valid = left_pad(padded, self.pad_id, self.device)
        valid = valid.bool()
        st.bias[:, start:].fill_(float("-inf"))
        st.bias[:, start:start + width].masked_fill_(valid, 0.0)
        logits = self._prefill(ids, valid, st, start, pos0)
        noise = None if sampling.greedy else new_noise((batch, self._vocab), generator, self.device)
        tok, lp = self._sample(logits, sampling, noise)
        st.tok.copy_(tok)
        st.pos.copy_(valid.long().sum(-1) + (0 if pos0 is None else pos0))
        st.wpos.fill_(start + width)
        self._feed(rows, tok[:n, None].tolist(), lp[:n, None].tolist())

        done = 1
        while done < steps and not all(r.finish is not None for r in rows):
            chunk = min(self.check_every, steps - done)
            st.j.zero_()
            for _ in range(chunk):
                if not sampling.greedy:
                    new_noise(st.noise.shape, generator, self.device, out=st.noise)
                run_step()
            done += chunk
            self._feed(rows, st.out_tok[:n, :chunk].tolist(), st.out_lp[:n, :chunk].tolist())
        outs = [r.output() for r in rows]
        # The cache now holds each prompt and the generated tokens fed back before the last kept
        # one (that one was sampled, and written only if the row went on stepping).
        fed = [max(len(o.ids) - 1, 0) for o in outs]
        self._kept = _Kept(ids=[list(p) + o.ids[:f] for p, o, f in zip(prefixes, outs, fed)], fed=fed,
                           start=start + width, end=start + width + done - 1)
        return outs

    def _gather(self, kept: _Kept, src: list[int], batch: int) -> Any:
        """Move the kept rows `src` to the front of the cache, mask the slots each wrote after
        its kept tokens (and every slot of the dummy rows); their next positions."""
        import torch

        n, end, buf = len(src), kept.end, self._buffers   # whole buffers: src may lie past `batch`
        if src != list(range(n)):
            idx = torch.tensor(src, device=self.device)
            for cache in (*buf["keys"], *buf["values"]):
                cache[:n, :, :end] = cache[idx, :, :end]
            buf["bias"][:n, :end] = buf["bias"][idx, :end]
        fed = torch.tensor([kept.fed[r] for r in src], device=self.device)
        cols = torch.arange(end, device=self.device)
        buf["bias"][:n, :end].masked_fill_(cols[None, :] >= kept.start + fed[:, None], float("-inf"))
        buf["bias"][n:batch, :end].fill_(float("-inf"))
        return torch.tensor([len(kept.ids[r]) for r in src] + [0] * (batch - n), device=self.device)

    @staticmethod
    def _feed(rows: list, toks: list[list[int]], lps: list[list[float]]) -> None:
        for r, t, l in zip(rows, toks, lps):
            r.feed(t, l)


def _match(kept: _Kept, prefixes: Sequence[Sequence[int]]) -> list[int] | None:
    """For each prefix, in order, the next kept row it strictly extends; None if one has none."""
    src, r = [], 0
    for p in prefixes:
        while r < len(kept.ids) and not (len(p) > len(kept.ids[r]) and list(p[:len(kept.ids[r])]) == kept.ids[r]):
            r += 1
        if r == len(kept.ids):
            return None
        src.append(r)
        r += 1
    return src
