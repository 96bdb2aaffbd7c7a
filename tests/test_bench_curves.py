"""bench/curves.py: a run's metrics.csv and eval.csv as the raw numbers of a curves image."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_curves_keep_the_panels_columns_and_dev_evaluations(tmp_path):
    run = tmp_path / "rl-ppo-s0"
    run.mkdir()
    (run / "metrics.csv").write_text("step,reward,kl_teacher,policy_loss\n1,0.5,nan,0.1\n2,0.75,nan,0.2\n")
    (run / "eval.csv").write_text("step,dev_n,dev_em\n2,300,0.8433333333\n")
    out = tmp_path / "curves.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "curves.py"), str(run), "--card", "H100",
                        "--commit", "abc", "--what", "a test", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert (doc["card"], doc["commit"], doc["what"]) == ("H100", "abc", "a test")
    curves = doc["runs"]["rl-ppo-s0"]
    # policy_loss is no panel; a PPO run's teacher KL is null, not a number
    assert curves["metrics"] == {"step": [1.0, 2.0], "reward": [0.5, 0.75], "kl_teacher": [None, None]}
    assert curves["dev"] == {"step": [2], "dev_em": [0.84333]}


def test_a_folder_without_metrics_is_refused(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "curves.py"), str(tmp_path), "--card", "x",
                        "--commit", "x", "--what", "x", "--out", str(tmp_path / "c.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "no metrics.csv in" in r.stderr and not (tmp_path / "c.json").exists()


def test_a_run_cut_before_its_first_evaluation_has_no_dev_curve(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import curves

    (tmp_path / "metrics.csv").write_text("step,reward\n1,0.5\n")
    (tmp_path / "eval.csv").write_text("step,dev_n,dev_em\n")
    assert curves.run_curves(tmp_path) == {"metrics": {"step": [1.0], "reward": [0.5]}}
