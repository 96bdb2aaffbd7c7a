"""LoRA for `train sft | kd | ppo | dgpo | grpo` (the `lora:` config section), through peft.

The adapters are injected into the causal LM in place (`peft.inject_adapter_in_model`),
so the model keeps its own class and attributes (`base_model`, `get_output_embeddings`,
the layer modules the fast rollout engine calls): every loss, rollout and evaluation
path runs unchanged, only the trainable parameters differ. With `lora.train_norms` the
RMSNorm weights train too (they are tiny, and a depth-pruned student benefits).

Checkpoints of a LoRA run hold two things (`save_weights`):

- the **merged** model, W + B @ A * alpha / r in place of every adapted weight, in
  transformers format: what rollout, eval and `export gguf` read, as for a full run;
- `adapter/`: the adapter alone, compact - `adapter_model.safetensors` and
  `adapter_config.json` in peft's own format (`PeftModel.from_pretrained(base, dir)`
  reads them), plus `norms.safetensors` with the trained norm weights when
  `train_norms` is on; in `lora.save_dtype` (bf16 by default). `load_adapter` puts
  both back on a base model.

Resuming needs neither: accelerate's `state/` holds the live model, adapters included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError

ADAPTER_DIR = "adapter"
PEFT_PREFIX = "base_model.model."     # peft's key prefix in adapter_model.safetensors
DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def enabled(section: Any) -> bool:
    return section is not None and section.on


def apply_lora(model: Any, section: Any) -> Any:
    """Inject LoRA adapters per `section` (a no-op when lora.r is 0), fresh or loaded from
    `lora.init_from`; only adapters (and norms) train."""
    if not enabled(section):
        return model
    if section.init_from:
        return load_adapter(model, section.init_from, save_dtype=section.save_dtype)
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=section.r, lora_alpha=section.alpha or section.r, lora_dropout=section.dropout,
                        target_modules=list(section.target_modules), bias="none")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(section.target_modules) - present)
    if missing:
        raise InputError(f"key 'lora.target_modules': the model has no module named {', '.join(missing)} "
                         f"(its linear layers: {', '.join(sorted(_linear_names(model)))})")
    inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name or (section.train_norms and _is_norm(name)))
    # Frozen embeddings give inputs without gradients; (reentrant) gradient checkpointing would then
    # drop the adapters' gradients inside checkpointed blocks. The hook makes the embeddings' output
    # require them; it is enabled before the adapters go in (sft.py, kd.py, rl/loop.py).
    if getattr(model, "is_gradient_checkpointing", False):
        model.enable_input_require_grads()
    model._dgpo_lora = section  # read back by save_weights
    return model


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _linear_names(model: Any) -> set[str]:
    import torch

    return {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def lora_layers(model: Any) -> dict[str, Any]:
    """Module name -> peft LoraLayer, for every adapted module of `model`."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def is_lora(model: Any) -> bool:
    return bool(lora_layers(model))


def merged_state_dict(model: Any) -> dict:
    """The model's weights under their plain names, each adapted weight replaced by W + B @ A * scale.

    The live model is left as it is (training goes on); only the returned tensors are new.
    """
    layers = lora_layers(model)
    out = {}
    for key, value in model.state_dict().items():
        if "lora_" in key:
            continue
        module, _, leaf = key.rpartition(".")
        if module.endswith(".base_layer"):
            owner = module.removesuffix(".base_layer")
            if leaf == "weight":
                delta = layers[owner].get_delta_weight("default")
                value = (value.float() + delta.float()).to(value.dtype)
            key = f"{owner}.{leaf}"
        out[key] = value.detach()
    return out


def save_weights(model: Any, folder: Path, state_dict: dict | None = None) -> None:
    """`model.save_pretrained(folder)`, merged and with `adapter/` beside it for a LoRA model."""
    if not is_lora(model):
        model.save_pretrained(folder, state_dict=state_dict)
        return
    model.save_pretrained(folder, state_dict=merged_state_dict(model))
    save_adapter(model, Path(folder) / ADAPTER_DIR)


