"""bench/search_habits.py: outcomes, repeated searches and a search prefix's share, from eval predictions."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rec(em, answered, hit, queries):
    return {"em": em, "answered": answered, "hit": hit, "searches": len(queries), "search_queries": queries}


def test_habits_of_a_gzipped_predictions_file(tmp_path):
    rows = [_rec(1.0, 1.0, 1.0, ["Tanzen Joinery"]),
            _rec(0.0, 0.0, 1.0, ["Project Tanzen", "Tanzen buyer", "Tanzen buyer"]),   # repeats, no answer
            _rec(0.0, 1.0, 0.0, ["project halelny"]),                                  # lower case counts
            _rec(0.0, 1.0, 1.0, ["Projection of Mars"]),                               # a word, not a prefix
            _rec(1.0, 1.0, 1.0, ["Project"])]                                          # the word alone
    path = tmp_path / "p.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "search_habits.py"), str(path), "--prefix", "Project"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["outcomes"] == {"right": 2, "no_answer": 1, "no_search": 0, "not_found": 1, "misread": 1}
    assert (got["repeated_a_search"], got["repeated_and_no_answer"]) == (1, 1)
    assert got["prefix"] == {"word": "Project", "questions": 3, "em": 0.3333, "em_of_the_rest": 0.5}


def test_a_missing_or_damaged_file_is_one_error_line(tmp_path):
    script = str(ROOT / "bench" / "search_habits.py")
    r = subprocess.run([sys.executable, script, str(tmp_path / "nope.jsonl")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == f"error: no such predictions file: {tmp_path / 'nope.jsonl'}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"em": 1}\n{oops\n')
    r = subprocess.run([sys.executable, script, str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "bad.jsonl" in r.stderr
