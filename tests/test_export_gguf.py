"""`dgpo-edge export gguf`: the project's GGUF writer, checked in real llama.cpp.

Models: tiny random Qwen2 with the real Qwen tokenizer (tied and untied; needs ../shared), a tiny
random Llama with SmolLM2's tokenizer (the q/k permutation), and SmolLM2-135M real weights
remapped to Qwen2 (F16 exact-greedy, Q8_0/Q4_0/Q4_K_M agreement); BF16 within its logit
tolerance on the tiny Qwen2.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, invoke

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp")

from dgpo_edge.export.gguf_verify import open_llama, verify_gguf  # noqa: E402
from dgpo_edge.errors import InputError  # noqa: E402
from dgpo_edge.export.gguf_vocab import build_vocab, detect_pre_tokenizer  # noqa: E402
from dgpo_edge.export.gguf_writer import write_gguf  # noqa: E402
from dgpo_edge.export.parity import PARITY_TEXTS, Reference  # noqa: E402
from dgpo_edge.train import models  # noqa: E402
from train_helpers import smol_tokenizer_dir, tiny_model_dir  # noqa: E402

PARITY_KEYS = {"format", "quant", "tokenizer_match", "max_abs_logit_diff", "top1_agreement",
               "n_tokens", "versions", "passed"}


@pytest.fixture(scope="module")
def tiny_qwen(qwen_dir, tmp_path_factory) -> dict[str, Path]:
    """Tied and untied 2-layer random Qwen2 checkpoints with the real Qwen vocabulary."""
    base = tmp_path_factory.mktemp("tiny-qwen")
    return {tied: models.random_qwen2(qwen_dir, base / tied, tied=tied == "tied", init_range=0.2)
            for tied in ("tied", "untied")}


@pytest.fixture(scope="module")
def smol_qwen_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M as Qwen2 (shared with test_models through the session's base temp dir)."""
    try:
        gguf_file = models.smollm2_gguf()
    except Exception as e:
        pytest.skip(str(e))
    out = tmp_path_factory.getbasetemp() / "smollm2-qwen2"
    if not (out / "config.json").is_file():
        models.from_gguf(gguf_file, out, as_arch="qwen2")
    return out


@pytest.fixture(scope="module")
def smol_reference(smol_qwen_dir) -> Reference:
    return Reference.load(smol_qwen_dir)


@pytest.mark.parametrize("tied", ["tied", "untied"])
def test_tiny_qwen_f16_round_trip(tiny_qwen, tmp_path, tied):
    out = tmp_path / "m.gguf"
    result = invoke("export", "gguf", tiny_qwen[tied], "--out", out, "--quant", "f16")
    assert result.exit_code == 0, result.output
    parity = json.loads((tmp_path / "m.gguf.parity.json").read_text())
    assert PARITY_KEYS <= set(parity)
    assert parity["format"] == "gguf" and parity["quant"] == "f16"
    assert parity["tokenizer_match"] is True, parity["tokenizer_mismatch"]
    assert parity["rel_logit_diff"] <= parity["logit_tolerance"]
    assert parity["greedy_match"] == parity["greedy_n"]
    assert parity["passed"] is True
    assert "tokenizer: identical on" in result.flat and "parity: passed" in result.flat
    from gguf import GGUFReader

    reader = GGUFReader(out)
    names = {t.name for t in reader.tensors}
    assert ("output.weight" in names) == (tied == "untied")
    assert "blk.0.attn_q.bias" in names
    assert reader.fields["tokenizer.ggml.pre"].contents() == "qwen2"
    assert "<|im_start|>" in reader.fields["tokenizer.chat_template"].contents()


