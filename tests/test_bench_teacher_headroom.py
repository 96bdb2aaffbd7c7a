"""bench/teacher_headroom.py: the misses of a student its teacher answers, from per-question scores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from teacher_headroom import headroom  # noqa: E402


def test_headroom_by_hand():
    teacher = [1, 1, 0, 0, 1]
    student = [0, 1, 1, 0, 0]   # misses 0, 3, 4: the teacher is right on 0 and 4; right on 2 where it is not
    assert headroom(student, teacher) == {"n": 5, "em": 0.4, "misses": 3, "teacher_right_on_misses": 2,
                                          "teacher_right_share": 0.6667, "points": 40.0, "right_where_teacher_wrong": 1}
    with pytest.raises(ValueError):
        headroom([1], [1, 0])


def test_one_line_per_seed_and_clear_errors(tmp_path):
    rows = [{"method": "teacher", "seed": 0, "split": "test", "scores": [1, 1, 0, 0]},
            {"method": "ppo", "seed": 1, "split": "test", "scores": [0, 1, 1, 0]},
            {"method": "ppo", "seed": 0, "split": "test", "scores": [0, 0, 0, 0]},
            {"method": "ppo", "seed": 0, "split": "dev", "scores": [1, 1, 1, 1]}]
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"card": "x", "commit": "y", "rows": rows}))
    script = [sys.executable, str(ROOT / "bench" / "teacher_headroom.py"), str(table), "--teacher", "teacher"]
    r = subprocess.run([*script, "--student", "ppo"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["seed"], x["misses"], x["teacher_right_on_misses"]) for x in lines] == [(0, 4, 2), (1, 2, 1)]
    r = subprocess.run([*script, "--student", "dgpo"], capture_output=True, text=True)
    assert r.returncode == 2 and "no test row of method 'dgpo'" in r.stderr
