"""A trained student rebuilt as a GGUF from its base GGUF and a LoRA adapter, without torch.

A student trained as LoRA over a depth-pruned base model is, weight for weight,

    W = dequantize(base tensor)  +  B @ A * alpha / r      (for every adapted matrix)

because training loaded the base GGUF by dequantizing it (transformers uses the `gguf`
package's own dequantizers). So the laptop needs only the base GGUF, which it has, and the
adapter (a few MiB): `build_student_gguf` keeps the chosen layers of the base, copies every
tensor the adapter does not touch byte for byte (the embedding stays as quantized as it was
in training), writes each adapted matrix as base + delta in the asked type (F16 or Q8_0, or
Q4_0 to trade quality for size), and replaces norm weights the adapter trained. The output is
deterministic: the same base, adapter and type give the same bytes, so a shipped student can
be checked against a recorded sha256.

The adapter is peft's format (`adapter_model.safetensors` + `adapter_config.json`) with an
optional `norms.safetensors` of trained RMSNorm weights, keys in transformers' names
(`model.layers.3.self_attn.q_proj...`); layer indices are the pruned student's, mapped to
the base's through `layers`. llama.cpp's llama architecture stores q/k rows permuted for its
RoPE layout, so the q/k deltas are permuted the same way before they are added.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..jsonio import atomic_path

QUANTS = ("f16", "q8_0", "q4_0")
_HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
_LAYER_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(.+?)(?:\.lora_([AB]))?\.weight$")
_ST_DTYPES = {"F32": np.float32, "F16": np.float16}


# --- safetensors, read with numpy alone -----------------------------------------------------

def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a .safetensors file as float32 numpy arrays (F32, F16 and BF16)."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not a safetensors file ({e})", path) from None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = (8 + n + int(o) for o in info["data_offsets"])
        buf = raw[start:end]
        if info["dtype"] == "BF16":   # the top half of a float32
            arr = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] in _ST_DTYPES:
            arr = np.frombuffer(buf, _ST_DTYPES[info["dtype"]]).astype(np.float32)
        else:
            raise InputError(f"tensor {name!r} has dtype {info['dtype']}; expected F32, F16 or BF16", path)
        out[name] = arr.reshape(info["shape"])
    return out


# --- the adapter ------------------------------------------------------------------------------

def read_adapter(folder: str | Path) -> tuple[dict[tuple[int, str], np.ndarray], dict[tuple[int, str], np.ndarray],
                                                dict[str, np.ndarray]]:
    """(deltas, layer norms, other norms): deltas[(layer, module)] = B @ A * scale in HF layout."""
    folder = Path(folder)
    config_path = folder / "adapter_config.json"
    if not config_path.is_file():
        raise InputError("not a LoRA adapter folder (no adapter_config.json)", folder)
    config = json.loads(config_path.read_text(encoding="utf-8"))
    r, alpha = int(config["r"]), float(config["lora_alpha"])
    scale = alpha / (r ** 0.5 if config.get("use_rslora") else r)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in read_safetensors(folder / "adapter_model.safetensors").items():
        m = _LAYER_KEY.match(key)
        if not m or not m.group(3):
            raise InputError(f"unexpected adapter tensor {key!r} (only per-layer lora_A/lora_B)",
                             folder / "adapter_model.safetensors")
        pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = value
    deltas = {k: (p["B"] @ p["A"]) * scale for k, p in pairs.items()}
    layer_norms, other_norms = {}, {}
    norms_file = folder / "norms.safetensors"
    for key, value in (read_safetensors(norms_file) if norms_file.is_file() else {}).items():
        m = _LAYER_KEY.match(key)
        if m:
            layer_norms[(int(m.group(1)), m.group(2))] = value
        elif key == "model.norm.weight":
            other_norms["output_norm.weight"] = value
        else:
            raise InputError(f"unexpected norm tensor {key!r}", norms_file)
    return deltas, layer_norms, other_norms


def rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half q/k rows -> llama.cpp's interleaved pairs (its llama architecture)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# --- the GGUF ------------------------------------------------------------------------------------

def build_student_gguf(base: str | Path, adapter: str | Path | None, layers: Sequence[int],
                       out: str | Path, quant: str = "q8_0") -> Path:
    """Write `out`: `base` cut to `layers` (in that order), with `adapter` merged (None: no adapter)."""
    import gguf

    if quant not in QUANTS:
        raise InputError(f"unknown student quant {quant!r} (choose from {', '.join(QUANTS)})")
    reader = gguf.GGUFReader(str(base))
    arch = str(reader.fields["general.architecture"].contents())
    n_base = int(reader.fields[f"{arch}.block_count"].contents())
    if not layers or any(not 0 <= i < n_base for i in layers) or len(set(layers)) != len(layers):
        raise InputError(f"layers must be distinct indices in 0..{n_base - 1}, got {list(layers)}", base)
    deltas, layer_norms, other_norms = read_adapter(adapter) if adapter else ({}, {}, {})
    new = {(kept, gg): (i, hf) for i, kept in enumerate(layers) for hf, gg in _HF_TO_GGUF.items()}
    used = {(i, hf) for i, kept in enumerate(layers) for hf in _HF_TO_GGUF}
    stray = sorted((set(deltas) | set(layer_norms)) - used)
    if stray:
        raise InputError(f"the adapter has tensors for layers/modules the student lacks: {stray[:3]}", adapter)
    heads = (int(reader.fields[f"{arch}.attention.head_count"].contents()),
             int(reader.fields[f"{arch}.attention.head_count_kv"].contents()))
    with atomic_path(Path(out)) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch)
        _copy_fields(reader, writer, arch, len(layers), quant)
        for t in _ordered_tensors(reader, layers):
            m = re.match(r"blk\.(\d+)\.(.+)\.weight$", t.name)
            if m is None:
                _add_tensor(writer, t.name, t, other_norms.get(t.name), None, quant)
                continue
            i, hf = new[(int(m.group(1)), m.group(2))]
            delta = deltas.get((i, hf))
            if delta is not None and arch == "llama" and hf in ("self_attn.q_proj", "self_attn.k_proj"):
                delta = rope_permute(delta, heads[0] if hf.endswith("q_proj") else heads[1])
            _add_tensor(writer, f"blk.{i}.{m.group(2)}.weight", t, layer_norms.get((i, hf)), delta, quant)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return Path(out)


def _ordered_tensors(reader: Any, layers: Sequence[int]) -> list[Any]:
    """Non-layer tensors in file order, then the kept layers' tensors in the student's layer order."""
    by_layer: dict[int, list[Any]] = {}
    rest = []
    for t in reader.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        (by_layer.setdefault(int(m.group(1)), []) if m else rest).append(t)
    return rest + [t for kept in layers for t in by_layer.get(kept, [])]


def _add_tensor(writer: Any, name: str, t: Any, replace: np.ndarray | None, delta: np.ndarray | None,
                quant: str) -> None:
    import gguf

    T = gguf.GGMLQuantizationType
    if replace is not None:                       # a trained norm
        writer.add_tensor(name, replace.astype(np.float32))
    elif delta is None:                           # untouched: the same bytes
        writer.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)
    else:
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        if w.shape != delta.shape:
            raise InputError(f"adapter delta for {name} has shape {delta.shape}, the base {w.shape}")
        w = w + delta.astype(np.float32)
        if quant == "f16":
            writer.add_tensor(name, w.astype(np.float16))
        else:
            qtype = T.Q8_0 if quant == "q8_0" else T.Q4_0
            writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)


_FILE_TYPES = {"f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0", "q4_0": "MOSTLY_Q4_0"}


def _copy_fields(reader: Any, writer: Any, arch: str, n_layers: int, quant: str) -> None:
    """Every metadata field of the base, with the new layer count and file type."""
    import gguf

    V = gguf.GGUFValueType
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.block_count":
            writer.add_block_count(n_layers)
        elif name == "general.file_type":
            writer.add_file_type(getattr(gguf.LlamaFileType, _FILE_TYPES[quant]))
        else:
            vtype = field.types[0]
            sub = field.types[-1] if vtype == V.ARRAY else None
            writer.add_key_value(name, field.contents(), vtype, sub_type=sub)


# --- the student the package ships -----------------------------------------------------------------

SHIPPED = Path(__file__).with_name("shipped")
ENV_STUDENT = "DGPO_EDGE_STUDENT"   # a folder with student.json instead of the shipped one; "none": no student
_SPEC_KEYS = ("name", "base", "layers", "quant", "adapter", "index_kind", "protocol")


@dataclass(frozen=True)
class ShippedStudent:
    """`student.json` and the adapter folder beside it (see docs/bundles.md)."""

    folder: Path
    spec: dict

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def description(self) -> str:
        b = self.spec["base"]
        return (f"student {self.name}: LoRA over {b['package']} {b['version']} {b['file']}, "
                f"{len(self.spec['layers'])} layers, {self.spec['quant']}")


def shipped_student(folder: str | Path | None = None) -> ShippedStudent | None:
    """The student to serve by default: `folder`, else $DGPO_EDGE_STUDENT, else the shipped one."""
    choice = str(folder) if folder is not None else os.environ.get(ENV_STUDENT, "")
    if choice.lower() == "none":
        return None
    root = Path(choice).expanduser() if choice else SHIPPED
    path = root / "student.json"
    if not path.is_file():
        if choice:
            raise InputError(f"no student.json here (set {ENV_STUDENT}=none for the base model)", root)
        return None
    return ShippedStudent(root, _read_spec(path))


def _read_spec(path: Path) -> dict:
    """student.json, checked as a bundle manifest is: a spec that is not JSON, or whose protocol the
    agent would refuse (top_k 0, a count given as true), was a traceback once the student loaded."""
    from ..protocol import ProtocolConfig
    from .core import check_search_settings

    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"not a student spec (not JSON: {e})", path) from None
    if not isinstance(spec, dict):
        raise InputError("not a student spec (not a JSON object)", path)
    missing = [k for k in _SPEC_KEYS if k not in spec]
    if missing or spec["quant"] not in QUANTS:
        raise InputError(f"student.json lacks {', '.join(missing)} or names an unknown quant", path)
    if not isinstance(spec["protocol"], dict):
        raise InputError('bad protocol settings: "protocol" must be an object', path)
    check_search_settings(spec["protocol"], path)
    try:
        ProtocolConfig(**spec["protocol"])   # as the default bundle builds it
    except (TypeError, ValueError) as e:
        raise InputError(f"bad protocol settings: {e}", path) from None
    return spec


def student_gguf(student: ShippedStudent, base: Path, out_dir: Path) -> Path:
    """The student's GGUF in `out_dir`, rebuilt from `base` after checking every input's sha256."""
    from ..digests import matches   # hashes a file once per change, not on every start

    want = student.spec["base"]["sha256"]
    if not matches(base, want):
        raise InputError(f"the base model is not the one the student was trained on (sha256 {want[:12]}…)", base)
    adapter = student.folder / "adapter"
    for name, digest in student.spec["adapter"].items():
        if not (adapter / name).is_file() or not matches(adapter / name, digest):
            raise InputError("the student's adapter file is damaged (sha256 mismatch); reinstall dgpo-edge",
                             adapter / name)
    # The adapter's digest in the name: a cached build of another adapter under the same name is never reused.
    tag = student.spec["adapter"]["adapter_model.safetensors"][:12]
    out = out_dir / f"{student.name}-{tag}-{student.spec['quant']}.gguf"
    if not out.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        build_student_gguf(base, adapter, student.spec["layers"], out, student.spec["quant"])
    return out