def test_tiny_qwen_bf16_within_its_tolerance(tiny_qwen, tmp_path):
    out = tmp_path / "m-bf16.gguf"
    result = invoke("export", "gguf", tiny_qwen["untied"], "--out", out, "--quant", "bf16")
    assert result.exit_code == 0, result.output
    parity = json.loads((tmp_path / "m-bf16.gguf.parity.json").read_text())
    assert parity["quant"] == "bf16" and parity["tokenizer_match"] is True
    assert parity["logit_tolerance"] == 0.25
    assert parity["rel_logit_diff"] <= parity["logit_tolerance"] and parity["passed"] is True
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader

    types = {t.name: t.tensor_type for t in GGUFReader(out).tensors}
    assert types["blk.0.attn_q.weight"] == T.BF16 and types["output.weight"] == T.BF16
    assert types["blk.0.attn_norm.weight"] == T.F32 and types["blk.0.attn_q.bias"] == T.F32


def test_tiny_qwen_q8_0_agreement(tiny_qwen, tmp_path):
    out = tmp_path / "m-q8.gguf"
    write_gguf(tiny_qwen["untied"], out, "q8_0")
    parity = verify_gguf(tiny_qwen["untied"], out, "q8_0")
    # random weights give near-tied logits (std 1.6), so a lower floor than SmolLM2's 0.9 below
    assert parity["tokenizer_match"] and parity["top1_agreement"] >= 0.8, parity


def test_qwen_tokenizer_matches_llama_cpp_on_every_parity_text(tiny_qwen, tmp_path):
    out = tmp_path / "m.gguf"
    write_gguf(tiny_qwen["tied"], out, "q8_0")
    ref = Reference.load(tiny_qwen["tied"])
    vocab = open_llama(out, vocab_only=True)
    for text in PARITY_TEXTS:
        assert vocab.tokenize(text.encode(), add_bos=True, special=True) == ref.encode(text), text
    # ChatML specials are single control tokens, <think> a single user-defined token
    assert vocab.tokenize(b"<|im_start|><think>", add_bos=False, special=True) == [151644, 151667]


