"""bench/update_profile.py: its variants switch what train/rl/models.py computes, and a tiny CPU run
writes every row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_variants_switch_the_mask_and_the_head(bench_script):
    from dgpo_edge.train import attention
    from dgpo_edge.train.rl import models

    bench = bench_script("update_profile")
    right = torch.tensor([[1, 1, 0]])
    try:
        bench.use_variant(masked=True, recompute=False)
        assert attention.model_mask(right) is right
        assert models.head_logps is models.kept_logits_logps
        bench.use_variant(masked=False, recompute=True)
        assert attention.model_mask(right) is None
        assert models.head_logps is not models.kept_logits_logps
    finally:
        bench.use_variant(masked=False, recompute=True)   # the defaults, for the tests that follow


def test_tiny_run_writes_every_variant(tmp_path):
    out = tmp_path / "u.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "update_profile.py"), "--tiny", "--device", "cpu",
                    "--repeats", "1", "--profile", "--fused-norm", "--compile", "--out", str(out)], check=True, capture_output=True, cwd=ROOT)
    result = json.loads(out.read_text())
    assert {(r["variant"], r["checkpointing"]) for r in result["rows"]} == {
        (v, c) for v in ("masked+kept", "unmasked+kept", "unmasked+recomp") for c in (True, False)} | {
        ("unmasked+recomp+fused-norm", False), ("unmasked+recomp+compiled", False)}
    assert all(r["micro_batch_s"] > 0 and r["update_estimate_s"] >= 0 for r in result["rows"])
    assert {r["pass"] for r in result["no_grad"]} == {"logp (student)", "teacher (3B shape)"}
    assert set(result["profile"]) == {"masked+kept", "unmasked+recomp"} and result["profile"]["masked+kept"]
    assert result["card"] == "cpu" and result["shape"]["tiny"] is True


def test_fused_rms_norms_compute_what_the_modules_do_and_are_restored(bench_script):
    import test_rollout_support as support

    bench = bench_script("update_profile")
    lm = support.tiny_model("qwen2", 97, seed=4)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = lm(input_ids=ids).logits
        with bench.fused_rms_norms([lm]) as norms:
            assert len(norms) == 2 * 2 + 1          # two per layer, and the final one
            assert all("forward" in vars(m) for m in norms)
            fused = lm(input_ids=ids).logits
        assert not any("forward" in vars(m) for m in norms)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
