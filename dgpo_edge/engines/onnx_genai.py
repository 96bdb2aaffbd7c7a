"""onnxruntime-genai engine: an exported ONNX folder (`genai_config.json`, model.onnx, tokenizer).

One `og.Generator` holds the KV cache for the whole context (`max_length =
n_ctx`); cache reuse rewinds it to the common prefix (`rewind_to`) and appends
only the new ids. Logits come from `get_logits()` and decoding is the shared
loop in `base.Engine`, so greedy output matches the other engines' rule.

Tokenization uses the folder's `tokenizer.json` with the `tokenizers` library
when present (byte-identical to transformers, special tokens in text
recognised), else onnxruntime-genai's own tokenizer. The chat template comes
from `chat_template.jinja` or `tokenizer_config.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..chat_template import ChatTemplate
from ..errors import InputError
from .base import Engine, eos_ids_of

OG_PIP = "pip install onnxruntime-genai==0.18.0"


def cpu_config(og: Any, path: str | Path, threads: int | None = None) -> Any:
    """An `og.Config` for the model folder on the CPU, with `threads` intra-op threads when given
    (else onnxruntime-genai's own default)."""
    config = og.Config(str(path))
    config.clear_providers()
    if threads is not None:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": int(threads), "inter_op_num_threads": 1}}}}))
    return config


class OnnxGenaiEngine(Engine):
    """An onnxruntime-genai model folder on CPU. `threads`: the decoder session's intra-op threads."""

    name = "onnxruntime-genai"

    def __init__(self, path: str | Path, n_ctx: int = 4096, threads: int | None = None,
                 chat_template: ChatTemplate | str | None = None):
        super().__init__()
        try:
            import onnxruntime_genai as og
        except ImportError:
            raise InputError(f"ONNX models run on onnxruntime-genai; install it with `{OG_PIP}`") from None
        self._og = og
        d = Path(path).expanduser()
        cfg_path = d / "genai_config.json"
        if not cfg_path.is_file():
            raise InputError("not an onnxruntime-genai model folder (no genai_config.json)", d)
        try:
            genai_cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            context = int(genai_cfg["model"].get("context_length") or n_ctx)
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"malformed genai_config.json ({e})", cfg_path) from None
        self.n_ctx = min(int(n_ctx), context)
        try:
            self.model = og.Model(cpu_config(og, d, threads))
        except Exception as e:  # onnxruntime-genai raises plain RuntimeError/OrtException
            raise InputError(f"onnxruntime-genai cannot load this model ({e})", d) from None
        self.model_path = str(d)
        self.threads = threads
        self._tok, self._og_tok = _tokenizer(d, og, self.model)
        self.chat_template = _template(chat_template, d)
        eos = genai_cfg["model"].get("eos_token_id")
        self.eos_ids = eos_ids_of(self, eos if isinstance(eos, list) else [eos])
        self._vocab = int(genai_cfg["model"].get("vocab_size") or 0)
        self._gen: Any = None
        self._last: np.ndarray | None = None

    # -- tokenizer ---------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        if self._tok is not None:
            return list(self._tok.encode(text, add_special_tokens=False).ids)
        return [int(i) for i in self._og_tok.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        if self._tok is not None:
            return self._tok.decode(list(ids), skip_special_tokens=False)
        return self._og_tok.decode(np.asarray(list(ids), dtype=np.int32))

    def added_tokens(self) -> list[str]:
        from ..tokens import added_token_strings, added_tokens_in_folder

        if self._tok is not None:
            return added_token_strings(self._tok)
        return added_tokens_in_folder(Path(self.model_path))  # onnxruntime-genai's tokenizer lists none

    # -- cache hooks ---------------------------------------------------------------------------------
    def _generator(self) -> Any:
        if self._gen is None:
            params = self._og.GeneratorParams(self.model)
            params.set_search_options(max_length=self.n_ctx, do_sample=False)
            self._gen = self._og.Generator(self.model, params)
        return self._gen

    def _truncate(self, keep: int) -> None:
        if self._gen is None:
            return
        if keep == 0:
            self._gen = None   # a fresh generator: rewinding to 0 is not allowed everywhere
        else:
            self._gen.rewind_to(keep)

    def _evaluate(self, ids: Sequence[int]) -> None:
        g = self._generator()
        g.append_tokens(np.asarray([list(ids)], dtype=np.int32))
        logits = np.asarray(g.get_logits(), dtype=np.float32)
        self._last = logits.reshape(-1, logits.shape[-1])[-1]

    def _logits(self) -> np.ndarray:
        assert self._last is not None
        return self._last

    def close(self) -> None:
        self._gen = None
        self.model = None


def _tokenizer(d: Path, og: Any, model: Any) -> tuple[Any, Any]:
    tj = d / "tokenizer.json"
    if tj.is_file():
        try:
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(tj)), None
        except ImportError:
            pass
        except Exception as e:  # tokenizers raises its own Exception subclass
            raise InputError(f"not a readable tokenizer.json: {e}", tj) from None
    return None, og.Tokenizer(model)


def _template(chat_template: ChatTemplate | str | None, d: Path) -> ChatTemplate | None:
    if isinstance(chat_template, ChatTemplate):
        return chat_template
    if isinstance(chat_template, str):
        return ChatTemplate(chat_template)
    return template_from_folder(d)


def template_from_folder(d: Path) -> ChatTemplate | None:
    """The chat template of a transformers-style folder: chat_template.jinja, else tokenizer_config.json."""
    jinja = d / "chat_template.jinja"
    cfg = d / "tokenizer_config.json"
    specials: dict[str, str | None] = {}
    if cfg.is_file():
        try:
            data = json.loads(cfg.read_text(encoding="utf-8"))
        except ValueError:
            data = {}
        for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = data.get(k)
            specials[k] = v.get("content") if isinstance(v, dict) else v
        if not jinja.is_file():
            t = data.get("chat_template")
            if isinstance(t, list):
                t = next((x.get("template") for x in t if x.get("name") == "default"), None)
            return ChatTemplate(t, specials) if isinstance(t, str) else None
    if jinja.is_file():
        return ChatTemplate(jinja.read_text(encoding="utf-8"), specials)
    return None
