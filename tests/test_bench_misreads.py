"""bench/misreads.py: where a misread's wrong answer stands among the passages the student was shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cli_helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
RECORDS = [
    ("0", '"Tanzen Joinery"\nTanzen Joinery is a workshop. master - Piet Veny; workshop town - Belquin; main buyer - Elnyri Stationers;'),
    ("1", '"Elnyri Stationers"\nElnyri Stationers is a shop. proprietor - Ewan Fenost; shop town - Kaastdunhaven;'),
    ("2", '"Osthal Forge"\nOsthal Forge is a workshop. master - Hector Nysolhal; workshop town - Dravasost;'),
]


def _misread(qid, question, gold, prediction, queries):
    return {"id": qid, "question": question, "golden_answers": [gold], "prediction": prediction, "em": 0.0,
            "answered": 1.0, "searches": len(queries), "hit": 1.0, "search_queries": queries}


def test_each_kind_of_misread_is_told_apart(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in RECORDS))
    assert invoke("index", "build", corpus, "--kind", "bm25", "--out", tmp_path / "index").exit_code == 0
    questions = [{"id": "q1", "question": "master of Tanzen Joinery", "type": "fact", "evidence": ["0"]},
                 {"id": "q2", "question": "workshop town of Tanzen Joinery", "type": "fact", "evidence": ["0"]},
                 {"id": "q3", "question": "proprietor of the main buyer of Tanzen Joinery", "type": "bridge",
                  "evidence": ["0", "1"]},
                 {"id": "q4", "question": "master of Osthal Forge", "type": "fact", "evidence": ["2"]},
                 {"id": "q5", "question": "master of Tanzen Joinery", "type": "fact", "evidence": ["0"]},
                 {"id": "q6", "question": "town of Elnyri Stationers", "type": "fact", "evidence": ["1"]}]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    rows = [_misread("q1", "master of Tanzen Joinery", "Piet Veny", "Tanzen Joinery", ["Tanzen Joinery master"]),
            _misread("q2", "workshop town of Tanzen Joinery", "Belquin", "workshop", ["Tanzen Joinery town"]),
            _misread("q3", "proprietor of ...", "Ewan Fenost", "Kaastdunhaven", ["Tanzen Joinery", "Elnyri Stationers"]),
            _misread("q4", "master of Osthal Forge", "Hector Nysolhal", "Piet Veny", ["workshop master Osthal Tanzen"]),
            _misread("q5", "master of Tanzen Joinery", "Piet Veny", "Ulrich Bello", ["Tanzen Joinery master"]),
            # the run saw the answer, but this index's passages for its search do not hold it
            _misread("q6", "town of Elnyri Stationers", "Kaastdunhaven", "Belquin", ["Tanzen Joinery Belquin"]),
            {**_misread("q1", "master of Tanzen Joinery", "Piet Veny", "Piet Veny", ["Tanzen"]), "em": 1.0}]
    preds = tmp_path / "predictions.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "misreads.py"), str(preds), "--data",
                        str(tmp_path / "test.jsonl"), "--index", str(tmp_path / "index")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["misread"], got["not_found_again"]) == (6, 1)   # the right answer is no misread
    assert got["where"]["all"] == {"name_or_kind": 2, "another_field": 1, "other_passage": 1, "nowhere": 1}
    assert got["where"]["fact"] == {"name_or_kind": 2, "another_field": 0, "other_passage": 1, "nowhere": 1}
    assert got["where"]["bridge"]["another_field"] == 1   # the bridge record's own field, not the one asked
    assert [e["prediction"] for e in got["examples"]["name_or_kind"]] == ["Tanzen Joinery", "workshop"]


def test_a_missing_index_is_one_error_line(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"id": "q1", "question": "x", "golden_answers": ["y"]}\n')
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "misreads.py"), str(tmp_path / "p.jsonl"), "--data",
                        str(tmp_path / "test.jsonl"), "--index", str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "nope" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_gpu_lanes_rows_are_read_by_method(tmp_path):
    """bench/factbook_eval.py rows keep each question's answer, searches and outcome in file order."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "contents": c}) + "\n" for i, c in RECORDS))
    assert invoke("index", "build", corpus, "--kind", "bm25", "--out", tmp_path / "index").exit_code == 0
    questions = [{"id": "q1", "question": "master of Tanzen Joinery", "golden_answers": ["Piet Veny"], "type": "fact",
                  "evidence": ["0"]},
                 {"id": "q2", "question": "master of Osthal Forge", "golden_answers": ["Hector Nysolhal"], "type": "fact",
                  "evidence": ["2"]}]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    row = {"method": "kd@records-out", "split": "test", "n": 2, "scores": [0, 1], "outcomes": ["misread", "right"],
           "answers": ["workshop", "Hector Nysolhal"], "search_queries": [["Tanzen Joinery"], ["Osthal Forge"]]}
    rows = tmp_path / "records.jsonl"
    rows.write_text(json.dumps({**row, "method": "teacher@records-out"}) + "\n" + json.dumps(row) + "\n")
    script = [sys.executable, str(ROOT / "bench" / "misreads.py"), str(rows), "--data", str(tmp_path / "test.jsonl"),
              "--index", str(tmp_path / "index"), "--method"]
    r = subprocess.run([*script, "kd@records-out"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["where"]["fact"] == {"name_or_kind": 1, "another_field": 0, "other_passage": 0,
                                                     "nowhere": 0}
    r = subprocess.run([*script, "dgpo@records-out"], capture_output=True, text=True)
    assert r.returncode == 2 and "no test row of method 'dgpo@records-out'" in r.stderr
    rows.write_text(json.dumps({k: v for k, v in row.items() if k != "answers"}) + "\n")
    r = subprocess.run([*script, "kd@records-out"], capture_output=True, text=True)
    assert r.returncode == 2 and "keeps no answers" in r.stderr