def test_llama_architecture_round_trip(smol_qwen_dir, tmp_path):
    """A random Llama (SmolLM2 tokenizer): llama.cpp needs q/k rows permuted; greedy must match."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    src = tmp_path / "llama"
    models.save_checkpoint(LlamaForCausalLM(config).eval(),
                           AutoTokenizer.from_pretrained(smol_qwen_dir), src)
    out = tmp_path / "llama.gguf"
    write_gguf(src, out, "f16")
    parity = verify_gguf(src, out, "f16")
    assert parity["tokenizer_match"], parity
    assert parity["rel_logit_diff"] <= parity["logit_tolerance"], parity
    assert parity["greedy_match"] == parity["greedy_n"], parity


@pytest.mark.slow
def test_smollm2_f16_is_exact_in_llama_cpp(smol_qwen_dir, smol_reference, tmp_path):
    out = tmp_path / "smol-f16.gguf"
    write_gguf(smol_qwen_dir, out, "f16")
    parity = verify_gguf(smol_qwen_dir, out, "f16", reference=smol_reference)
    assert parity["tokenizer_match"] is True, parity["tokenizer_mismatch"]
    assert parity["rel_logit_diff"] <= parity["logit_tolerance"], parity
    assert parity["top1_agreement"] >= 0.97, parity
    assert parity["greedy_match"] == parity["greedy_n"], parity  # F16 greedy generation identical
    from gguf import GGUFReader

    # transformers 5 loads a qwen2 checkpoint's tokenizer with Qwen2's own pipeline, whatever
    # tokenizer.json says; the writer matches what transformers runs (docs/export.md)
    assert GGUFReader(out).fields["tokenizer.ggml.pre"].contents() == "qwen2"


@pytest.mark.slow
@pytest.mark.parametrize("quant, floor", [("q8_0", 0.9), ("q4_0", 0.6), ("q4_k_m", 0.6)])
def test_smollm2_quantized_agreement(smol_qwen_dir, smol_reference, tmp_path, quant, floor):
    out = tmp_path / f"smol-{quant}.gguf"
    write_gguf(smol_qwen_dir, out, quant)
    parity = verify_gguf(smol_qwen_dir, out, quant, reference=smol_reference)
    assert parity["tokenizer_match"] is True
    assert parity["top1_agreement"] >= floor, parity
    assert parity["n_tokens"] > 100
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp files gone


def test_pre_tokenizer_detection(qwen_dir, smol_qwen_dir):
    qwen = json.loads((qwen_dir / "tokenizer.json").read_text())
    smol = json.loads((smol_qwen_dir / "tokenizer.json").read_text())
    assert detect_pre_tokenizer(qwen) == "qwen2"
    assert detect_pre_tokenizer(smol) == "smollm"
    assert detect_pre_tokenizer({"pre_tokenizer": {"type": "ByteLevel"}}) == "gpt-2"


# ------------------------------------------------ the byte-fallback form (transformers 5.17)

# The decoder `model from-gguf` writes under transformers 5.17: SentencePiece-style steps in
# front of the ByteLevel one, over an unchanged ByteLevel pre-tokenizer.
FALLBACK_DECODER = {"type": "Sequence", "decoders": [
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
MORE_TEXTS = ("Tanzania internet country code", "Nayramadlin and Pyongyang", "\x00\x1f\x7f control bytes",
              "\u2581 a lower one eighth block", "<0x41> not a byte token", "tab\tend\r\n")


def byte_fallback_form(tokenizer: dict, lone_byte_level: bool) -> dict:
    """`tokenizer` (a byte-level BPE tokenizer.json) rewritten into the 5.17 form.

    `lone_byte_level`: the pre-tokenizer becomes a single ByteLevel (SmolLM2's digit
    splitting dropped), else SmolLM2's Digits + ByteLevel stays.
    """
    out = {**tokenizer, "model": {**tokenizer["model"], "byte_fallback": True}, "decoder": FALLBACK_DECODER}
    if lone_byte_level:
        out["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                "use_regex": True}
    return out


@pytest.mark.parametrize("lone_byte_level", [False, True], ids=["smollm-pre", "bytelevel-pre"])
def test_byte_fallback_form_exports_and_tokenizes_identically(tmp_path, tmp_path_factory, lone_byte_level):
    """The form is still byte-level BPE: export succeeds and llama.cpp encodes as it does."""
    from tokenizers import Tokenizer

    src = tiny_model_dir(smol_tokenizer_dir(tmp_path_factory), tmp_path / "ckpt")
    path = src / "tokenizer.json"
    original = Tokenizer.from_file(str(path))
    path.write_text(json.dumps(byte_fallback_form(json.loads(path.read_text()), lone_byte_level)))
    rewritten = Tokenizer.from_file(str(path))
    assert rewritten.model.byte_fallback is True
    out = tmp_path / "m.gguf"
    result = invoke("export", "gguf", src, "--out", out, "--quant", "f16")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "m.gguf.parity.json").read_text())["tokenizer_match"] is True
    from gguf import GGUFReader

    assert GGUFReader(out).fields["tokenizer.ggml.pre"].contents() == ("gpt-2" if lone_byte_level else "smollm")
    vocab = open_llama(out, vocab_only=True)
    for text in PARITY_TEXTS + MORE_TEXTS:
        want = rewritten.encode(text, add_special_tokens=False).ids
        assert vocab.tokenize(text.encode(), add_bos=False, special=True) == want, text
        if not lone_byte_level:  # only the fallback and the decoder changed: the original's ids
            assert want == original.encode(text, add_special_tokens=False).ids, text
        assert rewritten.decode(want, skip_special_tokens=False) == original.decode(want, skip_special_tokens=False)


def _toy_tokenizer(pre: dict, vocab: dict[str, int], decoder: dict) -> dict:
    model = {"type": "BPE", "byte_fallback": True, "vocab": vocab, "merges": []}
    return {"model": model, "pre_tokenizer": pre, "decoder": decoder, "added_tokens": []}


def test_byte_fallback_is_refused_where_it_could_fire():
    """A byte-fallback BPE that is not byte-level (SentencePiece) or lacks byte pieces is still refused."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = {c: i for i, c in enumerate(sorted(ByteLevel.alphabet()))}
    level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    assert build_vocab(_toy_tokenizer(level, alphabet, FALLBACK_DECODER), {}, {}).pre == "gpt-2"
    # a symbol missing is harmless (SmolLM2 lacks some) until a byte token could stand in for it
    no_a = {c: i for c, i in alphabet.items() if c != "A"}
    assert build_vocab(_toy_tokenizer(level, no_a, FALLBACK_DECODER), {}, {}).pre == "gpt-2"
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"}
    spm_decoder = {"type": "Sequence", "decoders": FALLBACK_DECODER["decoders"][:3]}
    for pre, vocab, decoder in [(level, {**no_a, "<0x41>": 999}, FALLBACK_DECODER),
                                (level, alphabet, spm_decoder),
                                (metaspace, alphabet, spm_decoder)]:
        with pytest.raises(InputError, match="is not byte-level BPE"):
            build_vocab(_toy_tokenizer(pre, vocab, decoder), {}, {})


