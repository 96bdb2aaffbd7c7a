"""`load_agent`: one call that turns a bundle, or a model and an index, into a ready Agent.

Used by `dgpo-edge ask`, `eval` and `chat`; `load_pool` loads N of them on one retriever for
`dgpo-edge serve`. What it loads:

| given | model | index |
|---|---|---|
| nothing | default bundle's | default bundle's (built on first use) |
| `bundle` | the bundle's | the bundle's |
| `index` only | the default model: the shipped student (rebuilt once into the cache, no bundle built), else SmolLM2's GGUF | `index` |
| `model` only | `model` | the default bundle's |
| `model` and `index` | `model` | `index` |

`model` or `index` given together with `bundle` replace that part of it. The
protocol settings come from the bundle's manifest (the shipped student's with the default model,
defaults otherwise); `top_k` and `max_searches` override them. A bundle's layout and sizes are checked
on load, and the hashes of the files changed since they were last verified;
`dgpo-edge bundle verify` checks every hash.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..progress import StageBars
from .core import Bundle, Progress, open_bundle, protocol_config
from .default import default_agent_model, ensure_default_bundle

_STAGES = {"factbook": "building FactbookQA", "fingerprint": "reading corpus", "store": "storing passages",
           "embed": "embedding passages", "train": "training index", "add": "adding vectors",
           "write": "writing index", "model": "placing model", "index": "placing index",
           "hash": "hashing files", "verify": "verifying", "student": "building the student"}


BeforeLoad = Callable[[dict[str, Any], Any], None]   # (info, ProtocolConfig), see load_agent


class RichProgress(StageBars):
    """A `Progress` callback drawing rich bars on stderr; nothing is drawn until the first call."""

    def __init__(self, title: str | None = None):
        super().__init__(title, descriptions=_STAGES)


def _progress(progress: bool | Progress | None) -> tuple[Progress | None, Callable[[], None]]:
    if callable(progress):
        return progress, lambda: None
    if progress:
        p = RichProgress("building the default bundle (first use; nothing is downloaded)")
        return p, p.close
    return None, lambda: None


def load_agent(bundle: str | Path | None = None, model: str | Path | None = None,
               index: str | Path | None = None, threads: int | None = None, top_k: int | None = None,
               max_searches: int | None = None, progress: bool | Progress | None = True, *,
               timeout_s: float | None = None, sampling: Any = None, n_ctx: int | None = None,
               encoder: str | None = None, corpus: str | Path | None = None,
               gpu_layers: int | None = None, before_load: BeforeLoad | None = None) -> Any:
    """An `Agent` for a bundle, a model and an index, or the default bundle (table above).

    `threads`: engine, encoder and FAISS threads (None: library defaults).
    `progress`: True draws bars on stderr while the default bundle is built,
    False draws nothing, a callable gets `(stage, done, total)`. `n_ctx`: the
    engine context (default: the protocol's total budget). `encoder`: query
    encoder for `index` (default: the one the index names). `corpus`: build the
    default bundle from this corpus instead of FactbookQA. `gpu_layers`: layers
    llama.cpp offloads to a GPU (None: the bundle's default, else 0; -1 all).
    `before_load(info, config)`: called once it is known what will load (the bundle opened or
    built), before the model or the index loads, with `Agent.info`'s bundle, model, model_from,
    index, top_k and max_searches and the protocol config: for a caller's checks that need to
    know what loads, so that a refusal does not wait for the model.
    """
    from ..agent import Agent
    from ..engines import open_engine

    if threads is not None and threads < 1:
        raise InputError(f"--threads must be >= 1, got {threads}")
    b = _open_bundle(bundle, index, progress, corpus)
    model_path, model_from, config = _model_and_protocol(b, model, top_k, max_searches)
    index_path = Path(index).expanduser() if index is not None else b.index_path  # type: ignore[union-attr]
    info = {"bundle": None if b is None else str(b.path), "model": str(model_path), "model_from": model_from,
            "index": str(index_path), "top_k": config.top_k, "max_searches": config.max_searches}
    if before_load is not None:
        before_load(dict(info), config)
    offload = gpu_options(model_path, gpu_layers, b)
    engine = open_engine(model_path, n_ctx=n_ctx or config.max_total_tokens, threads=threads, **offload)
    try:
        retriever = _retriever(b, index, threads, encoder)
    except BaseException:
        engine.close()
        raise
    agent = Agent(engine, retriever, config, timeout_s=timeout_s, sampling=sampling)
    first = ("bundle", "model", "model_from")   # the order `ask --json` has always printed
    agent.info = {**{k: info.pop(k) for k in first}, "engine": engine.name, **info, "threads": engine.threads,
                  "n_ctx": engine.n_ctx, "gpu_layers": offload.get("n_gpu_layers", 0)}
    return agent


def _open_bundle(bundle: str | Path | None, index: str | Path | None, progress: bool | Progress | None,
                 corpus: str | Path | None) -> Bundle | None:
    """The bundle given, else (no index either) the default one, built on first use; else None."""
    emit, done = _progress(progress)
    try:
        if bundle is not None:
            return open_bundle(bundle)
        if index is None:
            return ensure_default_bundle(emit, corpus=corpus)
        return None
    finally:
        done()


def _model_and_protocol(b: Bundle | None, model: str | Path | None, top_k: int | None,
                        max_searches: int | None) -> tuple[Path, str, Any]:
    """The model's path, where it came from (`Agent.info`'s model_from) and the protocol config."""
    settings = None   # the default model's protocol settings, when it is the one
    if model is not None:
        model_path, model_from = Path(model).expanduser(), "--model"
    elif b is not None:
        model_path, model_from = b.model_path, "bundle"
    else:
        model_path, settings = default_agent_model()
        model_from = "default model"
    config = b.protocol(top_k, max_searches) if b is not None else protocol_config(settings, top_k, max_searches)
    return model_path, model_from, config


def load_pool(engines: int = 1, max_waiting: int = 8, **load_kwargs: Any) -> Any:
    """An `AgentPool` of `engines` agents for what `load_agent(**load_kwargs)` loads: one
    retriever, N engines of the same model, each with its own KV cache."""
    from ..agent.pool import AgentPool
    from ..engines import open_engine

    if engines < 1:   # before a model loads
        raise ValueError(f"engines must be >= 1, got {engines}")
    first = load_agent(**load_kwargs)
    offload = {"n_gpu_layers": first.info["gpu_layers"]} if first.info.get("gpu_layers") else {}

    def another_engine() -> Any:
        return open_engine(first.info["model"], n_ctx=first.engine.n_ctx, threads=load_kwargs.get("threads"),
                           **offload)

    return AgentPool.around(first, another_engine, engines, max_waiting)


def gpu_options(model_path: Path, gpu_layers: int | None, b: Bundle | None) -> dict[str, Any]:
    """llama.cpp's `n_gpu_layers` for a GGUF model: `--gpu-layers`, else the bundle's, else 0.

    Other engines take no such option: an explicit nonzero value for them is an error,
    a bundle's default is left unused (its model was replaced by --model)."""
    from ..engines import model_kind

    layers = gpu_layers if gpu_layers is not None else (b.gpu_layers if b is not None else 0)
    if layers < -1:
        raise InputError(f"--gpu-layers must be >= -1 (-1: all layers), got {layers}")
    if model_kind(model_path) != "gguf":
        if gpu_layers:
            raise InputError("--gpu-layers applies to GGUF models (llama.cpp) only", model_path)
        return {}
    return {"n_gpu_layers": layers}


def _retriever(b: Bundle | None, index: str | Path | None, threads: int | None, encoder: str | None) -> Any:
    from ..retrieval.retrievers import open_index

    if index is not None:
        return open_index(Path(index).expanduser(), encoder=encoder, threads=threads)
    assert b is not None
    return open_index(b.index_path, encoder=encoder or bundle_encoder(b, threads), threads=threads)


def bundle_encoder(b: Bundle, threads: int | None = None) -> Any:
    """The query encoder a bundle carries (None for a BM25 index)."""
    enc = b.manifest.get("encoder")
    if not enc:
        return None
    path = b.path / enc["path"]
    if enc.get("format") == "minilm-int8-onnx":
        from ..retrieval.encoders import MiniLMOnnx

        return MiniLMOnnx(threads=threads, tokenizer_path=path / "tokenizer.json", model_path=path / "model.onnx")
    if enc.get("format") == "transformers":
        return str(path)
    raise InputError(f"unknown query encoder format {enc.get('format')!r} in the bundle manifest", b.path)
