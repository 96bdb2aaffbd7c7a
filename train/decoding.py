"""Batched decoding of one turn for many rows: the parts every engine shares.

A rollout turn gives each row a prefix (token ids: prompt plus everything
appended so far) and a budget of new tokens. An engine decodes all rows in one
left-padded batch and returns, per row, the sampled ids and their log-probs,
cut right after the token that completes a stop string (`</search>`,
`</answer>`) or before an end-of-sequence token.

This module holds what is independent of how the forward pass is run:

- `RolloutSampling` and `sample_next`: temperature / top-p sampling by the Gumbel-max
  trick. The noise comes from one `torch.rand` call per step with a per-turn
  generator (`turn_generator`), so the plain and the fast engine draw
  identical tokens from identical logits, and a seed reproduces a run.
- `StopScanner`: host-side stop detection on token pieces.
- `PlainDecoder`: the reference engine, a step-by-step loop over the
  transformers model with its dynamic KV cache and a host check every step.
  It is simple and obviously right; `fast_decode.FastDecoder` must match it.

Log-probs are those of the policy the tokens were sampled from, before top-p
truncation: `log_softmax(logits / temperature)` at the sampled id (what PPO's
ratio and the DGPO teacher term use; a forward pass over the finished
sequence recomputes them, which the tests check).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

#: The rollout decoders: auto (fast where the architecture allows), fast (static cache, CUDA graphs), plain.
DecoderChoice = Literal["auto", "fast", "plain"]
#: The fast engine's attention over its static cache: fused SDPA, or two matmuls and a float32 softmax.
AttentionChoice = Literal["sdpa", "matmul"]
#: The fast engine's layers around attention: the modules, or train/fast_layers.py's functions
#: compiled by torch.compile on CUDA ("compiled"; eager elsewhere) or eager ("functional"); "auto":
#: compiled on CUDA where the layers allow it, the modules elsewhere.
LayerChoice = Literal["auto", "model", "compiled", "functional"]
#: The fast engine's LM head: the model's module, or a matmul with a [hidden, vocab] copy of its
#: weight ("transposed"); "auto": transposed on CUDA.
LMHeadChoice = Literal["auto", "model", "transposed"]


@dataclass(frozen=True)
class RolloutSampling:
    """How the rollout decoders choose the next token: a `greedy` flag, and a temperature > 0 that
    also scales the reported log-probs (unlike `engines.Sampling`, where temperature 0 is greedy)."""

    greedy: bool = False
    temperature: float = 1.0    # also scales the reported log-probs
    top_p: float = 1.0          # nucleus; 1.0 = the full distribution

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class TurnOutput:
    """One row's generated turn."""

    ids: list[int]
    logprobs: list[float]
    finish: str   # "stop" (a stop string), "eos", or "length" (budget reached)


def sample_next(logits: Any, sampling: RolloutSampling, noise: Any | None = None) -> tuple[Any, Any]:
    """(token ids [B], their log-probs [B]) from logits [B, V].

    `noise` is uniform(0, 1) of the logits' shape (ignored when greedy). All
    work stays on the device: no host sync, so a CUDA graph can capture it.
    """
    import torch

    logp = torch.log_softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.greedy:
        tokens = logp.argmax(dim=-1)
    else:
        scores = logp
        if sampling.top_p < 1.0:
            scores = _nucleus(logp, sampling.top_p)
        # Gumbel-max: argmax(log p + G) is a draw from softmax(log p).
        gumbel = -torch.log(-torch.log(noise.clamp(min=1e-20, max=1.0 - 1e-7)))
        tokens = (scores + gumbel).argmax(dim=-1)
    return tokens, logp.gather(-1, tokens[:, None])[:, 0]


def _nucleus(logp: Any, top_p: float) -> Any:
    """log-probs with every token outside the top-p nucleus set to -inf."""
    import torch

    sorted_lp, order = logp.sort(dim=-1, descending=True)
    cum = sorted_lp.exp().cumsum(dim=-1)
    # Keep a token when the mass before it is < top_p (the first one always).
    drop_sorted = (cum - sorted_lp.exp()) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logp.masked_fill(drop, float("-inf"))


