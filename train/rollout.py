"""Batched multi-turn Search-R1 rollouts: the training side of the agent protocol.

`generate_rollouts` plays many episodes at once. Each round, every row that is
still running generates one turn (batched, one engine call), each row's
`dgpo_edge.episode.Episode` (the state machine the edge agent drives too)
decides what the turn does, all searches of the round go to the retriever in
one `search(queries, k)` call, and the observations are appended. After
`max_searches` rounds comes one last turn in which a search is not executed
(Search-R1's final rollout).

Each `Rollout` carries what PPO, GRPO and DGPO consume: the token ids of the
whole episode (segment-wise, as `Transcript.tokenize` builds them: a turn keeps
the ids the engine sampled, forced text is encoded on its own, observations and
feedback with special tokens read as text), the loss mask (1 on generated
tokens only), the sampling log-probs aligned with the ids, the transcript, the
answer and its exact-match score.

Engines: `fast_decode.FastDecoder` (static cache, CUDA graphs) for Llama and
Qwen2 models, `decoding.PlainDecoder` (the model's own forward) for anything
else; `engine="auto"` picks the fast one when it can.
"""

from __future__ import annotations

import functools
import time
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import protocol
from ..episode import Episode
from ..metrics import cover_exact_match, exact_match, f1_score
from ..protocol import ProtocolConfig
from ..retrieval.base import Retriever
from ..transcript import Transcript, encoder_for
from .decoding import AttentionChoice, DecoderChoice, LayerChoice, LMHeadChoice, PlainDecoder, RolloutSampling, model_eos_ids

