"""One interface for every inference engine, with KV-cache reuse across calls.

An agent's transcript is append-only: each turn continues the token ids of the
previous call plus whatever the environment appended (an information block,
the invalid-action feedback). An `Engine` therefore keeps the ids whose keys
and values are in its cache and, on the next `generate(ids)`, evaluates only
what lies after the longest common prefix of the two. Turn t+1 never
re-processes turn t; `GenerationResult.prompt_tokens` says how many ids a call
did evaluate.

The decoding loop lives here, once, for all engines: an engine implements four
hooks (`_truncate`, `_evaluate`, `_logits`, plus tokenizer access) and
`generate` does greedy or seeded sampling, EOS and stop-string handling,
streaming and timing the same way everywhere. Greedy decoding (temperature 0)
is an argmax over the logits, so two engines that compute the same logits pick
the same tokens.

Stop strings. A turn ends at the first `</search>` or `</answer>` (they stay in
its text). A tokenizer may merge the stop string's last characters with what
follows (Qwen2's BPE has `>\\n\\n` as one token; see docs/protocol.md), so the
token that completes a stop string can carry text past it. The result then
keeps the ids before that token plus the *encoding of the missing piece* of
text: decoding `token_ids` gives exactly `text`, which ends with the stop
string. The cache still holds the sampled token; the next call notices that
the ids diverge there and re-evaluates from that point only.

Engines import their backends lazily: `import dgpo_edge.engines` costs nothing,
and a missing backend raises InputError naming the package to install.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import protocol
from ..chat_template import ChatTemplate

#: Tokens that end a chat turn in the models this project runs (Qwen2, SmolLM2, Llama 3).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")

FINISH_REASONS = ("stop", "eos", "length", "stopped")


@dataclass(frozen=True)
class Sampling:
    """How to pick the next token. `temperature == 0` is greedy (argmax; the rest is ignored).

    `top_k_tokens` keeps the k most likely tokens; it is not `ProtocolConfig.top_k`
    (passages per search), hence the longer name."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k_tokens: int = 0     # 0: no top-k cut
    seed: int | None = None   # None: a fresh random stream per engine

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k_tokens < 0:
            raise ValueError(f"top_k_tokens must be >= 0, got {self.top_k_tokens}")
        if self.seed is not None and self.seed < 0:   # numpy's generators take none below 0
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling()


@dataclass
class GenerationResult:
    """What one `generate` call produced and what it cost."""

    token_ids: list[int]      # the new ids to append: cut at the stop string, no EOS
    text: str                 # decode(token_ids); ends with `stop` when finish == "stop"
    finish: str               # stop | eos | length | stopped
    stop: str | None = None   # the stop string that ended the turn
    prompt_tokens: int = 0    # ids evaluated before the first new token (after cache reuse)
    cached_tokens: int = 0    # ids reused from the cache
    new_tokens: int = 0       # tokens sampled (the stop-completing one and EOS included)
    prompt_s: float = 0.0     # time evaluating the prompt suffix
    decode_s: float = 0.0     # time sampling and evaluating new tokens

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0


class Generation:
    """A running generation: iterate for text deltas, then read `result`.

    `close()` (or leaving a `for` loop and calling it) stops early; `result`
    then holds what was generated so far with finish "stopped". Iterating to
    the end and calling `result` before the end both work: `result` drains
    the remaining deltas first.
    """

    def __init__(self, steps: Iterator[str], holder: dict[str, GenerationResult]):
        self._steps = steps
        self._holder = holder

    def __iter__(self) -> Iterator[str]:
        return self._steps

    def __next__(self) -> str:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()  # type: ignore[attr-defined]

    @property
    def result(self) -> GenerationResult:
        if "result" not in self._holder:
            for _ in self._steps:
                pass
        if "result" not in self._holder:  # closed before it started: nothing was evaluated
            self._holder["result"] = GenerationResult(token_ids=[], text="", finish="stopped")
        return self._holder["result"]