# --- stop detection -------------------------------------------------------------

class StopScanner:
    """Finds where each row's turn ends, from token pieces decoded on the host.

    A stop string may span several tokens or end inside one (`>\\n`); the turn
    keeps every token up to and including the one that completes it, as
    sampled. An end-of-sequence id ends the turn and is not kept.

    Only a token whose piece holds the last character of a stop string can
    complete one, so rows are scanned a block at a time: the tokens between
    such "watched" tokens (and end-of-sequence ids) are appended in bulk and
    only the watched ones are checked. At batch 512 this is what keeps the host
    from stalling the GPU between chunks of decode steps.
    """

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str], eos_ids: Iterable[int]):
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self._tail = max((len(s) for s in self.stop_strings), default=0)
        self._last_chars = frozenset(s[-1] for s in self.stop_strings if s)
        self._pieces: dict[int, str] = {}
        self._watched: dict[int, bool] = {}

    def piece(self, token_id: int) -> str:
        p = self._pieces.get(token_id)
        if p is None:
            p = self.tokenizer.decode([token_id], skip_special_tokens=False,
                                      clean_up_tokenization_spaces=False)
            self._pieces[token_id] = p
        return p

    def watched(self, token_id: int) -> bool:
        """Whether this id ends the turn (eos) or may complete a stop string."""
        w = self._watched.get(token_id)
        if w is None:
            w = token_id in self.eos_ids or any(c in self.piece(token_id) for c in self._last_chars)
            self._watched[token_id] = w
        return w

    def next_watched(self, ids: Sequence[int], start: int, end: int) -> int:
        """Index of the first watched id in ids[start:end], else `end`."""
        known, watched = self._watched, self.watched
        for k in range(start, end):
            w = known.get(ids[k])
            if w or (w is None and watched(ids[k])):
                return k
        return end

    def start(self, max_new: int) -> _RowScan:
        return _RowScan(self, max_new)


