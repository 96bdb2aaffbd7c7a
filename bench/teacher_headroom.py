"""How much a teacher could still give a student: on the test questions the student misses, how
many the teacher answers (greedy, the same questions), from bench/table1.py's per-question scores.

    python bench/teacher_headroom.py bench/results/factbook_table1_24l.json --teacher teacher \
        --student kd --student ppo_150steps --student dgpo_150steps

DGPO pulls a failed rollout toward the teacher's distribution. Where the teacher is wrong too, that
pull has nothing right to give, so the share of a student's misses the teacher gets right bounds what
the teacher term can add over PPO on those questions. A method with several seeds gives one line per
seed. Each line: the student's EM, its misses, the misses the teacher gets right (points of EM they
are worth), and the questions the student gets right that the teacher misses (where a pull toward the
teacher would be a pull away from the answer). JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from table1 import fail  # noqa: E402


def headroom(student: list[int], teacher: list[int]) -> dict:
    if len(student) != len(teacher) or not student:
        raise ValueError("the student and teacher must be scored on the same, non-empty question list")
    n = len(student)
    misses = [i for i in range(n) if not student[i]]
    teacher_right = sum(1 for i in misses if teacher[i])
    return {"n": n, "em": round(sum(student) / n, 4), "misses": len(misses), "teacher_right_on_misses": teacher_right,
            "teacher_right_share": round(teacher_right / len(misses), 4) if misses else None,
            "points": round(100 * teacher_right / n, 1),
            "right_where_teacher_wrong": sum(1 for i in range(n) if student[i] and not teacher[i])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("table", type=Path, help="bench/table1.py's JSON (rows with per-question scores)")
    p.add_argument("--teacher", required=True, help="the teacher's method name (seed 0)")
    p.add_argument("--student", action="append", required=True, help="a student's method name (every seed)")
    args = p.parse_args()
    try:
        rows = [r for r in json.loads(args.table.read_text(encoding="utf-8"))["rows"] if r["split"] == "test"]
    except (OSError, ValueError, KeyError) as e:
        fail(f"error: {args.table}: {e}")
    teacher = [r for r in rows if r["method"] == args.teacher and r.get("seed", 0) == 0]
    if not teacher:
        fail(f"error: {args.table}: no test row of teacher method {args.teacher!r}")
    for method in args.student:
        found = sorted((r for r in rows if r["method"] == method), key=lambda r: r.get("seed", 0))
        if not found:
            fail(f"error: {args.table}: no test row of method {method!r}")
        for r in found:
            print(json.dumps({"method": method, "seed": r.get("seed", 0), **headroom(r["scores"], teacher[0]["scores"])}))


if __name__ == "__main__":
    main()
