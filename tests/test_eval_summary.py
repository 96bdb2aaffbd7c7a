"""bench/eval_summary.py: one results row from an eval folder, by type and hops, paired with an earlier row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    questions = [{"id": f"q{i}", "type": t, "hops": h} for i, (t, h) in
                 enumerate([("fact", 1), ("fact", 1), ("bridge", 2), ("comparison", 2)])]
    data = _write(tmp_path / "test.jsonl", questions)
    (tmp_path / "ev").mkdir()
    em = [1.0, 0.0, 1.0, 0.0]
    _write(tmp_path / "ev" / "predictions.jsonl",
           [{"id": q["id"], "em": e, "f1": e, "hit": 1.0, "searches": 1 + i, "answered": 1.0, "seconds": 2.0 * (i + 1)}
            for i, (q, e) in enumerate(zip(questions, em))])
    return data, tmp_path / "ev"


def run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    data, ev = _setup(tmp_path)
    return subprocess.run([sys.executable, str(ROOT / "bench" / "eval_summary.py"), str(ev), "--data", str(data),
                           "--questions", "toy", "--command", "dgpo-edge eval ...", "--student", "s", "--card", "c",
                           "--out", str(tmp_path / "out.json"), *extra], capture_output=True, text=True, cwd=ROOT)


def test_a_row_by_type_and_hops_paired_with_an_earlier_one(tmp_path):
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"student": "kd", "rows": [{"ids": ["q0", "q1", "q2", "q3"],
                                                              "em_per_question": [0.0, 0.0, 1.0, 0.0]}]}))
    r = run(tmp_path, "--against", str(earlier), "--commit", "abc1234")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "out.json").read_text())["commit"] == "abc1234"
    (row,) = json.loads((tmp_path / "out.json").read_text())["rows"]
    assert (row["n"], row["em"], row["searches"], row["seconds_p50"]) == (4, 0.5, 2.5, 5.0)
    assert row["em_by_type"] == {"bridge": 1.0, "comparison": 0.0, "fact": 0.5}
    assert row["em_by_hops"] == {"1": 0.5, "2": 0.5} and row["n_by_type"]["fact"] == 2
    assert row["paired"]["n"] == 4 and row["paired"]["diff"] == 0.25   # one question more right
    # the two wrong answers had found a passage with the answer: misread, not a retrieval miss
    assert row["outcome_per_question"] == ["right", "misread", "right", "misread"]
    assert row["outcomes_by_type"]["fact"] == {"right": 1, "no_answer": 0, "no_search": 0, "not_found": 0,
                                               "misread": 1}


def test_a_prediction_that_is_not_a_question_is_refused(tmp_path):
    data, _ = _setup(tmp_path)
    data.write_text(data.read_text().splitlines()[0] + "\n")   # only q0 left
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "eval_summary.py"), str(tmp_path / "ev"), "--data",
                        str(data), "--questions", "t", "--command", "c", "--student", "s", "--card", "c",
                        "--out", str(tmp_path / "out.json")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "3 predictions are not questions of --data (first: q1)" in r.stderr
    assert not (tmp_path / "out.json").exists()