# ------------------------------------------------------------------ bad input

def copy_config_only(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


def test_unsupported_architecture(smol_qwen_dir, tmp_path):
    ckpt = copy_config_only(smol_qwen_dir, tmp_path / "gpt2")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    result = invoke("export", "gguf", ckpt, "--out", tmp_path / "m.gguf")
    assert_one_line_error(result, "config.json", "unsupported architecture 'gpt2'")
    assert not (tmp_path / "m.gguf").exists()


def test_missing_tokenizer(smol_qwen_dir, tmp_path):
    ckpt = copy_config_only(smol_qwen_dir, tmp_path / "notok")
    (ckpt / "tokenizer.json").unlink()
    result = invoke("export", "gguf", ckpt, "--out", tmp_path / "m.gguf")
    assert_one_line_error(result, "tokenizer.json", "missing tokenizer")


def test_truncated_weights(smol_qwen_dir, tmp_path):
    ckpt = copy_config_only(smol_qwen_dir, tmp_path / "cut")
    with open(smol_qwen_dir / "model.safetensors", "rb") as f:
        (ckpt / "model.safetensors").write_bytes(f.read(3_000_000))
    result = invoke("export", "gguf", ckpt, "--out", tmp_path / "m.gguf", "--quant", "q4_k_m")
    assert_one_line_error(result, "model.safetensors", "truncated")
    assert list(tmp_path.iterdir()) == [ckpt]  # nothing half-written


@pytest.mark.parametrize("args, needle", [
    (["--quant", "q3_xyz"], "unknown --quant 'q3_xyz'"),
])
def test_bad_options(smol_qwen_dir, tmp_path, args, needle):
    assert_one_line_error(invoke("export", "gguf", smol_qwen_dir, "--out", tmp_path / "m.gguf",
                                 *args), needle)


def test_out_is_a_new_file_or_an_earlier_gguf(tiny_qwen, tmp_path):
    """A folder, or someone's file of anything else, is refused before any writing; a GGUF is replaced."""
    assert_one_line_error(invoke("export", "gguf", tiny_qwen["tied"], "--out", tmp_path, "--quant", "f16"),
                          str(tmp_path), "is a folder")
    notes = tmp_path / "notes.md"
    notes.write_text("mine\n")
    assert_one_line_error(invoke("export", "gguf", tiny_qwen["tied"], "--out", notes, "--quant", "f16"),
                          "notes.md", "not a GGUF")
    assert notes.read_text() == "mine\n"
    out = tmp_path / "m.gguf"
    for _ in range(2):   # the second run replaces the first one's GGUF
        result = invoke("export", "gguf", tiny_qwen["tied"], "--out", out, "--quant", "f16", "--no-verify")
        assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"GGUF"


def test_a_gguf_inside_a_bundle_is_not_replaced(tiny_qwen, tmp_path):
    """`--out BUNDLE/model/x.gguf` replaced the bundle's own GGUF (it is a GGUF, so replaceable),
    and the bundle's manifest then listed a size and sha256 the file no longer had."""
    bundle = tmp_path / "B"
    (bundle / "model").mkdir(parents=True)
    (bundle / "manifest.json").write_text(json.dumps({"format": "dgpo-edge-bundle"}))
    own = bundle / "model" / "student.gguf"
    own.write_bytes(b"GGUF" + bytes(60))
    for out in (own, bundle / "model" / "other.gguf", bundle / "x.gguf"):
        result = invoke("export", "gguf", tiny_qwen["tied"], "--out", out, "--quant", "f16", "--no-verify")
        assert_one_line_error(result, str(out), f"is inside the bundle {bundle.resolve()}")
    assert own.read_bytes() == b"GGUF" + bytes(60)
    assert sorted(p.name for p in bundle.rglob("*")) == ["manifest.json", "model", "student.gguf"]
    with pytest.raises(InputError, match="is inside the bundle"):
        write_gguf(tiny_qwen["tied"], own, quant="f16")


def test_missing_model_dir(tmp_path):
    result = invoke("export", "gguf", tmp_path / "nope", "--out", tmp_path / "m.gguf")
    assert_one_line_error(result, "nope", "no such directory")


def test_no_verify_drops_a_stale_parity_file(tiny_qwen, tmp_path):
    out = tmp_path / "m.gguf"
    stale = tmp_path / "m.gguf.parity.json"
    stale.write_text('{"passed": true}')
    result = invoke("export", "gguf", tiny_qwen["tied"], "--out", out, "--quant", "q4_0",
                    "--no-verify")
    assert result.exit_code == 0, result.output
    assert out.is_file() and not stale.exists()


def test_an_interrupted_check_leaves_no_stale_parity_file(tiny_qwen, tmp_path, monkeypatch):
    """The old FILE.gguf.parity.json stayed beside the new GGUF when the check died (Ctrl-C), and
    `export bundle` then copied its verdict into the manifest as the new file's."""
    import dgpo_edge.export.gguf_verify as gguf_verify

    out = tmp_path / "m.gguf"
    stale = tmp_path / "m.gguf.parity.json"
    stale.write_text('{"passed": true, "quant": "f16"}')

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_verify, "verify_gguf", interrupted)
    result = invoke("export", "gguf", tiny_qwen["tied"], "--out", out, "--quant", "q4_0")
    assert isinstance(result.exception, KeyboardInterrupt) or result.exit_code != 0, result.output
    assert out.is_file() and not stale.exists()


