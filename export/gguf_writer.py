"""The project's own transformers -> GGUF writer, on the `gguf` package.

Qwen2 and Llama, tied or untied embeddings. F16, BF16, Q8_0 and Q4_0 are written directly
(gguf's numpy quantizers); K-quants (Q4_K_M, ...) are made by llama.cpp's `llama_model_quantize`
from an F16 file written first. Every file is written to a temp name and renamed into place.

    write_gguf("ckpt/", "model-q8_0.gguf", quant="q8_0")
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from dgpo_edge.bundle.student import rope_permute
from dgpo_edge import temps
from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import atomic_path, check_folder_path, check_outside_bundle

from .checkpoint import Checkpoint, open_checkpoint
from .gguf_vocab import KNOWN_PRE, add_vocab, build_vocab
from .quantize import LLAMA_CPP_QUANTS, quantize_gguf

# Quant types written in numpy by `gguf`; the rest come from llama.cpp (LLAMA_CPP_QUANTS).
NUMPY_QUANTS = ("f16", "bf16", "q8_0", "q4_0")
QUANTS = NUMPY_QUANTS + tuple(LLAMA_CPP_QUANTS)
_BLOCK = 32  # Q8_0/Q4_0 quantize rows in blocks of 32 values


def write_gguf(model: str | Path, out: str | Path, quant: str = "f16",
               pre: str | None = None, threads: int = 2) -> Path:
    """Export the checkpoint `model` (a directory or hub id) to the GGUF file `out`.

    `pre` overrides the detected llama.cpp pre-tokenizer name. Returns `out`.
    """
    quant = quant.lower()
    if quant not in QUANTS:
        raise InputError(f"unknown --quant {quant!r} (choose from {', '.join(QUANTS)})")
    out = Path(out)
    check_replaceable_gguf(out)   # before minutes of writing
    ckpt = open_checkpoint(model)
    _check_pre_loads(ckpt, pre)   # before minutes of writing
    if quant in NUMPY_QUANTS:
        with atomic_path(out) as tmp:
            _write(ckpt, tmp, quant, pre)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with temps.work_dir(out.parent, f".{out.name}.") as d:   # a killed export's f16 copy: swept next time
        f16 = d / "f16.gguf"
        _write(ckpt, f16, "f16", pre)
        with atomic_path(out) as tmp:
            quantize_gguf(f16, tmp, quant, threads=threads)
    return out


def _check_pre_loads(ckpt: Checkpoint, pre: str | None) -> None:
    """A --pre name llama.cpp does not know makes a file it refuses to load, and with --no-verify
    nothing else would notice. So the GGUF's metadata alone (no tensors: seconds) is written to a
    temp file and its vocabulary loaded in llama.cpp. Without llama.cpp here, only the names this
    writer detects itself are taken."""
    if pre is None:
        return
    try:
        import llama_cpp
    except ImportError:
        if pre not in KNOWN_PRE:
            raise InputError(f"--pre {pre!r} cannot be checked without llama-cpp-python; without it the names "
                             f"known here are {', '.join(KNOWN_PRE)}") from None
        return
    from llama_cpp._utils import suppress_stdout_stderr

    with tempfile.TemporaryDirectory(prefix="dgpo-edge-pre.") as d:
        meta = Path(d) / "vocab.gguf"
        _write(ckpt, meta, "f16", pre, tensors=False)
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        with suppress_stdout_stderr(disable=False):   # llama.cpp logs its load, and why it failed, to fd 2
            loaded = llama_cpp.llama_model_load_from_file(str(meta).encode(), params)
    if not loaded:
        raise InputError(f"llama.cpp could not load the vocabulary written with --pre {pre!r} (not a "
                         f"pre-tokenizer name it knows? Those detected here: {', '.join(KNOWN_PRE)})")
    llama_cpp.llama_model_free(loaded)


def check_replaceable_gguf(out: Path) -> None:
    """--out is a new file or an earlier GGUF: a folder, or a file of anything else (someone's
    notes given by mistake), is refused rather than replaced; so is a file inside a bundle (its own
    GGUF, which the bundle's manifest lists with its sha256)."""
    check_outside_bundle(out)
    if out.is_dir():
        raise InputError("is a folder; --out names the .gguf file to write", out)
    if not out.exists():
        check_folder_path(out)   # a file above it, where no folder can be made
    else:
        with open(out, "rb") as f:
            if f.read(4) != b"GGUF":
                raise InputError("exists and is not a GGUF file; refusing to replace it", out)


def _write(ckpt: Checkpoint, path: Path, quant: str, pre: str | None, tensors: bool = True) -> None:
    """The GGUF of `ckpt` at `path`; with tensors=False its metadata alone (seconds, not minutes),
    enough for llama.cpp to load the vocabulary."""
    import gguf

    arch = gguf.MODEL_ARCH.QWEN2 if ckpt.arch == "qwen2" else gguf.MODEL_ARCH.LLAMA
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    _add_hparams(writer, ckpt, quant)
    tokenizer, specials = effective_tokenizer(ckpt)
    add_vocab(writer, build_vocab(tokenizer, specials, ckpt.config, pre))
    if ckpt.chat_template:
        writer.add_chat_template(ckpt.chat_template)
    if tensors:
        _add_tensors(writer, ckpt, arch, quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def effective_tokenizer(ckpt: Checkpoint) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tokenizer pipeline transformers actually runs for this checkpoint, as tokenizer.json.

    transformers 5 rebuilds the pipeline of some model types' own tokenizer classes whatever
    tokenizer.json says (a `qwen2` checkpoint always gets Qwen2's split regex and NFC). Training
    tokenizes through AutoTokenizer, so llama.cpp must match that, not the file on disk.
    """
    import json

    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(ckpt.path)
        pipeline = json.loads(tok.backend_tokenizer.to_str())
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(f"transformers cannot load the tokenizer ({e})", ckpt.path) from None
    specials = {f"{name}_token": getattr(tok, f"{name}_token", None)
                for name in ("bos", "eos", "pad", "unk")}
    return pipeline, specials


_FILE_TYPES = {"f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0",
               "q4_0": "MOSTLY_Q4_0"}


def _add_hparams(writer: Any, ckpt: Checkpoint, quant: str) -> None:
    import gguf

    c = ckpt.config
    # either place may hold it (transformers 5's rope_parameters, the older rope_scaling), and a config
    # can carry both: a scaling in one that the other's "default" hid would be applied by transformers
    # and not by llama.cpp, a silent difference in every long prompt
    for key in ("rope_parameters", "rope_scaling"):
        rope = c.get(key) or {}
        kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
        if kind != "default":
            raise InputError(f"rope scaling {kind!r} ({key}) is not supported by this writer", ckpt.path / "config.json")
    writer.add_name(ckpt.name)
    writer.add_context_length(int(c.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(c["hidden_size"]))
    writer.add_block_count(int(c["num_hidden_layers"]))
    writer.add_feed_forward_length(int(c["intermediate_size"]))
    writer.add_head_count(int(c["num_attention_heads"]))
    writer.add_head_count_kv(int(c.get("num_key_value_heads") or c["num_attention_heads"]))
    head_dim = ckpt.head_dim()
    writer.add_rope_dimension_count(head_dim)
    if head_dim * c["num_attention_heads"] != c["hidden_size"]:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(ckpt.rope_theta())
    writer.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(int(c["vocab_size"]))
    writer.add_file_type(getattr(gguf.LlamaFileType, _FILE_TYPES[quant]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _tensor_type(data: Any, quant: str, is_output: bool) -> Any:
    """The GGML type of one tensor: norms and biases stay F32; rows not a multiple of the
    block size fall back to F16; in Q4_0 the output projection keeps Q8_0 (as llama.cpp keeps
    it at higher precision: 4-bit there costs the most quality)."""
    import gguf

    T = gguf.GGMLQuantizationType
    if data.ndim == 1:
        return T.F32
    if quant == "f16":
        return T.F16
    if quant == "bf16":
        return T.BF16
    if data.shape[-1] % _BLOCK:
        return T.F16
    if quant == "q4_0" and is_output:
        return T.Q8_0
    return T.Q8_0 if quant == "q8_0" else T.Q4_0


def _add_tensors(writer: Any, ckpt: Checkpoint, arch: Any, quant: str) -> None:
    import gguf
    import numpy as np

    c = ckpt.config
    n_layers = int(c["num_hidden_layers"])
    names = gguf.get_tensor_name_map(arch, n_layers)
    n_head = int(c["num_attention_heads"])
    n_kv = int(c.get("num_key_value_heads") or n_head)
    tied, seen = ckpt.tied(), set()
    for name, data in ckpt.tensors():
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise InputError(f"tensor {name!r} has no GGUF name for {ckpt.arch}",
                             ckpt.weight_files[0])
        if arch == gguf.MODEL_ARCH.LLAMA and name.endswith(("q_proj.weight", "k_proj.weight")):
            # HF Llama keeps q/k rows for rotate-half RoPE; llama.cpp's llama architecture wants them
            # interleaved in pairs (Qwen2 is rotate-half in llama.cpp too: no permute).
            data = rope_permute(data, n_head if "q_proj" in name else n_kv)
        is_output = gguf_name == "output.weight" or (tied and gguf_name == "token_embd.weight")
        qtype = _tensor_type(data, quant, is_output)
        if qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, data.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name, data.astype(np.float16))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        seen.add(gguf_name)
    if "token_embd.weight" not in seen:
        raise InputError("no embedding tensor (model.embed_tokens.weight)", ckpt.weight_files[0])
    if not tied and "output.weight" not in seen:
        raise InputError("untied model without lm_head.weight", ckpt.weight_files[0])
