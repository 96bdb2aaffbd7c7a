"""Chat templates without transformers or torch.

Models ship their chat template as a Jinja string (tokenizer_config.json, GGUF
metadata `tokenizer.chat_template`). The edge runtime renders it here with the
same Jinja settings transformers uses, so the prompt is byte-identical to
`tokenizer.apply_chat_template(...)` (tests check this on the real Qwen template).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from .errors import InputError
from .jsonio import require_file


def _raise(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template plus the special tokens it may reference."""

    def __init__(self, template: str, special_tokens: dict[str, str | None] | None = None):
        # Imported here so `import dgpo_edge` stays cheap.
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.source = template
        self.special_tokens = dict(special_tokens or {})
        self._template = env.from_string(template)

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render `messages`; the signature mirrors transformers' for drop-in use."""
        if tokenize:
            raise ValueError("ChatTemplate renders text only; tokenize with the model's tokenizer")
        # kwargs override the special tokens, as in transformers (no duplicate-keyword TypeError).
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **{**self.special_tokens, **kwargs})

    @classmethod
    def from_tokenizer_config(cls, path: str | Path) -> ChatTemplate:
        """Load from a `tokenizer_config.json` (or the directory holding it)."""
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer_config.json"
        require_file(path)
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"not a JSON tokenizer config ({e})", path) from None
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise InputError("has no chat_template", path)
        specials = {k: _token_text(config.get(k)) for k in
                    ("bos_token", "eos_token", "unk_token", "pad_token")}
        return cls(template, specials)


def _token_text(tok: Any) -> str | None:
    """tokenizer_config stores a token as a string or as an AddedToken dict."""
    if isinstance(tok, dict):
        return tok.get("content")
    return tok
