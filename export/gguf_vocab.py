"""Tokenizer metadata for GGUF: a Hugging Face byte-level BPE tokenizer.json -> llama.cpp fields.

llama.cpp does not run the tokenizer.json pipeline; it has its own BPE with a fixed set of
pre-tokenizer regexes chosen by name (`tokenizer.ggml.pre`). So the writer must name the right one.
We recognise the pre-tokenizers of the tokenizers we support by their structure and regex, and the
parity check afterwards tokenizes a fixed text set both ways to prove the choice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dgpo_edge.errors import InputError

# The Split regexes of the tokenizer families we export, mapped to llama.cpp's names.
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLIT_REGEXES = {_QWEN2_REGEX: "qwen2", _LLAMA3_REGEX: "llama-bpe"}
# Every name detect_pre_tokenizer returns.
KNOWN_PRE = ("qwen2", "llama-bpe", "smollm", "gpt-2")

# gguf.TokenType values (kept as ints so this module does not need gguf at import).
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


@dataclass
class GGUFVocab:
    """Everything llama.cpp needs to tokenize like the Hugging Face tokenizer."""

    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    add_bos: bool


def detect_pre_tokenizer(tokenizer: dict[str, Any]) -> str:
    """llama.cpp's pre-tokenizer name for a tokenizer.json, or InputError if we know none."""
    parts = _steps(tokenizer.get("pre_tokenizer"), "pretokenizers")
    kinds = [p.get("type") for p in parts]
    if kinds == ["ByteLevel"] and parts[0].get("use_regex", True):
        return "gpt-2"  # llama.cpp's name for GPT-2's split regex ("gpt2" is the model type)
    if kinds == ["Digits", "ByteLevel"] and parts[0].get("individual_digits") \
            and parts[1].get("use_regex", True):
        return "smollm"
    if kinds == ["Split", "ByteLevel"] and not parts[1].get("use_regex", True):
        regex = (parts[0].get("pattern") or {}).get("Regex")
        if regex in _SPLIT_REGEXES:
            return _SPLIT_REGEXES[regex]
    raise InputError(f"tokenizer pre-tokenizer {kinds} is not one llama.cpp knows by name "
                     "(supported: Qwen2, Llama 3, SmolLM, GPT-2 byte-level BPE)")


def _steps(part: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """The steps of a pre-tokenizer or decoder, flattening one Sequence."""
    part = part or {}
    return part.get(key, []) if part.get("type") == "Sequence" else [part]


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the symbol ByteLevel writes for each byte 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _fallback_is_inert(tokenizer: dict[str, Any]) -> bool:
    """Whether `byte_fallback: true` can never change an encoding or a decoding.

    transformers 5.17's `from_pretrained(gguf_file=...)` writes byte-level BPE with
    `byte_fallback: true` and a ByteFallback/Fuse/Replace/ByteLevel decoder. After a ByteLevel
    pre-tokenizer every character is one byte's symbol; the fallback only fires for a symbol
    missing from the vocabulary, and then only writes a `<0xXX>` token the vocabulary has (else
    the model's unk, as without the fallback). So it is inert when every byte has its symbol or
    no `<0xXX>` token; a decoder ending in ByteLevel decodes as llama.cpp does. SentencePiece
    tokenizers fail these tests.
    """
    pres = _steps(tokenizer.get("pre_tokenizer"), "pretokenizers")
    decoders = [d.get("type") for d in _steps(tokenizer.get("decoder"), "decoders")]
    vocab = (tokenizer.get("model") or {}).get("vocab") or {}
    return (any(p.get("type") == "ByteLevel" for p in pres)
            and decoders[-1:] == ["ByteLevel"] and set(decoders[:-1]) <= {"ByteFallback", "Fuse", "Replace"}
            and all(sym in vocab or f"<0x{b:02X}>" not in vocab for b, sym in enumerate(_byte_symbols())))


def _merge_text(merge: Any) -> str:
    return merge if isinstance(merge, str) else " ".join(merge)


def _adds_bos(tokenizer: dict[str, Any]) -> bool:
    """True when the post-processor puts a special token before the text (a BOS)."""
    post = tokenizer.get("post_processor") or {}
    posts = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for p in posts:
        if p.get("type") == "TemplateProcessing":
            single = p.get("single") or []
            return bool(single) and "SpecialToken" in single[0]
    return False


def build_vocab(tokenizer: dict[str, Any], tokenizer_config: dict[str, Any],
                config: dict[str, Any], pre: str | None = None) -> GGUFVocab:
    """Tokens, types, merges and special ids for a model of `config["vocab_size"]` rows.

    Rows of the embedding beyond the tokenizer (Qwen pads 151,665 tokens to 151,936) become
    `[PAD{i}]` tokens of type UNUSED, as llama.cpp's own converter writes them.
    """
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE" or (model.get("byte_fallback") and not _fallback_is_inert(tokenizer)):
        raise InputError(f"tokenizer model {model.get('type')!r} is not byte-level BPE "
                         "(SentencePiece tokenizers are not supported)")
    pre = pre or detect_pre_tokenizer(tokenizer)
    vocab: dict[str, int] = model["vocab"]
    added = tokenizer.get("added_tokens") or []
    n_tok = max([*vocab.values(), *(t["id"] for t in added)]) + 1
    n = int(config.get("vocab_size") or n_tok)
    if n < n_tok:
        raise InputError(f"tokenizer has {n_tok} tokens but the model only {n} embedding rows")
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [UNUSED] * n
    for text, i in vocab.items():
        tokens[i], types[i] = text, NORMAL
    for t in added:
        tokens[t["id"]] = t["content"]
        types[t["id"]] = CONTROL if t.get("special") else USER_DEFINED
    ids = {text: i for i, text in enumerate(tokens)}

    def special(name: str) -> int | None:
        tok = tokenizer_config.get(f"{name}_token")
        if isinstance(tok, dict):
            tok = tok.get("content")
        if isinstance(tok, str) and tok in ids:
            return ids[tok]
        cid = config.get(f"{name}_token_id")
        return cid[0] if isinstance(cid, list) else cid

    return GGUFVocab(pre=pre, tokens=tokens, token_types=types,
                     merges=[_merge_text(m) for m in model.get("merges", [])],
                     bos_id=special("bos"), eos_id=special("eos"), pad_id=special("pad"),
                     unk_id=special("unk"), add_bos=_adds_bos(tokenizer))


def add_vocab(writer: Any, vocab: GGUFVocab) -> None:
    """Write the tokenizer fields onto a gguf.GGUFWriter."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    # Qwen has no BOS token; llama.cpp still wants an id, and uses eos as transformers does.
    bos = vocab.bos_id if vocab.bos_id is not None else vocab.eos_id
    if bos is not None:
        writer.add_bos_token_id(bos)
    if vocab.eos_id is not None:
        writer.add_eos_token_id(vocab.eos_id)
    if vocab.pad_id is not None:
        writer.add_pad_token_id(vocab.pad_id)
    if vocab.unk_id is not None:
        writer.add_unk_token_id(vocab.unk_id)
    writer.add_add_bos_token(vocab.add_bos)
