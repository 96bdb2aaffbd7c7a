"""bench/head_logps.py: the LM head's no-gradient pass before and after, the same bits, both timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("temperature", ["1.0", "0.7"])
def test_both_versions_are_timed_and_give_the_same_bits(tmp_path, temperature, backward):
    out = tmp_path / "head.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "head_logps.py"), "--vocab", "97", "--hidden", "16",
                    "--positions", "37", "--rows", "5", "--temperature", temperature, "--repeats", "2",
                    "--out", str(out), *(["--backward"] if backward else [])], check=True, capture_output=True,
                   timeout=120)
    result = json.loads(out.read_text())
    assert result["bitwise_equal"] is True and result["card"] == "cpu" and result["commit"]
    assert result["pass"] == ("update" if backward else "scoring")
    assert len(result["times"]["before"]) == len(result["times"]["after"]) == 2
    assert result["speedup"] == pytest.approx(result["before_s"] / result["after_s"], rel=0.02)
