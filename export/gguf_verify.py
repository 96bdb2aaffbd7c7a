"""Parity of a GGUF file with its transformers checkpoint, run through llama.cpp."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .parity import (PARITY_TEXTS, Reference, compare_logits, compare_tokenizers, judge,
                     transcript_text, versions)
from .quantize import import_llama_cpp

GREEDY_TOKENS = 24


def extra_buffers_allowed() -> bool:
    """Whether llama.cpp may repack weights into its CPU "extra buffer" types (AMX, AVX repacks).

    On by default: the Makefile builds llama.cpp for portable x86-64 (no AMX), where the repacks
    only speed quantized matmuls up. A *native* build on an AMX CPU runs them through AMX tiles,
    which the kernel must grant per process; where it does not (some containers and sandboxes)
    every Q4/Q8 model dies with SIGILL at the first decode. DGPO_EDGE_LLAMA_EXTRA_BUFTS=0 turns
    the repacks off for such a build (slower, but it runs).
    """
    return os.environ.get("DGPO_EDGE_LLAMA_EXTRA_BUFTS", "1") != "0"


@contextlib.contextmanager
def _model_params(use_extra_bufts: bool) -> Iterator[None]:
    """llama_cpp.Llama takes no use_extra_bufts argument: set it in the default params it reads."""
    low = import_llama_cpp().llama_cpp
    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = use_extra_bufts
        return p

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


def open_llama(path: str | Path, n_ctx: int = 2048, threads: int = 2, vocab_only: bool = False,
               logits_all: bool = False) -> Any:
    """A quiet llama_cpp.Llama on `path` (explicit n_ctx: the default 512 is too small).

    n_batch = n_ctx: without logits_all, llama-cpp-python keeps n_batch rows of scores and
    indexes them by position, which fails past n_batch tokens.
    """
    llama_cpp = import_llama_cpp()
    with _model_params(extra_buffers_allowed()):
        return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx,
                               n_threads=threads, n_threads_batch=threads, vocab_only=vocab_only,
                               logits_all=logits_all, verbose=False)


def llama_logits(llm: Any, ids: list[int]) -> Any:
    """Logits at every position of `ids` (teacher forcing), shape (len(ids), vocab)."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def llama_greedy(llm: Any, ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens after `ids` (argmax, no sampling, no stop tokens)."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(tok)
        llm.eval([tok])
    return out


def verify_gguf(model_dir: str | Path, gguf_path: str | Path, quant: str,
                reference: Reference | None = None, threads: int = 2) -> dict[str, Any]:
    """Compare `gguf_path` (llama.cpp) with the checkpoint `model_dir` (transformers)."""
    ref = reference or Reference.load(model_dir)
    ids = ref.encode(transcript_text(ref.tokenizer))
    llm = open_llama(gguf_path, n_ctx=max(512, len(ids) + GREEDY_TOKENS + 8), threads=threads,
                     logits_all=True)
    match, first_bad = compare_tokenizers(
        ref, lambda t: llm.tokenize(t.encode("utf-8"), add_bos=True, special=True))
    result: dict[str, Any] = {"format": "gguf", "quant": quant, "tokenizer_match": match,
                              "tokenizer_mismatch": first_bad, "n_texts": len(PARITY_TEXTS)}
    result.update(compare_logits(ref.logits(ids), llama_logits(llm, ids)))
    prompt = ids[: len(ids) // 2]
    ours, theirs = llama_greedy(llm, prompt, GREEDY_TOKENS), ref.greedy(prompt, GREEDY_TOKENS)
    result["greedy_n"] = GREEDY_TOKENS
    result["greedy_match"] = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                                  GREEDY_TOKENS)
    result["versions"] = versions("gguf", "llama-cpp-python")
    llm.close()
    return judge(result, quant)
