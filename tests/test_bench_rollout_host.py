"""bench/rollout_host.py: the host's share of a rollout step, measured with an engine that answers at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from train_helpers import smol_tokenizer_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_every_turn_runs_to_its_budget_and_the_shares_are_reported(tmp_path, tmp_path_factory):
    questions = tmp_path / "train.jsonl"
    questions.write_text("".join(json.dumps({"question": f"What is the capital of Country {i}"}) + "\n"
                                 for i in range(9)))
    out = tmp_path / "host.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "rollout_host.py"), "--tokenizer",
                    str(smol_tokenizer_dir(tmp_path_factory)), "--questions", str(questions), "--prompts", "6",
                    "--batch", "4", "--turn-tokens", "20", "--obs-tokens", "20", "--total-tokens", "1000",
                    "--repeats", "2", "--out", str(out)], check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    # random ids hold no action: four invalid turns with feedback, then the final one, 20 tokens each
    assert result["prompts"] == 6 and result["generated_tokens"] == 6 * 5 * 20
    assert len(result["runs"]) == 2 and all(r["generated_tokens"] == 600 for r in result["runs"])
    assert result["host_s"] > 0 and result["pack_s"] > 0
    assert result["rollout_host_s"] == pytest.approx(result["host_s"] + result["pack_s"], abs=1e-3)
    assert result["card"].startswith("cpu") and result["commit"]
