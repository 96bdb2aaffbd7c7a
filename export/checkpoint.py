"""Read a transformers checkpoint directory for export: config, tokenizer files, tensors.

Everything that can be wrong with the input is found here and reported as one InputError naming
the file: a missing directory, config or tokenizer, an architecture the writers do not support,
a truncated safetensors file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError

# transformers `model_type` -> the GGUF architecture name llama.cpp knows it by.
SUPPORTED_ARCHS = {"qwen2": "qwen2", "llama": "llama"}


@dataclass
class Checkpoint:
    """A transformers causal-LM checkpoint on disk, validated for export."""

    path: Path
    config: dict[str, Any]
    tokenizer: dict[str, Any]                      # tokenizer.json
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    weight_files: list[Path] = field(default_factory=list)

    @property
    def arch(self) -> str:
        return SUPPORTED_ARCHS[self.config["model_type"]]

    @property
    def name(self) -> str:
        return self.path.name

    def rope_theta(self) -> float:
        """transformers 5 moved rope_theta into `rope_parameters`; read either place."""
        rope = self.config.get("rope_parameters") or {}
        theta = rope.get("rope_theta", self.config.get("rope_theta"))
        if theta is None:
            raise InputError("config has no rope_theta (nor rope_parameters.rope_theta)",
                             self.path / "config.json")
        return float(theta)

    def head_dim(self) -> int:
        c = self.config
        return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])

    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))

    def tensors(self) -> Iterator[tuple[str, Any]]:
        """(name, float32 numpy array) for every stored tensor, one at a time."""
        import torch
        from safetensors import safe_open

        for wf in self.weight_files:
            try:
                with safe_open(wf, framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        yield name, f.get_tensor(name).to(torch.float32).numpy()
            except (OSError, RuntimeError, ValueError) as e:  # safetensors errors on a cut file
                raise InputError(f"unreadable weights ({e})", wf) from None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError("missing", path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"not valid JSON ({e})", path) from None
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object", path)
    return obj


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        files = [path / s for s in shards]
    else:
        files = [path / "model.safetensors"]
    for f in files:
        if not f.is_file():
            raise InputError("missing weights (only safetensors checkpoints are supported)", f)
        _check_safetensors_size(f)
    return files


def _check_safetensors_size(path: Path) -> None:
    """A safetensors file states its data size in its header; a shorter file is truncated."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 0 or 8 + n > size:
            raise InputError("truncated or not a safetensors file", path)
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise InputError("truncated or not a safetensors file (bad header)", path) from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise InputError(f"truncated safetensors: data needs {8 + n + end} bytes, file has {size}",
                         path)


def resolve_model(model: str | Path) -> Path:
    """A local checkpoint directory, or a hub id resolved from the local cache / a hub."""
    path = Path(model)
    if path.is_dir():
        return path
    if path.exists():
        raise InputError("expected a checkpoint directory, got a file", path)
    text = str(model)
    if text.count("/") == 1 and not text.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(text, allow_patterns=[
                "*.json", "*.safetensors", "*.jinja", "*.txt"]))
        except Exception as e:  # offline, unknown repo, gated: all one message for the user
            raise InputError(f"no such directory, and the hub gave no model ({type(e).__name__})",
                             path) from None
    raise InputError("no such directory", path)


def open_checkpoint(model: str | Path) -> Checkpoint:
    """Validate and open a checkpoint for export (raises InputError naming the bad file)."""
    path = resolve_model(model)
    config = _read_json(path / "config.json")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_ARCHS:
        raise InputError(f"unsupported architecture {model_type!r} (supported: "
                         f"{', '.join(sorted(SUPPORTED_ARCHS))})", path / "config.json")
    tok_path = path / "tokenizer.json"
    if not tok_path.is_file():
        raise InputError("missing tokenizer (a fast tokenizer.json is required)", tok_path)
    tokenizer = _read_json(tok_path)
    tok_config_path = path / "tokenizer_config.json"
    tok_config = _read_json(tok_config_path) if tok_config_path.is_file() else {}
    template = tok_config.get("chat_template")
    if isinstance(template, list):
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja = path / "chat_template.jinja"
    if jinja.is_file():  # transformers 5 saves the template beside the config
        template = jinja.read_text(encoding="utf-8")
    return Checkpoint(path=path, config=config, tokenizer=tokenizer, tokenizer_config=tok_config,
                      chat_template=template, weight_files=_weight_files(path))
