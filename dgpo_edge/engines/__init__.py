"""Inference engines behind one interface: llama.cpp (GGUF), onnxruntime-genai (ONNX), transformers.

`open_engine(path)` picks the engine from what `path` is:

| path | engine | needs |
|---|---|---|
| a `.gguf` file (or a folder holding exactly one) | `LlamaCppEngine` | `llama-cpp-python` |
| a folder with `genai_config.json` | `OnnxGenaiEngine` | `onnxruntime-genai` |
| a folder with `config.json` (a transformers checkpoint) | `TransformersEngine` | `torch`, `transformers` |

Backends are imported when an engine is made, so importing this package is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import InputError
from .base import GREEDY, Engine, Generation, GenerationResult, Sampling

MODEL_KINDS = ("gguf", "onnx", "transformers")


def model_kind(path: str | Path) -> str:
    """"gguf", "onnx" or "transformers" for a model path; InputError naming it otherwise."""
    p = Path(path).expanduser()
    if p.is_file():
        with open(p, "rb") as f:
            magic = f.read(4)
        if magic == b"GGUF":
            return "gguf"
        raise InputError("not a GGUF model file (a model is a .gguf file, an ONNX folder with "
                         "genai_config.json, or a transformers folder with config.json)", p)
    if p.is_dir():
        if (p / "genai_config.json").is_file():
            return "onnx"
        if (p / "config.json").is_file():
            return "transformers"
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return "gguf"
        raise InputError("not a model folder: expected genai_config.json (ONNX), config.json "
                         "(transformers) or one .gguf file", p)
    raise InputError("no such model file or folder", p)


def gguf_file(path: str | Path) -> Path:
    """The .gguf file a path names (itself, or the one .gguf in a folder)."""
    p = Path(path).expanduser()
    return p if p.is_file() else sorted(p.glob("*.gguf"))[0]


def open_engine(path: str | Path, n_ctx: int = 4096, threads: int | None = None, **kwargs: Any) -> Engine:
    """The engine for a model path (see the module docstring); extra kwargs go to the engine."""
    kind = model_kind(path)
    if kind == "gguf":
        from .llama_cpp import LlamaCppEngine

        return LlamaCppEngine(gguf_file(path), n_ctx=n_ctx, threads=threads, **kwargs)
    if kind == "onnx":
        from .onnx_genai import OnnxGenaiEngine

        return OnnxGenaiEngine(path, n_ctx=n_ctx, threads=threads, **kwargs)
    from .transformers_engine import TransformersEngine

    return TransformersEngine(path, n_ctx=n_ctx, threads=threads, **kwargs)


__all__ = ["GREEDY", "MODEL_KINDS", "Engine", "Generation", "GenerationResult", "Sampling", "gguf_file",
           "model_kind", "open_engine"]