def test_a_pre_tokenizer_llama_cpp_does_not_know_is_refused_even_without_verify(tiny_qwen, tmp_path, monkeypatch):
    """--pre bogus --no-verify wrote a file llama.cpp then refused to load; now the vocabulary is
    loaded (from the metadata alone) before the model is written, and nothing is left behind."""
    out = tmp_path / "m.gguf"
    for quant in ("f16", "q4_k_m"):   # written directly, and quantized by llama.cpp from an F16 file
        result = invoke("export", "gguf", tiny_qwen["tied"], "--out", out, "--quant", quant, "--pre", "bogus",
                        "--no-verify")
        assert_one_line_error(result, "--pre 'bogus'", "could not load the vocabulary")
        assert list(tmp_path.iterdir()) == []
    result = invoke("export", "gguf", tiny_qwen["tied"], "--out", out, "--quant", "f16", "--pre", "qwen2", "--no-verify")
    assert result.exit_code == 0, result.output
    # the check comes before the minutes of writing tensors
    from dgpo_edge.export import gguf_writer

    with monkeypatch.context() as m:
        m.setattr(gguf_writer, "_add_tensors", lambda *a: pytest.fail("tensors written before --pre was checked"))
        with pytest.raises(InputError, match="could not load the vocabulary"):
            write_gguf(tiny_qwen["tied"], tmp_path / "n.gguf", quant="q8_0", pre="bogus")
    # without llama.cpp to ask, only the names this writer detects itself are taken
    import builtins

    real_import = builtins.__import__

    def no_llama_cpp(name, *args, **kwargs):
        if name == "llama_cpp":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_llama_cpp)
    with pytest.raises(InputError, match="cannot be checked without llama-cpp-python"):
        write_gguf(tiny_qwen["tied"], tmp_path / "n.gguf", quant="f16", pre="deepseek-llm")
    assert write_gguf(tiny_qwen["tied"], tmp_path / "n.gguf", quant="f16", pre="qwen2").is_file()


