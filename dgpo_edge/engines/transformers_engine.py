"""transformers (torch) engine: a causal LM with `past_key_values` reused across calls.

Used by training code paths and tests, and to run a transformers checkpoint
directory on a laptop without converting it. torch and transformers are
imported when an engine is made, never at module import.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..chat_template import ChatTemplate
from ..errors import InputError
from .base import Engine, eos_ids_of

_PIP = "pip install torch transformers  (a CPU build of torch is enough)"


def _import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError:
        raise InputError(f"the transformers engine needs torch and transformers; install them with `{_PIP}`") \
            from None
    return torch, transformers


class TransformersEngine(Engine):
    """A transformers causal LM on CPU (or `device`).

    `model`: a checkpoint directory, or a loaded `PreTrainedModel`. `tokenizer`:
    None loads the directory's tokenizer; or a transformers tokenizer, a
    `tokenizers.Tokenizer`, or a path to a tokenizer directory / tokenizer.json.
    `chat_template`: a ChatTemplate, a Jinja string, or None to take the
    tokenizer's. `threads` sets torch's (process-wide) intra-op threads.
    """

    name = "transformers"

    def __init__(self, model: str | Path | Any, tokenizer: Any = None, n_ctx: int = 4096,
                 threads: int | None = None, chat_template: ChatTemplate | str | None = None,
                 device: str = "cpu", dtype: str | None = None):
        super().__init__()
        torch, transformers = _import_torch()
        self._torch = torch
        if threads is not None:
            torch.set_num_threads(int(threads))
        self.threads = threads
        if isinstance(model, (str, Path)):
            path = Path(model).expanduser()
            if not (path / "config.json").is_file():
                raise InputError("not a transformers checkpoint directory (no config.json)", path)
            kwargs: dict[str, Any] = {}
            if dtype is not None:
                kwargs["dtype"] = getattr(torch, dtype)
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
            except (OSError, ValueError) as e:
                raise InputError(f"cannot load the model: {e}", path) from None
            self.model_path = str(path)
            if tokenizer is None:
                tokenizer = path
        else:
            self.model_path = str(getattr(getattr(model, "config", None), "_name_or_path", "") or "<in memory>")
        if tokenizer is None:
            raise InputError("the transformers engine needs a tokenizer for an in-memory model")
        self.model = model.to(device).eval()
        self.device = device
        self._tok = _load_tokenizer(tokenizer, transformers)
        self.n_ctx = int(n_ctx)
        self.chat_template = _template(chat_template, self._tok)
        eos = getattr(self.model.config, "eos_token_id", None)
        self.eos_ids = eos_ids_of(self, eos if isinstance(eos, list) else [eos])
        self._past: Any = None
        self._last: np.ndarray | None = None
        # transformers 5 renamed `past_key_values` to `cache` (the old name warns, then goes).
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    # -- tokenizer ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if hasattr(self._tok, "encode_batch"):  # tokenizers.Tokenizer
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if hasattr(self._tok, "encode_batch"):
            return self._tok.decode(list(ids), skip_special_tokens=False)
        return self._tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def added_tokens(self) -> list[str]:
        from ..tokens import added_token_strings

        return added_token_strings(self._tok)

    # -- cache hooks ----------------------------------------------------------------------------------
    def _truncate(self, keep: int) -> None:
        if keep == 0 or self._past is None:
            self._past = None
            return
        # A negative crop removes that many tokens in every transformers 5 release; a positive
        # one (the cache's new length) was refused from 5.24 on.
        drop = self._past.get_seq_length() - keep
        if drop > 0:
            self._past.crop(-drop)

    def _evaluate(self, ids: Sequence[int]) -> None:
        torch = self._torch
        from transformers import DynamicCache

        if self._past is None:
            self._past = DynamicCache()
        x = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=1, **{self._cache_arg: self._past})
        self._past = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or self._past
        self._last = out.logits[0, -1].float().cpu().numpy()

    def _logits(self) -> np.ndarray:
        assert self._last is not None
        return self._last

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["architecture"] = type(self.model).__name__
        return d


def _load_tokenizer(tokenizer: Any, transformers: Any) -> Any:
    if not isinstance(tokenizer, (str, Path)):
        return tokenizer
    p = Path(tokenizer).expanduser()
    if p.is_file() and p.suffix == ".json":
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(p))
    try:
        return transformers.AutoTokenizer.from_pretrained(str(p))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a tokenizer: {e}", p) from None


def _template(chat_template: ChatTemplate | str | None, tok: Any) -> ChatTemplate | None:
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    specials = {k: _token_text(getattr(tok, k, None)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    if isinstance(chat_template, str):
        return ChatTemplate(chat_template, specials)
    source = getattr(tok, "chat_template", None)
    if isinstance(source, dict):
        source = source.get("default")
    return ChatTemplate(source, specials) if isinstance(source, str) else None


def _token_text(tok: Any) -> str | None:
    if tok is None or isinstance(tok, str):
        return tok
    return getattr(tok, "content", None) or str(tok)
