"""`dgpo-edge export onnx`: onnxruntime-genai's builder plus the same parity checks.

A tiny random Qwen2 with the real Qwen tokenizer (needs ../shared): fp32 within the logit
tolerance with identical greedy generation; int4 agreement reported.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, invoke

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnx_ir")
pytest.importorskip("onnxruntime_genai")

from dgpo_edge.train import models  # noqa: E402


@pytest.fixture(scope="module")
def tiny_qwen(qwen_dir, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("tiny-qwen-onnx")
    return models.random_qwen2(qwen_dir, base / "tied", init_range=0.2)


def test_fp32_matches_transformers(tiny_qwen, tmp_path):
    out = tmp_path / "onnx"
    result = invoke("export", "onnx", tiny_qwen, "--out", out, "--precision", "fp32")
    assert result.exit_code == 0, result.output
    assert (out / "model.onnx").is_file() and (out / "genai_config.json").is_file()
    parity = json.loads((out / "onnx.parity.json").read_text())
    assert parity["format"] == "onnx" and parity["quant"] == "fp32"
    assert parity["tokenizer_match"] is True, parity["tokenizer_mismatch"]
    assert parity["rel_logit_diff"] <= parity["logit_tolerance"], parity
    assert parity["greedy_match"] == parity["greedy_n"], parity
    assert parity["passed"] is True
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.fixture(scope="module")
def tiny_smol_llama(tmp_path_factory) -> Path:
    """A tiny random Llama with SmolLM2's own tokenizer (digits split one by one), as a student
    made by `model from-gguf` without --as has."""
    try:
        gguf_file = models.smollm2_gguf()
    except Exception as e:
        pytest.skip(str(e))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = models.load_gguf_tokenizer(gguf_file)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                      initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    return models.save_checkpoint(LlamaForCausalLM(cfg).eval(), tokenizer,
                                  tmp_path_factory.mktemp("tiny-smol-llama") / "ckpt")


def test_llama_with_smollm2_tokenizer_is_checked_with_the_engines_tokenizer(tiny_smol_llama, tmp_path):
    # onnxruntime-genai's own tokenizer splits " ½ ٣" unlike tokenizer.json; the engine that runs
    # the folder encodes with tokenizer.json, so that is the tokenizer the check must judge.
    from dgpo_edge.engines import open_engine
    from dgpo_edge.export.parity import PARITY_TEXTS, Reference

    out = tmp_path / "onnx"
    result = invoke("export", "onnx", tiny_smol_llama, "--out", out, "--precision", "fp32", "--json")
    assert result.exit_code == 0, result.output
    parity = json.loads(result.stdout)
    assert parity["tokenizer_match"] is True, parity["tokenizer_mismatch"]
    assert parity["passed"] is True, parity
    assert isinstance(parity["genai_tokenizer_match"], bool)
    ref, engine = Reference.load(tiny_smol_llama), open_engine(out, threads=1)
    assert all(engine.encode(t) == ref.encode(t) for t in PARITY_TEXTS)


@pytest.fixture(scope="module")
def smol_qwen_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M as Qwen2 (shared with the other export tests through the base temp dir)."""
    try:
        gguf_file = models.smollm2_gguf()
    except Exception as e:
        pytest.skip(str(e))
    out = tmp_path_factory.getbasetemp() / "smollm2-qwen2"
    if not (out / "config.json").is_file():
        models.from_gguf(gguf_file, out, as_arch="qwen2")
    return out


@pytest.mark.slow
def test_int4_real_weights_agreement(smol_qwen_dir, tmp_path):
    """Random weights give near-tied logits, so 4-bit agreement is judged on SmolLM2's."""
    out = tmp_path / "onnx4"
    result = invoke("export", "onnx", smol_qwen_dir, "--out", out, "--precision", "int4", "--json")
    assert result.exit_code == 0, result.output
    parity = json.loads(result.stdout)
    assert parity == json.loads((out / "onnx.parity.json").read_text())
    assert parity["quant"] == "int4" and parity["tokenizer_match"] is True
    assert parity["logit_tolerance"] is None and parity["top1_agreement"] >= 0.6, parity
    weights = (out / "model.onnx.data").stat().st_size
    assert weights < 0.25 * (smol_qwen_dir / "model.safetensors").stat().st_size


def test_bad_inputs(tmp_path):
    ckpt = tmp_path / "m"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert_one_line_error(invoke("export", "onnx", ckpt, "--out", tmp_path / "o"),
                          "unsupported architecture 'bert'")
    assert_one_line_error(invoke("export", "onnx", ckpt, "--out", tmp_path / "o",
                                 "--precision", "int3"), "unknown --precision 'int3'")
    assert not (tmp_path / "o").exists()


def test_out_that_is_the_checkpoint_itself_is_refused(tiny_qwen, tmp_path):
    """`export onnx m --out m` replaced the transformers checkpoint with its own ONNX export."""
    import shutil

    ckpt = shutil.copytree(tiny_qwen, tmp_path / "m")
    before = sorted(p.name for p in ckpt.iterdir())
    for out in (ckpt, tmp_path / "." / "m" / ""):
        assert_one_line_error(invoke("export", "onnx", ckpt, "--out", out, "--precision", "fp32",
                                     "--no-verify"), "is also this command's input")
    assert sorted(p.name for p in ckpt.iterdir()) == before


def test_out_replaces_only_an_earlier_onnx_export(tiny_qwen, tmp_path):
    """Another transformers checkpoint given as --out was replaced whole by the export (its
    config.json and weights made it look like "a model folder"); only an ONNX export is replaced."""
    import shutil

    other = shutil.copytree(tiny_qwen, tmp_path / "other-checkpoint")
    before = sorted(p.name for p in other.iterdir())
    assert_one_line_error(invoke("export", "onnx", tiny_qwen, "--out", other, "--precision", "fp32", "--no-verify"),
                          str(other), "is not an ONNX export")
    assert sorted(p.name for p in other.iterdir()) == before
    out = tmp_path / "onnx"
    for _ in range(2):   # the second replaces the first
        result = invoke("export", "onnx", tiny_qwen, "--out", out, "--precision", "fp32", "--no-verify")
        assert result.exit_code == 0, result.output
    assert (out / "genai_config.json").is_file()
    (out / "notes.md").write_text("how I use it")   # an export with someone's file in it is no longer ours alone
    assert_one_line_error(invoke("export", "onnx", tiny_qwen, "--out", out, "--precision", "fp32", "--no-verify"),
                          "is not an ONNX export")
    assert (out / "notes.md").is_file()


def test_out_dot_fills_the_empty_folder_it_runs_in(tiny_qwen, tmp_path, monkeypatch):
    """`--out .` in a new, empty folder: the export fills that folder instead of renaming a new one
    over it (a shell in it was left in a deleted folder), and replacing the folder the command runs
    in is refused."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    inode = here.stat().st_ino
    result = invoke("export", "onnx", tiny_qwen, "--out", ".", "--precision", "fp32", "--no-verify")
    assert result.exit_code == 0, result.output
    assert (Path.cwd() / "genai_config.json").is_file() and here.stat().st_ino == inode   # the same folder
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert_one_line_error(invoke("export", "onnx", tiny_qwen, "--out", ".", "--precision", "fp32", "--no-verify"),
                          "is the folder this command runs in")
