"""The shipped student: a LoRA adapter merged into a cut base GGUF without torch (bundle/student.py).

The reference is the training side's own path: the base GGUF loaded into transformers
(dequantized), pruned, the adapter merged in torch, exported by the project's GGUF writer.
The numpy path must give the same tensors, and real llama.cpp the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from train_helpers import smol_tokenizer_dir, tiny_model_dir

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")
safetensors_torch = pytest.importorskip("safetensors.torch")

from dgpo_edge.bundle.student import build_student_gguf, read_adapter, read_safetensors  # noqa: E402
from dgpo_edge.errors import InputError  # noqa: E402

KEEP = [0, 2, 3]
MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    """A 4-layer Llama as a Q8_0 GGUF, and that GGUF read back into transformers then pruned."""
    from dgpo_edge.export.gguf_writer import write_gguf
    from dgpo_edge.train.models import from_gguf, prune_checkpoint

    root = tmp_path_factory.mktemp("student")
    tok = smol_tokenizer_dir(tmp_path_factory)
    hf = tiny_model_dir(tok, root / "hf", num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    gguf_file = write_gguf(hf, root / "base.gguf", quant="q8_0")
    from_gguf(gguf_file, root / "dequant")
    prune_checkpoint(root / "dequant", root / "pruned", layers=KEEP)
    return {"gguf": gguf_file, "pruned": root / "pruned", "root": root}


def write_adapter(folder: Path, pruned: Path, r: int = 4, alpha: float = 8.0, seed: int = 0) -> dict:
    """A random adapter on every linear layer plus trained norms, in peft's file format."""
    gen = torch.Generator().manual_seed(seed)
    state = safetensors_torch.load_file(str(next(pruned.glob("*.safetensors"))))
    adapters, norms = {}, {}
    for i in range(len(KEEP)):
        for m in MODULES:
            w = state[f"model.layers.{i}.{m}.weight"]
            adapters[f"base_model.model.model.layers.{i}.{m}.lora_A.weight"] = torch.randn(r, w.shape[1], generator=gen) * 0.1
            adapters[f"base_model.model.model.layers.{i}.{m}.lora_B.weight"] = torch.randn(w.shape[0], r, generator=gen) * 0.1
        norms[f"model.layers.{i}.input_layernorm.weight"] = 1 + torch.randn(64, generator=gen) * 0.1
    norms["model.norm.weight"] = 1 + torch.randn(64, generator=gen) * 0.1
    folder.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file({k: v.to(torch.bfloat16) for k, v in adapters.items()},
                                str(folder / "adapter_model.safetensors"))
    safetensors_torch.save_file({k: v.to(torch.bfloat16) for k, v in norms.items()}, str(folder / "norms.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": alpha, "lora_dropout": 0.0}))
    return {"adapters": {k: v.to(torch.bfloat16).float() for k, v in adapters.items()},
            "norms": {k: v.to(torch.bfloat16).float() for k, v in norms.items()}, "scale": alpha / r}


