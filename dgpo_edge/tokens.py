"""Encoding forced text as text: a passage can never become a control token.

The prompt is encoded with special tokens recognised (the chat template writes
`<|im_start|>` on purpose). Observations and feedback are data: a passage that
contains `<file_sep>` or `<|endoftext|>` must give the ids of those characters,
never the token that tells the model a file or the text has ended. Tokenizers
recognise *added* tokens (special or not) wherever their text occurs, and
llama.cpp still matches user-defined ones with special parsing off, so the
reliable rule, the same on every engine and in training, is: cut the text
inside every occurrence of an added token's string (after its first
character) and encode the pieces one after another. No piece can hold a whole
token string, so none is recognised; the pieces decode back to the text.

`escape_tags` (protocol.py) stays as a second layer for passages: it also
removes protocol tags and `<|` openers, even folded from look-alike characters.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

Encode = Callable[[str], list[int]]
SHORT_TEXT = 400   # characters: the protocol's feedback fits, an observation block does not


def _piece_splitter(added: Iterable[str]) -> Callable[[str], list[str]] | None:
    """text -> the pieces `plain` encodes one after another (cut inside every added token's
    string); None when no added token can be cut."""
    tokens = sorted({t for t in added if isinstance(t, str) and len(t) >= 2}, key=len, reverse=True)
    if not tokens:
        return None
    # A lookahead finds every occurrence, overlapping ones included ("<reponame>" inside "<repo_name>"...).
    find = re.compile("(?=(?:" + "|".join(map(re.escape, tokens)) + "))")

    def pieces(text: str) -> list[str]:
        cuts = sorted({m.start() + 1 for m in find.finditer(text)})
        return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]

    return pieces


def plain_encoder(encode: Encode, added: Iterable[str]) -> Encode:
    """`encode` made to read every string in `added` as plain text (see the module docstring).

    Single-character tokens cannot be cut and are left to the tokenizer. Short texts are kept
    encoded: the same feedback is forced after every invalid turn (2,048 times in a paper-shape RL
    step of a random model, bench/rollout_host.py). Observations are long and rarely repeat, so they
    are not kept (`encode` must give the same ids for the same text, as a tokenizer does).
    """
    pieces = _piece_splitter(added) or (lambda text: [text])

    def ids_of(text: str) -> list[int]:
        return list(itertools.chain.from_iterable(encode(piece) for piece in pieces(text)))

    kept = functools.lru_cache(maxsize=64)(lambda text: tuple(ids_of(text)))
    return lambda text: list(kept(text)) if len(text) <= SHORT_TEXT else ids_of(text)


def plain_batch_encoder(encode_many: Callable[[list[str]], list[list[int]]],
                        added: Iterable[str]) -> Callable[[list[str]], list[list[int]]]:
    """texts -> `plain_encoder(encode, added)(text)` for each, with every piece of every text
    encoded in one `encode_many` call (a tokenizer's batch encoder, parallel in Rust)."""
    pieces = _piece_splitter(added) or (lambda text: [text])

    def plain_many(texts: list[str]) -> list[list[int]]:
        split = [pieces(t) for t in texts]
        encoded = iter(encode_many([p for ps in split for p in ps]))
        out = []
        for ps in split:
            ids: list[int] = []
            for _ in ps:
                ids.extend(next(encoded))
            out.append(ids)
        return out

    return plain_many


def batch_encoder(tokenizer: Any) -> Callable[[list[str]], list[list[int]]] | None:
    """A batch form of `encoder_for(tokenizer)`'s encoding (no special tokens added), through the
    Rust `encode_batch`; None for anything without one.

    A transformers fast tokenizer is called as a whole (`tokenizer(texts)`), which switches off
    any padding or truncation an earlier call left on its backend, as its `encode` does; a
    `tokenizers.Tokenizer` with padding set is encoded one text at a time, as `encode` would.
    """
    if hasattr(tokenizer, "encode_batch"):   # tokenizers.Tokenizer
        def raw(texts: list[str]) -> list[list[int]]:
            if tokenizer.padding is not None:   # batch padding would add ids a lone encode does not
                return [tokenizer.encode(t, add_special_tokens=False).ids for t in texts]
            return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        return raw
    if getattr(tokenizer, "is_fast", False) and callable(tokenizer):
        return lambda texts: [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return None


def added_token_strings(tokenizer: Any) -> list[str]:
    """The text of every added or special token of a `tokenizers.Tokenizer` or a transformers tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    found: set[str] = set()
    for tok in (tokenizer, backend):
        if tok is not None and hasattr(tok, "get_added_tokens_decoder"):
            found.update(a.content for a in tok.get_added_tokens_decoder().values())
    if hasattr(tokenizer, "get_added_vocab"):  # transformers, fast or slow
        found.update(tokenizer.get_added_vocab())
    found.update(getattr(tokenizer, "all_special_tokens", None) or ())
    return sorted(found)


def added_tokens_in_folder(d: Path) -> list[str]:
    """The added tokens a model folder's tokenizer.json / tokenizer_config.json declare."""
    found: set[str] = set()
    for name, key in (("tokenizer.json", "added_tokens"), ("tokenizer_config.json", "added_tokens_decoder")):
        try:
            data = json.loads((d / name).read_text(encoding="utf-8")).get(key) or []
        except (OSError, ValueError, AttributeError):
            continue
        entries = data.values() if isinstance(data, dict) else data
        found.update(e["content"] for e in entries if isinstance(e, dict) and isinstance(e.get("content"), str))
    return sorted(found)