class Engine(ABC):
    """A causal LM behind a tokenizer, generating continuations of token ids.

    Attributes every engine sets: `name` (backend), `model_path`, `n_ctx`
    (the context the cache holds), `threads`, `stop` (default stop strings),
    `chat_template` (a ChatTemplate or None), `eos_ids` (ids that end a turn).
    """

    name: str = "engine"
    model_path: str = ""
    n_ctx: int = 4096
    threads: int | None = None
    stop: tuple[str, ...] = protocol.STOP_STRINGS
    chat_template: ChatTemplate | None = None
    eos_ids: frozenset[int] = frozenset()

    def __init__(self) -> None:
        self._cache: list[int] = []       # ids whose K/V the backend holds, in order
        self._rng = np.random.default_rng()

    # -- tokenizer ---------------------------------------------------------------------------
    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: special tokens written in it are recognised, no BOS is added."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids` (special tokens rendered as written)."""

    def encode_text(self, text: str) -> list[int]:
        """Token ids of `text` read as plain text: a special or added token written in it
        (a passage's `<|im_end|>` or `<file_sep>`) is never recognised. For observations
        and feedback; no BOS is added."""
        plain = getattr(self, "_plain_encode", None)
        if plain is None:
            from ..tokens import plain_encoder

            plain = self._plain_encode = plain_encoder(self._encode_unparsed, self.added_tokens())
        return plain(text)

    def added_tokens(self) -> list[str]:
        """The text of every special or added token of the vocabulary (none known by default)."""
        return []

    def _encode_unparsed(self, text: str) -> list[int]:
        """`encode` with special-token parsing off where the backend has the switch."""
        return self.encode(text)

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    def count_text_tokens(self, text: str) -> int:
        """Tokens of `text` as `encode_text` encodes it (what an observation costs)."""
        return len(self.encode_text(text))

    def render_prompt(self, question: str) -> str:
        """The Search-R1 prompt for `question` in this model's chat template."""
        return protocol.render_prompt(question, self.chat_template)

    def token_id(self, text: str) -> int | None:
        """The id of a token written as `text` (a special token), or None."""
        ids = self.encode(text)
        return ids[0] if len(ids) == 1 else None

    # -- backend hooks -------------------------------------------------------------------------
    @abstractmethod
    def _truncate(self, keep: int) -> None:
        """Drop cached positions from `keep` on (`self._cache` is trimmed by the caller)."""

    @abstractmethod
    def _evaluate(self, ids: Sequence[int]) -> None:
        """Run `ids` after the cached positions; the logits of the last one become current."""

    @abstractmethod
    def _logits(self) -> np.ndarray:
        """Current next-token logits, float32 of shape [vocab] (a view is fine)."""

    # -- cache ------------------------------------------------------------------------------------
    @property
    def cached_ids(self) -> list[int]:
        """Ids whose K/V the engine holds (a copy)."""
        return list(self._cache)

    def reset(self) -> None:
        """Forget the cache: the next call evaluates its whole prompt."""
        self._truncate(0)
        self._cache = []

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generation --------------------------------------------------------------------------------
    def generate(self, ids: Sequence[int], max_new_tokens: int, sampling: Sampling = GREEDY,
                 stop: Sequence[str] | None = None) -> Generation:
        """Continue `ids` by at most `max_new_tokens` tokens; iterate the result for text deltas.

        Only the ids after the longest prefix shared with the cache are
        evaluated. Generation ends at the first stop string (`self.stop` when
        `stop` is None), at an EOS id (dropped), after `max_new_tokens`, or when
        the context is full (finish "length" for both).
        """
        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("generate needs at least one prompt id")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if len(ids) > self.n_ctx:
            raise ValueError(f"the prompt has {len(ids)} tokens but the context holds {self.n_ctx}")
        stops = tuple(self.stop if stop is None else stop)
        holder: dict[str, GenerationResult] = {}
        return Generation(self._run(ids, max_new_tokens, sampling, stops, holder), holder)

    def _prefill(self, ids: list[int]) -> tuple[int, int]:
        """Bring the cache to `ids` (current logits: after the last id); (evaluated, reused)."""
        common = 0
        for a, b in zip(self._cache, ids):
            if a != b:
                break
            common += 1
        keep = min(common, len(ids) - 1)   # the last id is always run: its logits are needed
        if keep < len(self._cache):
            self._truncate(keep)
            del self._cache[keep:]
        self._evaluate(ids[keep:])
        self._cache.extend(ids[keep:])
        return len(ids) - keep, keep

    def _run(self, ids: list[int], max_new: int, sampling: Sampling, stops: tuple[str, ...],
             holder: dict[str, GenerationResult]) -> Iterator[str]:
        if sampling.seed is not None:
            self._rng = np.random.default_rng(sampling.seed)
        res = GenerationResult(token_ids=[], text="", finish="length")
        t0 = time.perf_counter()
        try:
            res.prompt_tokens, res.cached_tokens = self._prefill(ids)
        except BaseException:
            self.reset()  # the backend may hold a half-evaluated batch
            raise
        t1 = time.perf_counter()
        res.prompt_s = t1 - t0
        new: list[int] = []
        text = ""          # decode(new)
        emitted = 0        # characters of `text` already yielded
        longest = max((len(s) for s in stops), default=0)
        budget = min(max_new, self.n_ctx - len(ids))
        try:
            while len(new) < budget:
                tok = self._pick(self._logits(), sampling)
                res.new_tokens += 1
                if tok in self.eos_ids:
                    res.finish = "eos"
                    break
                new.append(tok)
                text = self.decode(new)
                hit = _find_stop(text, stops, max(0, emitted - longest))
                if hit is not None:
                    end, which = hit
                    new = self._cut(new, text, end)
                    text = text[:end]
                    res.finish, res.stop = "stop", which
                    if end > emitted:
                        yield text[emitted:end]
                        emitted = end
                    break
                if len(new) < budget:
                    self._evaluate([tok])
                    self._cache.append(tok)
                # Hold back a trailing replacement char: the next token may complete it.
                safe = len(text) - 1 if text.endswith("\ufffd") else len(text)
                if safe > emitted:
                    yield text[emitted:safe]
                    emitted = safe
            else:
                res.finish = "length"
            if emitted < len(text):
                yield text[emitted:]
        except GeneratorExit:
            res.finish = "stopped"
        except BaseException:
            self.reset()
            raise
        finally:
            res.decode_s = time.perf_counter() - t1
            res.token_ids = new
            res.text = text
            holder["result"] = res

    def _cut(self, new: list[int], text: str, end: int) -> list[int]:
        """Ids decoding to exactly `text[:end]`: whole tokens, then the encoded remainder."""
        if end == len(text):
            return new
        k = len(new) - 1                      # the last token completed the stop string
        head = self.decode(new[:k]) if k else ""
        if not text.startswith(head) or len(head) > end:
            return self.encode(text[:end])     # pathological: re-encode the whole turn
        return new[:k] + self.encode(text[len(head):end])

    def _pick(self, logits: np.ndarray, sampling: Sampling) -> int:
        if sampling.greedy:
            return int(np.argmax(logits))
        x = np.asarray(logits, dtype=np.float64) / sampling.temperature
        k = sampling.top_k_tokens
        if k and k < x.size:
            kth = np.partition(x, -k)[-k]
            x = np.where(x < kth, -np.inf, x)
        x -= x.max()
        p = np.exp(x)
        p /= p.sum()
        if sampling.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, sampling.top_p)) + 1]
            q = np.zeros_like(p)
            q[keep] = p[keep]
            p = q / q.sum()
        return int(self._rng.choice(p.size, p=p))

    # -- description ---------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What this engine runs, for manifests and `--json` output."""
        return {"engine": self.name, "model": self.model_path, "n_ctx": self.n_ctx, "threads": self.threads}


def _find_stop(text: str, stops: Sequence[str], start: int) -> tuple[int, str] | None:
    """(end index, stop string) of the earliest stop string in `text[start:]`, or None."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s, start)
        if i >= 0 and (best is None or i + len(s) < best[0]):
            best = (i + len(s), s)
    return best


def eos_ids_of(engine: Engine, extra: Sequence[int] = ()) -> frozenset[int]:
    """The engine's end-of-turn ids: `extra` plus the END_OF_TURN_TOKENS its vocabulary has."""
    ids = {int(i) for i in extra if i is not None and int(i) >= 0}
    for t in END_OF_TURN_TOKENS:
        tid = engine.token_id(t)
        if tid is not None:
            ids.add(tid)
    return frozenset(ids)