@pytest.mark.parametrize("command", [
    ["export", "gguf", "MODEL", "--out", "afile.txt/m.gguf", "--quant", "f16", "--no-verify"],
    ["model", "prune", "MODEL", "--keep-layers", "1", "--out", "afile.txt/sub"],
    ["data", "build", "notes", "--size", "8", "--samples", "0", "--out", "afile.txt/sub"],
    ["data", "mix", "--world", "notes=1", "--worlds-dir", "afile.txt", "--out", "mix"],
])
def test_an_out_under_a_file_is_one_error_line_before_any_work(tiny_qwen, tmp_path, monkeypatch, command):
    """`--out notes.txt/run` (a file where a folder must be made) ended in a FileExistsError traceback,
    after the work (a model loaded and pruned, tensors written); now one line names the file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("mine\n")
    result = invoke(*[str(tiny_qwen["tied"]) if a == "MODEL" else a for a in command])
    assert_one_line_error(result, "afile.txt: is not a folder, so the output path", "cannot be made in it")
    assert (tmp_path / "afile.txt").read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt"]


@pytest.mark.parametrize("rope", [
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": {"type": "linear", "factor": 2.0}},
])
def test_rope_scaling_is_refused_wherever_the_config_keeps_it(tiny_qwen, tmp_path, rope):
    """A default rope_parameters beside a linear rope_scaling got past the check: transformers scales,
    the GGUF would not."""
    import shutil

    ckpt = shutil.copytree(tiny_qwen["tied"], tmp_path / "m")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, **rope}))
    result = invoke("export", "gguf", ckpt, "--out", tmp_path / "m.gguf", "--quant", "f16", "--no-verify")
    assert_one_line_error(result, "rope scaling 'linear' (rope_scaling) is not supported")
    assert not (tmp_path / "m.gguf").exists()


def test_the_parity_line_keeps_a_tiny_diff_and_says_what_the_tokenizer_check_knows():
    """An F16 export's max |diff| of 4e-7 was rounded to 0 beside its nonzero ratio to the std, and
    "DIFFERENT on 11 texts" read as if every text differed, where only the first mismatch is known."""
    import numpy as np

    from dgpo_edge.export.parity import compare_logits, format_parity

    ref = np.array([[0.0, 0.1], [0.2, 0.0]], np.float32)
    numbers = compare_logits(ref, ref + np.float32(4e-7))
    assert numbers["max_abs_logit_diff"] > 0 and numbers["rel_logit_diff"] > numbers["max_abs_logit_diff"]
    text = format_parity({**numbers, "tokenizer_match": False, "n_texts": 11, "tokenizer_mismatch": "café",
                          "top1_agreement": 1.0, "passed": False})
    assert "tokenizer: DIFFERENT (of 11 texts, the first that differs: 'café')" in text
    assert f"max |diff| {numbers['max_abs_logit_diff']:.4g} = " in text and "max |diff| 0 =" not in text