def merged_reference(pruned: Path, adapter: dict, out: Path) -> Path:
    """The torch path: pruned student + B @ A * scale, norms replaced, exported at F16."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dgpo_edge.export.gguf_writer import write_gguf

    model = AutoModelForCausalLM.from_pretrained(pruned, dtype=torch.float32)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for key, a in adapter["adapters"].items():
            if key.endswith("lora_A.weight"):
                name = key.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
                b = adapter["adapters"][key.replace("lora_A", "lora_B")]
                params[name] += (b @ a) * adapter["scale"]
        for name, value in adapter["norms"].items():
            params[name].copy_(value)
    model.save_pretrained(out / "merged")
    AutoTokenizer.from_pretrained(pruned).save_pretrained(out / "merged")
    return write_gguf(out / "merged", out / "reference.gguf", quant="f16")


def tensors(path: Path) -> dict[str, np.ndarray]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
            for t in reader.tensors}


def test_merged_student_equals_the_torch_path(base, tmp_path):
    adapter = write_adapter(tmp_path / "adapter", base["pruned"])
    reference = merged_reference(base["pruned"], adapter, tmp_path)
    ours = build_student_gguf(base["gguf"], tmp_path / "adapter", KEEP, tmp_path / "student.gguf", quant="f16")
    want, got = tensors(reference), tensors(ours)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-3, atol=2e-3, err_msg=name)
    # the adapter changed the adapted weights (else the test would prove nothing)
    base_t = tensors(base["gguf"])
    assert not np.allclose(got["blk.1.attn_q.weight"], base_t["blk.2.attn_q.weight"], atol=1e-3)
    assert gguf.GGUFReader(str(ours)).fields["llama.block_count"].contents() == len(KEEP)


def test_untouched_tensors_are_copied_byte_for_byte(base, tmp_path):
    write_adapter(tmp_path / "adapter", base["pruned"])
    ours = build_student_gguf(base["gguf"], tmp_path / "adapter", KEEP, tmp_path / "s.gguf", quant="q8_0")
    src = {t.name: bytes(np.asarray(t.data)) for t in gguf.GGUFReader(str(base["gguf"])).tensors}
    out = {t.name: bytes(np.asarray(t.data)) for t in gguf.GGUFReader(str(ours)).tensors}
    assert out["token_embd.weight"] == src["token_embd.weight"]
    assert out["blk.2.ffn_norm.weight"] == src["blk.3.ffn_norm.weight"]   # not trained: the base's
    assert out["blk.2.attn_norm.weight"] != src["blk.3.attn_norm.weight"]  # trained: replaced


def test_same_inputs_same_bytes(base, tmp_path):
    write_adapter(tmp_path / "adapter", base["pruned"])
    a = build_student_gguf(base["gguf"], tmp_path / "adapter", KEEP, tmp_path / "a.gguf")
    b = build_student_gguf(base["gguf"], tmp_path / "adapter", KEEP, tmp_path / "b.gguf")
    assert a.read_bytes() == b.read_bytes()


def test_llama_cpp_runs_the_student_like_the_reference(base, tmp_path):
    from dgpo_edge.export.gguf_verify import open_llama

    adapter = write_adapter(tmp_path / "adapter", base["pruned"])
    reference = merged_reference(base["pruned"], adapter, tmp_path)
    ours = build_student_gguf(base["gguf"], tmp_path / "adapter", KEEP, tmp_path / "student.gguf", quant="f16")
    logits = []
    for path in (reference, ours):
        llm = open_llama(path)
        ids = llm.tokenize(b"The capital of Peru is", add_bos=False)
        llm.eval(ids)
        logits.append(np.array(llm.scores[len(ids) - 1]))
        llm.close()
    np.testing.assert_allclose(logits[1], logits[0], atol=2e-2)
    assert logits[1].argmax() == logits[0].argmax()


def test_bf16_safetensors_read_exactly(tmp_path):
    values = torch.tensor([[1.5, -2.25], [3.0e-3, 7.0]], dtype=torch.bfloat16)
    safetensors_torch.save_file({"x": values, "y": values.half()}, str(tmp_path / "t.safetensors"))
    got = read_safetensors(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(got["x"], values.float().numpy())
    np.testing.assert_array_equal(got["y"], values.half().float().numpy())


def test_bad_adapter_and_layers_refused(base, tmp_path):
    with pytest.raises(InputError, match="no adapter_config.json"):
        read_adapter(tmp_path)
    write_adapter(tmp_path / "adapter", base["pruned"])
    with pytest.raises(InputError, match="layers must be distinct"):
        build_student_gguf(base["gguf"], tmp_path / "adapter", [0, 0, 9], tmp_path / "x.gguf")
    with pytest.raises(InputError, match="layers/modules the student lacks"):
        build_student_gguf(base["gguf"], tmp_path / "adapter", [0, 1], tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
