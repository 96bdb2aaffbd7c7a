"""bench/lease_runs.py: a lease's run folders (summaries, dev evaluations, KD loss, collapse alarms) as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "lease_runs.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_rl_and_kd_runs_and_the_lanes_log(tmp_path):
    rl = tmp_path / "rl-dgpo-s1"   # stopped by the deadline: no summary.json
    rl.mkdir()
    (rl / "metrics.csv").write_text("step,reward,collapse\n1,0.5,0\n2,0.6,1\n3,0.7,0\n")
    (rl / "eval.csv").write_text("step,dev_n,dev_em\n50,300,0.87\n100,300,nan\n,,\n")   # a cut last line
    kd = tmp_path / "kd-sft-s0"
    kd.mkdir()
    (kd / "metrics.csv").write_text("step,loss,peak_mem_gb,elapsed_s,lr\n10,3.9,24.5,6.2,1e-4\n525,0.01,24.7,380,0\n")
    (kd / "summary.json").write_text(json.dumps({"steps": 525}))
    log = tmp_path / "lanes.log"
    log.write_text("[08:31:11] start\n\n[08:57:11] done\n")
    out = tmp_path / "runs.json"
    r = _run(rl, kd, "--lanes-log", log, "--card", "H200", "--commit", "abc", "--what", "a test", "--out", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert (doc["card"], doc["commit"], doc["lanes_log"]) == ("H200", "abc", ["[08:31:11] start", "[08:57:11] done"])
    assert doc["runs"]["rl-dgpo-s1"] == {"dev": [{"step": 50, "dev_n": 300, "dev_em": 0.87},
                                                 {"step": 100, "dev_n": 300, "dev_em": None},
                                                 {"step": None, "dev_n": None, "dev_em": None}],
                                         "collapse_alarms": 1, "steps_logged": 3}
    assert doc["runs"]["kd-sft-s0"] == {"summary": {"steps": 525},
                                        "first_logged": {"step": 10, "loss": 3.9, "peak_mem_gb": 24.5, "elapsed_s": 6.2},
                                        "last_logged": {"step": 525, "loss": 0.01, "peak_mem_gb": 24.7, "elapsed_s": 380}}


def test_a_folder_that_is_no_run_is_refused_and_nothing_written(tmp_path):
    out = tmp_path / "runs.json"
    r = _run(tmp_path, "--card", "x", "--commit", "x", "--what", "x", "--out", out)
    assert r.returncode == 2 and "no summary.json or metrics.csv in" in r.stderr and not out.exists()
    (tmp_path / "summary.json").write_text("{}")
    r = _run(tmp_path, "--lanes-log", tmp_path / "nope.log", "--card", "x", "--commit", "x", "--what", "x", "--out", out)
    assert r.returncode == 2 and "no such lanes log" in r.stderr and not out.exists()