class _RowScan:
    """Stop state of one row; `feed` new ids until `finish` is set."""

    def __init__(self, scanner: StopScanner, max_new: int):
        self.scanner = scanner
        self.max_new = max_new
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None if max_new > 0 else "length"

    def feed(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        sc, i, n = self.scanner, 0, len(ids)
        while i < n and self.finish is None:
            end = min(n, i + self.max_new - len(self.ids))
            j = sc.next_watched(ids, i, end)
            self.ids.extend(int(t) for t in ids[i:j])     # no stop can end in these
            self.logprobs.extend(float(x) for x in logprobs[i:j])
            if j == end:
                if len(self.ids) >= self.max_new:
                    self.finish = "length"
                return
            self._take(int(ids[j]), float(logprobs[j]))
            i = j + 1

    def _take(self, tid: int, lp: float) -> None:
        """One watched token: eos ends the turn unkept; else keep it and look for a stop."""
        sc = self.scanner
        if tid in sc.eos_ids:
            self.finish = "eos"
            return
        # Only the text just before this token plus its piece can newly contain a stop string.
        window = self._tail_text() + sc.piece(tid)
        self.ids.append(tid)
        self.logprobs.append(lp)
        if any(s in window for s in sc.stop_strings):
            self.finish = "stop"
        elif len(self.ids) >= self.max_new:
            self.finish = "length"

    def _tail_text(self) -> str:
        """The last `tail` characters of the kept tokens' pieces, joined."""
        sc, parts, size = self.scanner, [], 0
        for tid in reversed(self.ids):
            if size >= sc._tail:
                break
            parts.append(sc.piece(tid))
            size += len(parts[-1])
        return "".join(reversed(parts))[-sc._tail:] if sc._tail else ""

    def output(self) -> TurnOutput:
        return TurnOutput(self.ids, self.logprobs, self.finish or "length")


# --- batching helpers -------------------------------------------------------------

def left_pad(prefixes: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[Any, Any]:
    """(ids [B, P], attention mask [B, P]) with every prefix right-aligned."""
    import torch

    if any(len(p) == 0 for p in prefixes):
        raise ValueError("every prefix needs at least one token")
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for i, p in enumerate(prefixes):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def pad_id_of(tokenizer: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        v = getattr(tokenizer, name, None)
        if isinstance(v, int):
            return v
    return 0


def model_eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """End-of-sequence ids from the tokenizer and the model's generation config."""
    ids: set[int] = set()
    cands = [getattr(tokenizer, "eos_token_id", None)]
    gen = getattr(model, "generation_config", None)
    cands.append(getattr(gen, "eos_token_id", None) if gen is not None else None)
    for c in cands:
        if isinstance(c, int):
            ids.add(c)
        elif isinstance(c, (list, tuple)):
            ids.update(int(x) for x in c)
    # Chat models end a turn with their end-of-message token.
    for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
        tid = tokenizer.convert_tokens_to_ids(tok) if hasattr(tokenizer, "convert_tokens_to_ids") else None
        if isinstance(tid, int) and tid != getattr(tokenizer, "unk_token_id", None):
            ids.add(tid)
    return ids


def turn_generator(generator: Any, device: Any) -> Any:
    """A generator for one decode call, seeded by one draw from the caller's.

    Every call advances the caller's generator by exactly one draw, however
    many steps the call runs or how an engine chunks them, so two engines
    stay in step across the turns of an episode.
    """
    import torch

    if generator is None:
        return None
    seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())
    return torch.Generator(device=device).manual_seed(seed)


def new_noise(shape: tuple[int, int], generator: Any, device: Any, out: Any | None = None) -> Any:
    import torch

    if out is not None:
        return torch.rand(out.shape, generator=generator, device=out.device, out=out)
    return torch.rand(shape, generator=generator, device=device)


# --- the reference engine -------------------------------------------------------------

class PlainDecoder:
    """Step-by-step decoding with the model's own forward and dynamic KV cache.

    One host sync per step (stop checks); the reference the fast engine is
    tested against, and the engine for models the fast one does not cover.
    """

    name = "plain"

    def __init__(self, model: Any, tokenizer: Any, stop_strings: Sequence[str], eos_ids: Iterable[int]):
        self.model = model
        self.tokenizer = tokenizer
        self.scanner = StopScanner(tokenizer, stop_strings, eos_ids)
        self.pad_id = pad_id_of(tokenizer)
        # transformers renamed `past_key_values` to `cache` (5.2x); speak whichever this one takes.
        import inspect

        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def decode(self, prefixes: Sequence[Sequence[int]], max_new: Sequence[int], sampling: RolloutSampling,
               generator: Any, resume: bool = False) -> list[TurnOutput]:
        """One turn for every row (`resume` is accepted for the fast engine's sake: this one keeps
        no cache between calls)."""
        import torch

        device = next(self.model.parameters()).device
        rows = [self.scanner.start(m) for m in max_new]
        generator = None if sampling.greedy else turn_generator(generator, device)
        ids, mask = left_pad(prefixes, self.pad_id, device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        vocab = None
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            cache = getattr(out, self._cache_arg)
            for _ in range(max(max_new, default=0)):
                logits = out.logits[:, -1]
                vocab = vocab or logits.shape[-1]
                noise = None if sampling.greedy else new_noise((len(rows), vocab), generator, device)
                tok, lp = sample_next(logits, sampling, noise)
                tok_list, lp_list = tok.tolist(), lp.tolist()
                for r, t, l in zip(rows, tok_list, lp_list):
                    r.feed([t], [l])
                if all(r.finish is not None for r in rows):
                    break
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
                pos = pos[:, -1:] + 1
                out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos,
                                 use_cache=True, **{self._cache_arg: cache})
                cache = getattr(out, self._cache_arg)
        return [r.output() for r in rows]
