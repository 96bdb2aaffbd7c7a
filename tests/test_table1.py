"""bench/table1.py: rows named by method and seed, paired bootstrap intervals, the markdown table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import table1  # noqa: E402


def row(method, split, scores, **extra):
    n = len(scores)
    return {"method": method, "split": split, "n": n, "em": sum(scores) / n, "scores": scores,
            "em_by_type": {"fact": sum(scores) / n}, "em_by_hops": {"1": sum(scores) / n},
            "hit_ratio": 0.5, "search_steps": 1.5, "params": 81_413_568, "card": "H100", "commit": "abc", **extra}


def test_paired_bootstrap_of_known_differences():
    assert table1.paired_bootstrap([1, 0, 1, 0], [1, 0, 1, 0]) == {"diff": 0.0, "lo": 0.0, "hi": 0.0}
    assert table1.paired_bootstrap([1] * 5, [0] * 5) == {"diff": 1.0, "lo": 1.0, "hi": 1.0}
    b = table1.paired_bootstrap([1] * 50 + [0] * 50, [0] * 100, n_boot=2000)
    assert b["diff"] == 0.5 and 0.38 < b["lo"] < 0.5 < b["hi"] < 0.62   # about ±1.96 · 0.05
    assert table1.paired_bootstrap([1, 0] * 20, [0, 1] * 20, n_boot=500, seed=3) == \
        table1.paired_bootstrap([1, 0] * 20, [0, 1] * 20, n_boot=500, seed=3)   # seeded
    with pytest.raises(ValueError, match="same, non-empty"):
        table1.paired_bootstrap([1, 0], [1])


def test_rl_step_names_report_rows_and_seeds_average_per_question(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in [
        row("rl150-dgpo-s0", "test", [1, 1, 0, 0], rl_steps=150),
        row("rl150-dgpo-s1", "test", [1, 0, 1, 0], rl_steps=150),
        row("rl100-dgpo-s0", "test", [0, 0, 0, 0], rl_steps=100),   # another step: left out
        row("rl150-dgpo-b01-s0", "test", [1, 1, 1, 1], rl_steps=150),
        row("rl150-ppo-s0", "test", [0, 1, 0, 0], rl_steps=150),
        row("kd-start", "test", [0, 0, 0, 1]),
        row("kd-start", "dev", [1, 0]),
        row("unnamed", "test", [1, 1, 1, 1]),
    ]))
    loaded = table1.load_rows([str(rows)], {"kd-start": ("kd", 0)}, rl_step=150)
    assert sorted((r["method"], r["seed"], r["split"]) for r in loaded) == [
        ("dgpo", 0, "test"), ("dgpo", 1, "test"), ("dgpo-b01", 0, "test"), ("kd", 0, "dev"), ("kd", 0, "test"),
        ("ppo", 0, "test")]
    assert table1.per_question(loaded, "dgpo") == [1.0, 0.5, 0.5, 0.0]
    assert table1.per_question(loaded, "dgpo", seed=1) == [1, 0, 1, 0]

    out = tmp_path / "table1.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "table1.py"), str(rows), "--rl-step", "150",
                        "--as", "kd-start=kd", "--as", "rl150-dgpo-b01-s0=dgpo@2", "--pair", "dgpo:ppo",
                        "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert (doc["card"], doc["commit"]) == ("H100", "abc")
    dgpo = sorted(x["seed"] for x in doc["rows"] if x["method"] == "dgpo")
    assert dgpo == [0, 1, 2]   # --as wins over --rl-step for the row both name
    (pair,) = doc["pairs"]
    # per question, DGPO's three seeds average to [1, 2/3, 2/3, 1/3] against PPO's [0, 1, 0, 0]
    assert (pair["a"], pair["b"]) == ("dgpo", "ppo") and pair["diff"] == pytest.approx(5 / 12)
    line = next(x for x in r.stdout.splitlines() if x.startswith("| dgpo |"))
    assert "| 3 | 150/150/150 | 81.4M | – | 0.667 ± 0.289 |" in line   # EM 0.5, 0.5, 1.0; no dev rows
    assert "dgpo - ppo on test: +0.417" in r.stdout


def test_a_labelled_file_joins_only_by_name(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(row("rl150-dgpo-s0", "test", [1, 0], rl_steps=150)) + "\n")
    b.write_text(json.dumps(row("rl150-dgpo-s0", "test", [0, 0], rl_steps=150)) + "\n"
                 + json.dumps(row("rl200-dgpo-s0", "test", [1, 1], rl_steps=200)) + "\n")
    loaded = table1.load_rows([str(a), f"lease2={b}"], {"lease2/rl200-dgpo-s0": ("dgpo_200", 0)}, rl_step=150)
    # the labelled file's step-150 row is not taken for dgpo seed 0, which the other file holds
    assert sorted((r["method"], r["run"], r["em"]) for r in loaded) == [
        ("dgpo", "rl150-dgpo-s0", 0.5), ("dgpo_200", "lease2/rl200-dgpo-s0", 1.0)]


def test_a_plain_path_may_hold_an_equals_sign(tmp_path):
    odd = tmp_path / "lr=1e-4.jsonl"
    odd.write_text(json.dumps(row("rl150-dgpo-s0", "test", [1, 0], rl_steps=150)) + "\n")
    (loaded,) = table1.load_rows([str(odd)], {}, rl_step=150)
    assert (loaded["method"], loaded["run"]) == ("dgpo", "rl150-dgpo-s0")
    with pytest.raises(SystemExit) as stop:
        table1.load_rows([str(tmp_path / "missing=x.jsonl")], {}, rl_step=150)
    assert stop.value.code == 2


def test_a_name_or_pair_without_rows_is_refused(tmp_path):
    # a misspelt --as would drop its row silently, a --pair with no rows has nothing to compare
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row("rl150-dgpo-s0", "test", [1, 0], rl_steps=150)) + "\n")
    out = tmp_path / "t.json"

    def table(*args):
        return subprocess.run([sys.executable, str(ROOT / "bench" / "table1.py"), str(rows), "--out", str(out), *args],
                              capture_output=True, text=True, cwd=ROOT)
    r = table("--as", "rl150-dgpo-s0=dgpo", "--as", "rl150-dgpo-s9=dgpo@9")
    assert r.returncode == 2 and "--as names no row in the rows files: rl150-dgpo-s9" in r.stderr
    r = table("--as", "rl150-dgpo-s0=dgpo", "--pair", "dgpo:ppo")
    assert r.returncode == 2 and "--pair: no test rows for method 'ppo'" in r.stderr
    r = table("--as", "rl150-dgpo-s0=dgpo", "--pair", "dgpo")
    assert r.returncode == 2 and "--pair dgpo: give two methods, A:B" in r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "table1.py"), str(tmp_path / "gone.jsonl"),
                        f"lab={tmp_path / 'gone.jsonl'}", "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "gone.jsonl" in r.stderr
    assert not out.exists()
    assert table("--as", "rl150-dgpo-s0=dgpo").returncode == 0 and out.is_file()
