"""`dgpo-edge export ...`: GGUF and ONNX exports with parity checks (and bundles)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .common import console, needs_extra, require_extra, user_errors, working
from .export_bundle import bundle_command

app = typer.Typer(help="Export a checkpoint to GGUF (llama.cpp) or ONNX (onnxruntime-genai), checked.",
                  no_args_is_help=True)


def _report(result: dict, path: Path, as_json: bool) -> None:
    from ..export.parity import format_parity, save_parity

    save_parity(result, path)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        console.print(format_parity(result), highlight=False)
        console.print(f"parity written to {path}", highlight=False)


def _fail_if(result: dict, strict: bool) -> None:
    if strict and not result["passed"]:
        raise typer.Exit(1)


@app.command("gguf")
@needs_extra("export", "torch", "gguf", "transformers")
@user_errors
def gguf_command(
    model: str = typer.Argument(..., help="A transformers checkpoint directory (or a hub id, with a hub)."),
    out: Path = typer.Option(..., "--out", help="GGUF file to write."),
    quant: str = typer.Option("q8_0", "--quant", help="f16, bf16, q8_0, q4_0 (written directly) or q4_k_m, q4_k_s, q5_k_m, q6_k (via llama.cpp)."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Check tokenizer, logits and greedy agreement against transformers; writes FILE.parity.json."),
    pre: Optional[str] = typer.Option(None, "--pre", help="llama.cpp pre-tokenizer name, when detection from tokenizer.json fails (e.g. qwen2, smollm, llama-bpe)."),
    threads: int = typer.Option(2, "--threads", min=1, help="Threads for quantization and the llama.cpp check."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when the parity check fails."),
    as_json: bool = typer.Option(False, "--json", help="Print the parity result as JSON."),
) -> None:
    """Write a GGUF with the project's own writer, then check it in llama.cpp."""
    from ..export.gguf_verify import verify_gguf
    from ..export.gguf_writer import write_gguf
    from ..export.parity import parity_path
    from ..export.quantize import LLAMA_CPP_QUANTS
    from ..train.models import quiet_transformers

    if verify or quant.lower() in LLAMA_CPP_QUANTS:   # before minutes of writing, not after
        require_extra("export", "llama_cpp")
    quiet_transformers()
    with working(f"writing {out.name} ({quant})"):
        path = write_gguf(model, out, quant=quant, pre=pre, threads=threads)
    if not as_json:
        console.print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)", highlight=False)
    # an earlier export's check no longer describes the file: gone before the new check runs, so a
    # check interrupted or failing (Ctrl-C, a model transformers cannot load) leaves none behind for
    # `export bundle` to copy into a manifest as this file's parity
    parity_path(path).unlink(missing_ok=True)
    if not verify:
        return
    with working("checking parity with transformers"):
        result = verify_gguf(model, path, quant.lower(), threads=threads)
    _report(result, parity_path(path), as_json)
    _fail_if(result, strict)


@app.command("onnx")
@needs_extra("export", "torch", "onnxruntime_genai", "onnx_ir", "onnx", "transformers")
@user_errors
def onnx_command(
    model: str = typer.Argument(..., help="A transformers checkpoint directory (or a hub id, with a hub)."),
    out: Path = typer.Option(..., "--out", help="Directory to write (model.onnx, genai_config.json, tokenizer)."),
    precision: str = typer.Option("int4", "--precision", help="int4 (weights 4-bit, lm_head 8-bit) or fp32."),
    verify: bool = typer.Option(True, "--verify/--no-verify", help="Check tokenizer, logits and greedy agreement against transformers; writes OUT/onnx.parity.json."),
    threads: int = typer.Option(2, "--threads", min=1, help="Threads for the builder."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 when the parity check fails."),
    as_json: bool = typer.Option(False, "--json", help="Print the parity result as JSON."),
) -> None:
    """Build an onnxruntime-genai model with its model builder, then check it."""
    from ..export.onnx_export import export_onnx, verify_onnx
    from ..export.parity import parity_path
    from ..train.models import quiet_transformers

    quiet_transformers()
    with working(f"building {out.name} ({precision})"):
        path = export_onnx(model, out, precision=precision, threads=threads)
    if not as_json:
        console.print(f"wrote {path}", highlight=False)
    if not verify:
        return  # the directory was replaced as a whole: no stale parity file inside
    with working("checking parity with transformers"):
        result = verify_onnx(model, path, precision)
    _report(result, parity_path(path), as_json)
    _fail_if(result, strict)


# `export bundle` lives with the bundle commands' helpers.
app.command("bundle")(bundle_command)
