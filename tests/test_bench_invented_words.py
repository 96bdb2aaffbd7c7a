"""bench/invented_words.py: words of a search in neither the question nor the searched corpus."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "bench" / "invented_words.py")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True)


def test_made_up_words_and_where_they_came_from(tmp_path):
    corpus = _jsonl(tmp_path / "notes.jsonl", [{"id": "0", "contents": '"Lucas Brandt"\nLucas is on the [[Quartz team]].'}])
    club = _jsonl(tmp_path / "club.jsonl", [{"id": "0", "title": "Sholto Napier", "text": "Rows stroke side."}])
    preds = _jsonl(tmp_path / "p.jsonl", [
        {"question": "what team does lucas belong to", "search_queries": ["Lucas Napier"], "em": 0.0},   # club's surname
        {"question": "Lucas team", "search_queries": ["Lucas Brandt", "Quartz team"], "em": 1.0},      # read, not made up
        {"question": "who leads quartz", "search_queries": ["Quartz leader city"], "em": 1.0},         # made up, from nowhere
    ])
    r = _run(preds, "--corpus", corpus, "--other", f"club={club}")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["questions"], got["searches"], got["with_made_up_word"]) == (3, 4, 2)
    assert got["with_a_word_from"] == {"club": 1}
    assert (got["questions_with_made_up"], got["em_with_made_up"], got["em_without"]) == (2, 0.5, 1.0)
    assert dict(got["top_made_up"]) == {"napier": 1, "leader": 1, "city": 1}


def test_a_lane_row_read_with_its_questions(tmp_path):
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "0", "contents": "Ada Lovelace wrote notes."}])
    data = _jsonl(tmp_path / "test.jsonl", [{"id": "q1", "question": "who wrote notes", "golden_answers": ["Ada"]}])
    row = {"method": "kd@mix", "split": "test", "n": 1, "answers": ["Ada"], "search_queries": [["notes Babbage"]],
           "outcomes": ["right"]}
    rows = _jsonl(tmp_path / "rows.jsonl", [row])
    r = _run(rows, "--method", "kd@mix", "--data", data, "--corpus", corpus)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["with_made_up_word"], got["em_with_made_up"], got["top_made_up"]) == (1, 1.0, [["babbage", 1]])


def test_bad_input_is_one_error_line(tmp_path):
    corpus = _jsonl(tmp_path / "c.jsonl", [{"id": "0", "contents": "x"}])
    r = _run(tmp_path / "nope.jsonl", "--corpus", corpus)
    assert r.returncode == 2 and r.stderr.strip() == f"error: no such predictions file: {tmp_path / 'nope.jsonl'}"
    r = _run(tmp_path / "nope.jsonl", "--corpus", corpus, "--other", "club")
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --other 'club'")
    r = _run(tmp_path / "nope.jsonl", "--corpus", corpus, "--method", "kd@mix")
    assert r.returncode == 2 and "--method needs --data" in r.stderr
