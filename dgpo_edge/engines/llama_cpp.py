"""llama.cpp engine (GGUF) through `llama-cpp-python`.

The `Llama` object holds the model, one context of `n_ctx` tokens and its KV
cache. Cache reuse is llama.cpp's own: positions past the common prefix are
removed with `kv_cache_seq_rm` and only the new suffix is decoded. Logits are
read straight from the context (no copy) and decoding is the shared loop in
`base.Engine`, so greedy output is an argmax of llama.cpp's logits.

`n_ctx` is always set explicitly: llama-cpp-python's default of 512 cannot hold
a Search-R1 episode (4,096 tokens with DGPO's limits).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..chat_template import ChatTemplate
from ..errors import InputError
from .base import Engine, eos_ids_of

LLAMA_PIP = "pip install llama-cpp-python==0.3.36"


def import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise InputError(f"GGUF models run on llama.cpp; install it with `{LLAMA_PIP}`") from None
    return llama_cpp


class LlamaCppEngine(Engine):
    """A GGUF model on llama.cpp (CPU). `threads` None: llama-cpp-python's default (cores / 2)."""

    name = "llama.cpp"

    def __init__(self, path: str | Path, n_ctx: int = 4096, threads: int | None = None,
                 n_batch: int = 512, chat_template: ChatTemplate | str | None = None, **llama_kwargs: Any):
        super().__init__()
        llama_cpp = import_llama_cpp()
        p = Path(path).expanduser()
        if not p.is_file():
            raise InputError("no such GGUF model file", p)
        _check_gguf(p)
        kwargs: dict[str, Any] = dict(n_ctx=int(n_ctx), n_batch=min(int(n_batch), int(n_ctx)),
                                      verbose=False, logits_all=False)
        if threads is not None:
            kwargs.update(n_threads=int(threads), n_threads_batch=int(threads))
        kwargs.update(llama_kwargs)
        try:
            self.llm = llama_cpp.Llama(model_path=str(p), **kwargs)
        except (ValueError, RuntimeError) as e:
            raise InputError(f"llama.cpp cannot load this GGUF model ({e})", p) from None
        self.model_path = str(p)
        self.n_ctx = int(self.llm.n_ctx())
        self.threads = self.llm.n_threads
        self._n_vocab = int(self.llm.n_vocab())
        self.metadata: dict[str, str] = dict(self.llm.metadata)
        self.chat_template = _template(chat_template, self.metadata, self.llm)
        self.eos_ids = eos_ids_of(self, [self.llm.token_eos()])

    # -- tokenizer -----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def decode(self, ids: Sequence[int]) -> str:
        return self.llm.detokenize(list(ids), special=True).decode("utf-8", errors="replace")

    def _encode_unparsed(self, text: str) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def added_tokens(self) -> list[str]:
        # With special parsing off llama.cpp still matches user-defined tokens (a Qwen GGUF's
        # <tool_call>): every control, user-defined and unknown token is cut by encode_text.
        llama_cpp = import_llama_cpp()
        mask = (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
                | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN)
        vocab = self.llm._model.vocab
        return [self.decode([i]) for i in range(self._n_vocab) if llama_cpp.llama_vocab_get_attr(vocab, i) & mask]

    # -- cache hooks ---------------------------------------------------------------------------
    def _truncate(self, keep: int) -> None:
        self.llm._ctx.kv_cache_seq_rm(-1, keep, -1)
        self.llm.n_tokens = keep

    def _evaluate(self, ids: Sequence[int]) -> None:
        self.llm.eval(list(ids))

    def _logits(self) -> np.ndarray:
        ptr = self.llm._ctx.get_logits_ith(-1)
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,))

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.close()
            self.llm = None  # type: ignore[assignment]

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(architecture=self.metadata.get("general.architecture"),
                 name=self.metadata.get("general.name"), bytes=os.path.getsize(self.model_path))
        return d


def _check_gguf(p: Path) -> None:
    with open(p, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InputError("not a GGUF file (no GGUF magic)", p)


def _template(chat_template: ChatTemplate | str | None, metadata: dict[str, str], llm: Any) -> ChatTemplate | None:
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    source = chat_template if isinstance(chat_template, str) else metadata.get("tokenizer.chat_template")
    if not source:
        return None

    def text(tid: int) -> str | None:
        if tid is None or tid < 0:
            return None
        return llm.detokenize([tid], special=True).decode("utf-8", errors="replace")

    specials = {"bos_token": text(llm.token_bos()), "eos_token": text(llm.token_eos())}
    return ChatTemplate(source, specials)
