"""`train ppo | dgpo | grpo` under DeepSpeed ZeRO-2 (train/rl/deepspeed.py), launched like on a GPU host
(`accelerate launch` with the project's ZeRO-2 config), here on CPU with one process
(DS_ACCELERATOR=cpu), on the toy task of test_rl_loop.py. Skipped without DeepSpeed (not a
project dependency).

The update runs two micro-batches per mini-batch, so the engines' own accumulation boundary and
unscaled backward are exercised: in fp32 a ZeRO-2 run must log the numbers of a plain run.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("accelerate")

import test_rl_loop
from test_rl_loop import assert_same_metrics, rows, write_rl_config
from test_train_deepspeed import ROOT, _env, _launch, _ok, _plain

toy = test_rl_loop.toy   # the fixture: tiny student and teacher, the one-question corpus

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                 reason="deepspeed is not installed (it is not a project dependency)")]

# Two micro-batches of 2 rollouts per optimizer step; a constant lr, so a 2-step run is the start of a
# 3-step one; a checkpoint after every step.
SMALL = {"ppo": {"mini_batch": 4, "micro_batch": 2}, "optim": {"steps": 3, "lr": 1e-3, "schedule": "constant"},
         "log": {"save_every": 1, "tensorboard": False, "progress": False}}


def _config(toy: Path, out: Path) -> Path:
    return write_rl_config(toy, out, **SMALL)


def test_ppo_under_zero2_trains_and_resumes_like_an_uninterrupted_run(toy, tmp_path):
    from safetensors.torch import load_file

    cut = _config(toy, tmp_path / "cut")
    _ok(_launch(tmp_path, 2, ["ppo", "--config", str(cut), "optim.steps=2"]))
    assert len(rows(tmp_path / "cut")) == 2
    out = _ok(_launch(tmp_path, 2, ["ppo", "--config", str(cut)]))
    assert "resuming from" in out and "at step 2" in out
    _ok(_launch(tmp_path, 2, ["ppo", "--config", str(_config(toy, tmp_path / "whole"))]))
    # The engines' optimizer states, the schedulers and the RNG came back: step 3 is the whole run's.
    assert_same_metrics(rows(tmp_path / "cut"), rows(tmp_path / "whole"))
    assert len(rows(tmp_path / "whole")) == 3
    last = tmp_path / "cut" / "checkpoints" / "last"
    before, after = load_file(toy / "student" / "model.safetensors"), load_file(last / "model.safetensors")
    assert all(not torch.equal(before[k], after[k]) for k in before)
    # Each engine saved by its own Accelerator, beside the shared RNG and the schedulers.
    assert (last / "state" / "actor").is_dir() and (last / "state" / "critic").is_dir()
    r = rows(tmp_path / "cut")[-1]
    assert float(r["value_loss"]) >= 0 and float(r["critic_grad_norm"]) > 0 and float(r["grad_norm"]) > 0


def test_dgpo_under_zero2_logs_the_numbers_of_a_plain_run(toy, tmp_path):
    # A decaying lr (halved for step 2's two optimizer steps): the engines must follow the schedulers
    # that drive the raw AdamWs.
    args = ["dgpo", "--config", str(_config(toy, tmp_path / "ds")), "optim.steps=2", "optim.schedule=linear"]
    _ok(_launch(tmp_path, 2, args))
    _ok(_plain(tmp_path, [*args, f"run.out_dir={tmp_path / 'plain'}"]))
    got, want = rows(tmp_path / "ds"), rows(tmp_path / "plain")
    assert len(got) == 2 and float(got[0]["teacher_share"]) > 0
    # Same sampled tokens, and losses and gradient norms (DeepSpeed's, before clipping) equal up to
    # summation order: the token-share weights were neither divided by the accumulation count nor
    # stepped after each micro-batch.
    assert_same_metrics(got, want)


def test_grpo_under_zero2_runs_one_engine(toy, tmp_path):
    out = tmp_path / "grpo"
    config = write_rl_config(toy, out, **{**SMALL, "optim": {**SMALL["optim"], "steps": 1}}, teacher={"path": ""},
                             rollout={"prompts_per_step": 2, "samples_per_prompt": 4})
    _ok(_launch(tmp_path, 2, ["grpo", "--config", str(config)]))
    assert len(rows(out)) == 1 and rows(out)[0]["value_loss"] == ""
    assert sorted(p.name for p in (out / "checkpoints" / "last" / "state").iterdir()) == ["actor"]   # no critic


def test_zero3_is_refused_before_any_model_loads(toy, tmp_path):
    """The process itself, in the environment `accelerate launch` gives it (the launcher then
    reports the child's exit code 2 and exits 1)."""
    config = _config(toy, tmp_path / "z3")
    env = {**_env(), "ACCELERATE_USE_DEEPSPEED": "true",
           "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(ROOT / "train" / "configs" / "deepspeed-zero3.json")}
    done = subprocess.run([sys.executable, "-m", "dgpo_edge", "train", "dgpo", "--config", str(config)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ZeRO-2 only, not ZeRO-3" in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "z3").exists()                       # refused before the run folder
