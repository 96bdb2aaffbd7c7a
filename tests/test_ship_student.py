"""bench/ship_student.py: a student folder from a KD adapter of any depth, which the bundle's own
reader accepts, with the layers `model prune --keep-layers N` kept and the adapter's digests; bad
adapters are one error line and exit status 2, with nothing written."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

from dgpo_edge.bundle.student import SHIPPED, shipped_student  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def fake_adapter(folder: Path, layers: list[int]) -> Path:
    """peft's layout with rank-2 q_proj adapters on `layers` (the shapes do not matter here)."""
    folder.mkdir(parents=True)
    tensors = {}
    for i in layers:
        stem = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        tensors[f"{stem}.lora_A.weight"] = np.full((2, 4), i, np.float32)
        tensors[f"{stem}.lora_B.weight"] = np.ones((4, 2), np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 2, "target_modules": ["q_proj"]}))
    return folder


def ship(tmp_path: Path, adapter: Path, out: Path):
    trained = tmp_path / "trained.json"
    trained.write_text(json.dumps({"recipe": "test", "commit": "abc1234"}))
    return subprocess.run([sys.executable, str(ROOT / "bench" / "ship_student.py"), str(adapter),
                           "--name", "kd-24l", "--trained", str(trained), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_24_layer_adapter_becomes_a_student_folder(tmp_path):
    adapter = fake_adapter(tmp_path / "adapter", list(range(24)))
    r = ship(tmp_path, adapter, tmp_path / "student")
    assert r.returncode == 0, r.stderr
    student = shipped_student(tmp_path / "student")
    like = json.loads((SHIPPED / "student.json").read_text())
    assert student.spec["layers"] == [0, 1, 3, 4, 5, 6, 8, 9, 10, 11, 13, 14, 15, 16, 18, 19, 20, 21, 23, 24, 25,
                                      26, 28, 29]                       # what `model prune --keep-layers 24` kept
    assert {k: student.spec[k] for k in ("base", "quant", "index_kind", "protocol")} == \
        {k: like[k] for k in ("base", "quant", "index_kind", "protocol")}
    digest = hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert student.spec["adapter"]["adapter_model.safetensors"] == digest
    assert "norms.safetensors" not in student.spec["adapter"]             # optional, absent here
    assert (tmp_path / "student" / "adapter" / "adapter_model.safetensors").read_bytes() == \
        (adapter / "adapter_model.safetensors").read_bytes()
    assert student.spec["name"] == "kd-24l" and student.spec["trained"]["commit"] == "abc1234"


@pytest.mark.parametrize("layers, needle", [([0, 1, 3], "not 0..N-1"), (list(range(31)), "the base only 30")])
def test_an_adapter_that_does_not_fit_is_refused_with_nothing_written(tmp_path, layers, needle):
    adapter = fake_adapter(tmp_path / "adapter", layers)
    r = ship(tmp_path, adapter, tmp_path / "student")
    assert r.returncode == 2 and needle in r.stderr and r.stderr.startswith("error: ")
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "student").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".student")]   # no half-written folder


def test_a_student_folder_is_replaced_and_any_other_folder_refused(tmp_path):
    adapter = fake_adapter(tmp_path / "adapter", list(range(24)))
    assert ship(tmp_path, adapter, tmp_path / "student").returncode == 0
    assert ship(tmp_path, adapter, tmp_path / "student").returncode == 0      # shipped again over itself
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    r = ship(tmp_path, adapter, other)
    assert r.returncode == 2 and "is not a student folder; refusing to replace it" in r.stderr
    assert [p.name for p in other.iterdir()] == ["keep.txt"]


def test_the_shipped_adapter_gives_back_the_shipped_spec(tmp_path):
    r = ship(tmp_path, SHIPPED / "adapter", tmp_path / "student")
    assert r.returncode == 0, r.stderr
    got = json.loads((tmp_path / "student" / "student.json").read_text())
    want = json.loads((SHIPPED / "student.json").read_text())
    assert got["layers"] == want["layers"] and got["adapter"] == want["adapter"]
