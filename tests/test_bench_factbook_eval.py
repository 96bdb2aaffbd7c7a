"""bench/factbook_eval.py on CPU with tiny models: a checkpoint that cannot be loaded costs the
others nothing (a lease's last evaluations share one call per GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from train_helpers import smol_tokenizer_dir, tiny_model_dir, write_toy_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_an_unloadable_model_is_named_and_the_others_are_evaluated(tmp_path, tmp_path_factory):
    model = tiny_model_dir(smol_tokenizer_dir(tmp_path_factory), tmp_path / "tiny")
    write_toy_data(tmp_path / "data")
    out = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "factbook_eval.py"), "--data", str(tmp_path / "data"),
                        "--out", str(out), "--splits", "dev", "--batch-size", "2", "--max-turn-tokens", "8",
                        "--model", f"first={model}", "--model", f"gone={tmp_path / 'no-such-run'}",
                        "--model", f"last={model}"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1
    assert "error: gone: " in r.stderr and "not evaluated: gone" in r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(row["method"], row["split"], row["n"]) for row in rows] == [("first", "dev", 2), ("last", "dev", 2)]