def save_checkpoint(model: Any, tokenizer: Any, out: str | Path, extra: dict | None = None) -> Path:
    """models.save_checkpoint, LoRA-aware (merged weights plus `adapter/`)."""
    from .models import save_checkpoint as save_plain

    if not is_lora(model):
        return save_plain(model, tokenizer, out, extra)
    from .models import atomic_dir, write_provenance

    out = Path(out)
    with atomic_dir(out) as tmp:
        save_weights(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        write_provenance(tmp, extra)
    return out


def save_adapter(model: Any, folder: Path) -> None:
    """adapter_model.safetensors + adapter_config.json (peft's format), norms.safetensors when trained."""
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file

    section = model._dgpo_lora
    dtype = getattr(torch, DTYPES[section.save_dtype])
    folder.mkdir(parents=True, exist_ok=True)
    adapters, norms = {}, {}
    for name, param in model.named_parameters():
        if "lora_" in name:
            adapters[PEFT_PREFIX + name.replace(".default", "")] = param.detach().to("cpu", dtype).contiguous()
        elif section.train_norms and _is_norm(name):
            norms[name] = param.detach().to("cpu", dtype).contiguous()
    save_file(adapters, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    if norms:
        save_file(norms, str(folder / "norms.safetensors"), metadata={"format": "pt"})
    config = LoraConfig(r=section.r, lora_alpha=section.alpha or section.r, lora_dropout=section.dropout,
                        target_modules=list(section.target_modules), bias="none", task_type="CAUSAL_LM")
    config.save_pretrained(str(folder))


def adapter_config(folder: str | Path) -> dict:
    """The saved adapter's adapter_config.json (peft's keys); a missing or unreadable one is an input error."""
    path = Path(folder) / "adapter_config.json"
    if not Path(folder).exists():
        raise InputError("no such adapter folder", folder)
    if Path(folder).is_file():   # its adapter_config.json, say: the folder holding it is the adapter
        raise InputError("is a file; --adapter (lora.init_from) names the adapter's folder, the one that holds "
                         "adapter_config.json", folder)
    if not path.is_file():
        raise InputError("not a LoRA adapter folder (no adapter_config.json)", folder)
    try:
        raw = json.loads(path.read_text())
    except ValueError as e:
        raise InputError(f"not an adapter config ({e})", path) from None
    if not isinstance(raw, dict):
        raise InputError("not an adapter config (not a JSON object)", path)
    return raw


def read_adapter(folder: str | Path, save_dtype: str = "bf16") -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(LoRASection, adapter tensors, norm tensors) of the adapter saved in `folder`, each file checked:
    a missing, cut or foreign one is an InputError naming it, before any model is loaded or touched."""
    from .config import LoRASection

    folder = Path(folder)
    raw = adapter_config(folder)
    norms_file = folder / "norms.safetensors"
    try:
        section = LoRASection(r=int(raw["r"]), alpha=float(raw["lora_alpha"]),
                              dropout=float(raw["lora_dropout"]), target_modules=sorted(raw["target_modules"]),
                              train_norms=norms_file.is_file(), save_dtype=save_dtype)
    except (KeyError, TypeError, ValueError) as e:   # a hand-edited or foreign config: say which key
        raise InputError(f"not a LoRA adapter config (r, lora_alpha, lora_dropout, target_modules: "
                         f"{type(e).__name__} {e})", folder / "adapter_config.json") from None
    weights = _read_tensors(folder / "adapter_model.safetensors")
    norms = _read_tensors(norms_file) if norms_file.is_file() else {}
    return section, weights, norms


def load_adapter(model: Any, folder: str | Path, save_dtype: str = "bf16",
                 adapter: tuple[Any, dict[str, Any], dict[str, Any]] | None = None) -> Any:
    """Inject the adapter saved in `folder` into a base `model` and load its weights (and norms);
    they train from there (`save_dtype`: of the adapters this model's checkpoints will save).
    `adapter`: what `read_adapter(folder)` returned, for a caller that checked it before loading the model."""
    import torch

    folder = Path(folder)
    section, weights, norms = adapter or read_adapter(folder, save_dtype)
    norms_file = folder / "norms.safetensors"
    apply_lora(model, section)
    params = dict(model.named_parameters())
    saved = {key.removeprefix(PEFT_PREFIX).replace(".weight", ".default.weight"): value
             for key, value in weights.items()}
    unknown = sorted(set(saved) - set(params))
    unfilled = sorted(n for n in params if "lora_" in n and n not in saved)
    if unknown or unfilled:  # an adapter made for another depth or architecture
        raise InputError(f"the adapter does not fit the model: {len(unknown)} of its tensors have no place in it "
                         f"and {len(unfilled)} of the model's adapter weights are not in it "
                         f"(first: {(unknown or unfilled)[0]})", folder)
    with torch.no_grad():
        for name, value in saved.items():
            if params[name].shape != value.shape:
                raise InputError(f"the adapter does not fit the model: {name} is {tuple(value.shape)} in the adapter, "
                                 f"{tuple(params[name].shape)} in the model", folder)
            params[name].copy_(value.to(params[name].dtype))
        for name, value in norms.items():   # norms of another model: the same refusal, not a KeyError
            if name not in params or params[name].shape != value.shape:
                raise InputError(f"the adapter's norms do not fit the model: {name} "
                                 f"{'has no place in it' if name not in params else 'has another shape'}",
                                 norms_file)
            params[name].copy_(value.to(params[name].dtype))
    return model


def _read_tensors(path: Path) -> dict[str, Any]:
    """Every tensor of a safetensors file; a missing, cut or foreign file is an InputError naming it."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise InputError("no such file (an adapter folder holds adapter_config.json and "
                         "adapter_model.safetensors)", path)
    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError (and OSError)
        raise InputError(f"not a readable safetensors file ({e})", path) from None


def merged_copy(model: Any) -> Any:
    """A plain (adapter-free) copy of a LoRA `model` holding its merged weights."""
    import copy

    from peft.tuners.tuners_utils import BaseTunerLayer

    plain = copy.deepcopy(model)
    for name, module in list(plain.named_modules()):
        if isinstance(module, BaseTunerLayer):  # put each adapted layer's base layer back in its place
            parent, _, leaf = name.rpartition(".")
            setattr(plain.get_submodule(parent) if parent else plain, leaf, module.get_base_layer())
    plain.load_state_dict(merged_state_dict(model))
    plain.requires_grad_(True)  # the adapters froze the base weights; a copy trains (or is frozen) as a whole
    del plain._dgpo_lora
    return plain


def merge_adapter(base_dir: str | Path, adapter_dir: str | Path, out: str | Path) -> Path:
    """`dgpo-edge model merge`: a base checkpoint plus a saved adapter -> a checkpoint like a LoRA
    run's (merged weights, `adapter/` beside them). RL can then start from a shipped student."""
    from .models import check_checkpoint, check_out, load_checkpoint

    check_out(out, base_dir, adapter_dir)
    check_checkpoint(base_dir)
    adapter = read_adapter(adapter_dir)   # a broken adapter fails before the base loads, in one line
    model, tokenizer = load_checkpoint(base_dir)
    load_adapter(model, adapter_dir, adapter=adapter)
    return save_checkpoint(model, tokenizer, out, extra={
        "source": str(base_dir), "adapter": str(adapter_dir), "made_by": "dgpo-edge model merge"})

