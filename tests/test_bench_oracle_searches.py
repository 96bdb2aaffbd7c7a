"""bench/oracle_searches.py: what an oracle's first searches are made of, per world folder and mixture world."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dgpo_edge.worlds import registry

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "bench" / "oracle_searches.py")


def test_titles_invent_words_the_asked_oracle_does_not(tmp_path):
    registry.build("club", tmp_path / "title", size=20)
    registry.build("club", tmp_path / "asked", size=20, oracle_search="asked")
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "title"), str(tmp_path / "asked")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    title, asked = (json.loads(line) for line in r.stdout.splitlines())
    train = sum(1 for _ in (tmp_path / "title" / "train.jsonl").open())
    assert (title["world"], title["oracle_search"], asked["oracle_search"]) == ("club", "default", "asked")
    assert title["train"] == asked["train"] == train and title["bm25_top3_hit_share"] == 1.0
    assert title["first_search_word_not_in_question_share"] > 0.2   # "Sholto Rudd" for "Sholto side"
    assert asked["first_search_word_not_in_question"] == 0 and asked["bm25_top3_hit_share"] >= 0.95


def test_a_folder_that_is_no_world_is_one_error_line(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == f"error: {tmp_path}: no corpus.jsonl (not a built world or mixture)"