ENGINES = typing.get_args(DecoderChoice)


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are generated.

    Protocol limits: `protocol` (top-k, searches, tokens per turn and per
    observation, total tokens; DGPO's defaults).
    Sampling: `temperature`, `top_p`, `greedy` (greedy ignores the other two
    for choosing tokens; log-probs are always `log_softmax(logits / T)`),
    `seed` (a run is reproducible from it).
    Batching: `batch_size` episodes per engine call; `engine` auto/fast/plain;
    `check_every` decode steps between the fast engine's stop checks;
    `attention`, `fused_sampling`, `layers` and `lm_head`: the fast engine's kernels
    (train/fast_decode.py; the defaults are the fastest measured, docs/benchmarks.md);
    `reuse_cache`: an episode's later turns keep the fast engine's cache of its earlier ones and
    prefill only what was appended (the observation), instead of the whole conversation.
    Prompt: `chat_template` wraps the instruction in the tokenizer's chat
    template when it has one (the released checkpoints' format).
    """

    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    seed: int = 0
    batch_size: int = 64
    engine: DecoderChoice = "auto"
    check_every: int = 32
    attention: AttentionChoice = "sdpa"
    fused_sampling: bool = True      # compiled sampling where the engine runs on CUDA (False: eager)
    layers: LayerChoice = "auto"     # auto: the layers' elementwise work fused by torch.compile on CUDA
    lm_head: LMHeadChoice = "auto"   # auto: a [hidden, vocab] copy of the LM head on CUDA
    reuse_cache: bool = True         # later turns prefill only what was appended (fast engine)
    chat_template: bool = True

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.batch_size < 1 or self.check_every < 1:
            raise ValueError("batch_size and check_every must be >= 1")
        self.sampling()  # validates temperature and top_p

    def sampling(self) -> RolloutSampling:
        return RolloutSampling(greedy=self.greedy, temperature=self.temperature, top_p=self.top_p)


@dataclass
class Rollout:
    """One episode, ready for a policy-gradient step.

    `token_ids`, `loss_mask` and `logprobs` are aligned; `logprobs` is 0.0
    where the mask is 0. `finish` says how the episode ended: "answer",
    "final" (the last, search-free turn ended without an answer), or "budget"
    (`max_total_tokens` reached).
    """

    question: str
    golds: tuple[str, ...]
    transcript: Transcript
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    answer: str | None
    score: float
    n_searches: int
    n_invalid: int
    finish: str

    @property
    def prompt_length(self) -> int:
        return next((i for i, m in enumerate(self.loss_mask) if m), len(self.loss_mask))

    @property
    def n_generated(self) -> int:
        return sum(self.loss_mask)


def _result(e: Episode, golds: tuple[str, ...]) -> Rollout:
    """The finished episode as a Rollout scored against `golds`."""
    t = e.transcript
    answer = t.answer()
    return Rollout(t.question, golds, t, e.ids, e.mask, e.logprobs, answer,
                   exact_match(answer, golds) if golds else 0.0,
                   len(t.searches()), t.n_invalid, e.finish or "final")


def make_engine(model: Any, tokenizer: Any, config: RolloutConfig) -> Any:
    """The decoder for `config.engine` (auto: fast when the model's architecture allows)."""
    from . import fast_decode

    eos = model_eos_ids(model, tokenizer)
    if config.engine == "fast" or (config.engine == "auto" and fast_decode.supports(model)):
        return fast_decode.FastDecoder(model, tokenizer, protocol.STOP_STRINGS, eos,
                                       check_every=config.check_every, attention=config.attention,
                                       fused_sampling=None if config.fused_sampling else False,
                                       layers=config.layers, lm_head=config.lm_head)
    return PlainDecoder(model, tokenizer, protocol.STOP_STRINGS, eos)


def render(question: str, tokenizer: Any, config: RolloutConfig) -> str:
    """The prompt text: the Search-R1 instruction, in the chat template when asked and present."""
    use_template = config.chat_template and getattr(tokenizer, "chat_template", None)
    return protocol.render_prompt(question, tokenizer if use_template else None)


def observation_blocks(tokenizer: Any) -> protocol.InformationBlocks:
    """Information blocks counted as the episodes count them (`plain` tokens), with a memory.

    Hold one across calls of `generate_rollouts` (an RL run does): the passages of an epoch's
    searches come back the next epoch, and a remembered block is not tokenized again. A round's
    new blocks are fitted together through the tokenizer's batch encoder when it has one and
    that encoder counts as `plain` does (checked here on protocol text).
    """
    from dgpo_edge.tokens import added_token_strings, batch_encoder, plain_batch_encoder

    plain = encoder_for(tokenizer).plain
    count = lambda text: len(plain(text))  # noqa: E731
    many = batch_encoder(tokenizer)
    plain_many = plain_batch_encoder(many, added_token_strings(tokenizer)) if many else None
    probe = [protocol.render_prompt("Who is 'Ada'?  <|im_end|>"), protocol.INVALID_ACTION_FEEDBACK, " x\n\n"]
    if plain_many is not None and plain_many(probe) != [plain(t) for t in probe]:
        plain_many = None   # a tokenizer whose Python side adds to the Rust encoder: one text at a time
    return protocol.InformationBlocks(count, encode_many=plain_many)


def generate_rollouts(model: Any, tokenizer: Any, questions: Sequence[str],
                      golds: Sequence[Sequence[str]] | None, retriever: Retriever | None,
                      config: RolloutConfig = RolloutConfig(), engine: Any | None = None,
                      on_batch: Any | None = None, timings: dict | None = None,
                      blocks: protocol.InformationBlocks | None = None) -> list[Rollout]:
    """Play one episode per question, `config.batch_size` at a time; results in input order.

    `golds` (aliases per question) gives each rollout its EM score; None scores 0.
    `retriever` may be None only when `max_searches` is 0. Pass `engine` to
    reuse one decoder (and its captured graphs) across calls; `on_batch(n)` is
    called after each batch of n episodes (progress bars). `timings`, when given,
    gains the seconds spent in the engine ("decode": prefill and decoding, the
    tokens back on the host) and in the retriever ("search"); the rest of the
    wall time is the host's own work between turns. `blocks` (from `observation_blocks` for
    this tokenizer) builds the observations with a memory kept across calls; by default each
    call has its own.
    """
    import torch

    if golds is not None and len(golds) != len(questions):
        raise ValueError(f"{len(questions)} questions but {len(golds)} gold lists")
    engine = engine or make_engine(model, tokenizer, config)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(config.seed)
    encode = encoder_for(tokenizer)
    blocks = blocks or observation_blocks(tokenizer)
    out: list[Rollout] = []
    was_training = model.training   # called from training loops: no dropout while sampling
    model.eval()
    try:
        for start in range(0, len(questions), config.batch_size):
            qs = questions[start:start + config.batch_size]
            gs = golds[start:start + config.batch_size] if golds is not None else [()] * len(qs)
            episodes = [Episode(q, render(q, tokenizer, config), encode, config.protocol, blocks=blocks) for q in qs]
            _play(episodes, engine, tokenizer, retriever, config, generator, timings, blocks)
            out.extend(_result(e, tuple(g)) for e, g in zip(episodes, gs))
            if on_batch is not None:
                on_batch(len(qs))
    finally:
        model.train(was_training)
    return out


def _play(episodes: list[Episode], engine: Any, tokenizer: Any, retriever: Retriever | None,
          config: RolloutConfig, generator: Any, timings: dict | None = None,
          blocks: protocol.InformationBlocks | None = None) -> None:
    """Run one batch of episodes to the end, one turn of every running row per engine call.

    The episodes decide answer / final turn / search / invalid feedback and the budgets
    (`dgpo_edge.episode`, as the laptop agent does); this loop only batches the turns and
    the searches of a round.
    """
    sampling = config.sampling()
    # The weights are fixed for the whole batch: its later turns may keep the engine's cache.
    resume = False
    while True:
        rows = [(e, n) for e in episodes if not e.done and (n := e.turn_tokens()) > 0]
        if not rows:
            return
        t0 = time.perf_counter()
        turns = engine.decode([e.ids for e, _ in rows], [n for _, n in rows], sampling, generator, resume=resume)
        resume = config.reuse_cache
        t1 = time.perf_counter()
        searching: list[tuple[Episode, str]] = []
        for (e, _), turn, text in zip(rows, turns, turn_texts(tokenizer, [t.ids for t in turns])):
            step = e.add_turn(text, turn.ids, turn.logprobs)
            if step.kind == "search":
                searching.append((e, step.query))
        t2 = time.perf_counter()
        _observe(searching, retriever, config.protocol, blocks)
        if timings is not None:
            timings["decode"] = timings.get("decode", 0.0) + t1 - t0
            timings["search"] = timings.get("search", 0.0) + time.perf_counter() - t2


def turn_texts(tokenizer: Any, rows: list[list[int]]) -> list[str]:
    """Each turn's text, as `tokenizer.decode(ids, skip_special_tokens=False,
    clean_up_tokenization_spaces=False)` gives it. A fast tokenizer's Rust backend decodes the
    round's turns in one parallel call, without transformers' per-row conversion of every id (at
    the paper's shape that conversion alone walked 1.28 M ids a step: bench/rollout_host.py)."""
    if _plain_fast_decode(type(tokenizer)):
        return tokenizer.backend_tokenizer.decode_batch(rows, skip_special_tokens=False)
    return [tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in rows]


@functools.cache
def _plain_fast_decode(cls: type) -> bool:
    """Whether `cls` decodes as transformers' fast-tokenizer base does: the Rust backend's decode, then
    the clean-up `turn_texts` turns off. A subclass that overrides `decode` or `_decode` (some speech
    and remote-code tokenizers) is decoded through its own methods."""
    try:
        from transformers import PreTrainedTokenizerFast as Fast
    except ImportError:   # pragma: no cover - transformers is a dependency of the training stage
        return False
    return issubclass(cls, Fast) and cls.decode is Fast.decode and cls._decode is Fast._decode


def _observe(searching: list[tuple[Episode, str]], retriever: Retriever | None, limits: protocol.ProtocolConfig,
             blocks: protocol.InformationBlocks | None = None) -> None:
    """All searches of a round in one retriever call; each row appends its observation. `blocks`,
    the episodes' shared `InformationBlocks`, fits the round's new observations together first."""
    if not searching:
        return
    if retriever is None:
        raise ValueError("a rollout issued a search but no retriever was given")
    results = retriever.search([q for _, q in searching], limits.top_k)
    if blocks is None or blocks.encode_many is None:
        for (e, query), passages in zip(searching, results):
            e.observe(query, passages)
        return
    # The round's blocks fitted and encoded in batch calls (the tokenizer's threads), then handed over.
    shown = [e.shown(p) for (e, _), p in zip(searching, results)]
    texts = blocks.many(shown, limits.max_obs_tokens)
    for (e, query), passages, text, ids in zip(searching, shown, texts, blocks.encode_many(texts)):
        e.observe(query, passages, block=(text, ids))


# --- evaluation -----------------------------------------------------------------

def _question_and_golds(example: Any) -> tuple[str, tuple[str, ...]]:
    """A QAExample, or a mapping with `question` and `golden_answers` / `answers`."""
    if isinstance(example, Mapping):
        golds = example.get("golden_answers", example.get("answers", ()))
        return example["question"], tuple([golds] if isinstance(golds, str) else golds)
    return example.question, tuple(example.answers)


def greedy_rollouts(model: Any, tokenizer: Any, examples: Iterable[Any], retriever: Retriever | None,
                    config: RolloutConfig = RolloutConfig(), engine: Any | None = None) -> list[Rollout]:
    """One scored episode per example, for evaluation: always greedy, whatever `config.greedy`
    says (the public DGPO harness meant to be greedy here and sampled instead;
    docs/architecture.md#dgpo-as-implemented-here)."""
    pairs = [_question_and_golds(x) for x in examples]
    if not pairs:
        raise ValueError("no examples to evaluate")
    return generate_rollouts(model, tokenizer, [q for q, _ in pairs], [g for _, g in pairs],
                             retriever, replace(config, greedy=True), engine=engine)


def evaluate_em(model: Any, tokenizer: Any, examples: Iterable[Any], retriever: Retriever | None,
                config: RolloutConfig = RolloutConfig(), engine: Any | None = None) -> dict:
    """Greedy rollouts over `examples` (`greedy_rollouts`); mean EM, F1, cover-EM, searches, invalid turns."""
    rollouts = greedy_rollouts(model, tokenizer, examples, retriever, config, engine)
    n = len(rollouts)
    mean = lambda xs: sum(xs) / n  # noqa: E731
    return {
        "n": n,
        "em": mean([r.score for r in rollouts]),
        "f1": mean([f1_score(r.answer, r.golds) for r in rollouts]),
        "cover_em": mean([cover_exact_match(r.answer, r.golds) for r in rollouts]),
        "answered": mean([r.answer is not None for r in rollouts]),
        "searches": mean([r.n_searches for r in rollouts]),
        "invalid": mean([r.n_invalid for r in rollouts]),
        "generated_tokens": mean([r.n_generated for r in rollouts]),
    }
