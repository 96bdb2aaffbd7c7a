"""`train sft` / `train kd` under DeepSpeed ZeRO-2 and ZeRO-3, launched like on a GPU host
(`accelerate launch` with the project's DeepSpeed configs), here on CPU with one process
(DS_ACCELERATOR=cpu). DeepSpeed is not a project dependency: these runs are skipped without it.
The refusals of `check_zero3` need no DeepSpeed and always run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from train_helpers import (
    read_metrics,
    smol_tokenizer_dir,
    tiny_model_dir,
    write_config,
    write_toy_data,
)

from dgpo_edge.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (it is not a project dependency)")
# Each launch is a real run: tiny batches, fp32 (so ZeRO's numbers match a plain run); a constant lr,
# so a 3-step run is the first 3 steps of a 5-step one.
OPTIM = {"max_steps": 3, "lr": 1e-2, "batch_size": 1, "grad_accum": 2, "grad_clip": 1.0, "schedule": "constant"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds-toy")
    tok = smol_tokenizer_dir(tmp_path_factory)
    return {"student": tiny_model_dir(tok, root / "student", seed=0),
            "teacher": tiny_model_dir(tok, root / "teacher", seed=1, num_hidden_layers=3),
            **write_toy_data(root / "data")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    return {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1"}


def _launch(tmp_path: Path, stage: int, args: list[str]) -> subprocess.CompletedProcess:
    """`accelerate launch` with the project's ZeRO YAML for `stage`, cut to one process; the YAML's
    relative JSON path is made absolute so the run may start anywhere."""
    yaml_text = (ROOT / "train" / "configs" / f"accelerate-zero{stage}.yaml").read_text()
    json_path = f"train/configs/deepspeed-zero{stage}.json"
    assert json_path in yaml_text
    accel = tmp_path / f"accelerate-zero{stage}.yaml"
    accel.write_text(yaml_text.replace(json_path, str(ROOT / json_path)))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accel), "--num_processes", "1",
           "--main_process_port", str(_free_port()), "-m", "dgpo_edge", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env(), cwd=tmp_path, check=False)


def _plain(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """The same command without DeepSpeed: the reference numbers."""
    cmd = [sys.executable, "-m", "dgpo_edge", "train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=_env(), cwd=tmp_path, check=False)


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def _losses(run: Path) -> list[float]:
    return [float(r["loss"]) for r in read_metrics(run / "metrics.csv")]


def _assert_full_checkpoint(ckpt: Path, initial: Path) -> None:
    """Every tensor of the initial model is saved with its full shape, and training moved it."""
    from safetensors.torch import load_file

    before, after = load_file(initial / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert sorted(after) == sorted(before)
    assert {k: tuple(v.shape) for k, v in after.items()} == {k: tuple(v.shape) for k, v in before.items()}
    assert all(not (before[k] == after[k]).all() for k in before)


@pytest.mark.slow
@needs_deepspeed
def test_zero3_sft_saves_the_gathered_weights_and_resumes_like_an_uninterrupted_run(toy, tmp_path):
    def config(name: str, steps: int) -> Path:
        return write_config(tmp_path / f"{name}.yaml", toy["student"], toy["train"], tmp_path / name,
                            optim={**OPTIM, "max_steps": steps}, chunk_size=0)

    _ok(_launch(tmp_path, 3, ["sft", "--config", str(config("cut", 3))]))
    # ZeRO-3 keeps only shards in the model itself: without gathering, last/ held (0,)-shaped tensors.
    _assert_full_checkpoint(tmp_path / "cut/checkpoints/last", toy["student"])
    out = _ok(_launch(tmp_path, 3, ["sft", "--config", str(config("cut", 5))]))
    assert "resuming from" in out and "at step 3" in out
    _ok(_launch(tmp_path, 3, ["sft", "--config", str(config("whole", 5))]))
    cut, whole = _losses(tmp_path / "cut"), _losses(tmp_path / "whole")
    assert len(cut) == len(whole) == 5
    # DeepSpeed's own optimizer state came back: steps 4-5 are those of the uninterrupted run.
    assert cut == pytest.approx(whole, rel=1e-5)
    assert json.loads((tmp_path / "cut/checkpoints/last/trainer_state.json").read_text())["step"] == 5


@pytest.mark.slow
@needs_deepspeed
@pytest.mark.parametrize("stage, chunk_size", [(3, 0), (2, 5000)])
def test_kd_under_zero_matches_a_plain_run(toy, tmp_path, stage, chunk_size):
    config = write_config(tmp_path / "kd.yaml", toy["student"], toy["train"], tmp_path / "ds",
                          optim=OPTIM, chunk_size=chunk_size,
                          kd={"teacher": str(toy["teacher"]), "loss": "forward_kl"})
    _ok(_launch(tmp_path, stage, ["kd", "--config", str(config)]))
    _ok(_plain(tmp_path, ["kd", "--config", str(config), f"run.out_dir={tmp_path / 'plain'}"]))
    # Under ZeRO-3 a teacher built after the Accelerator came up partitioned (empty embeddings: the
    # first forward failed); loaded whole, it gives the plain run's targets and so its losses.
    assert _losses(tmp_path / "ds") == pytest.approx(_losses(tmp_path / "plain"), rel=1e-4)
    _assert_full_checkpoint(tmp_path / "ds/checkpoints/last", toy["student"])


# --- refusals (no DeepSpeed needed) ---------------------------------------------------------

def _config(tmp_path: Path, overrides: list[str]):
    from dgpo_edge.train.config import SFTConfig, load_config

    path = tmp_path / "c.yaml"
    path.write_text(f"run: {{out_dir: {tmp_path / 'run'}}}\nmodel: {{path: m}}\ndata: {{train: t.jsonl}}\n")
    return load_config(SFTConfig, path, overrides)


def test_zero3_refuses_the_chunked_loss_with_any_number_of_processes(tmp_path):
    from dgpo_edge.train.trainer import check_zero3

    with pytest.raises(InputError, match="chunk_size=8192"):
        check_zero3(_config(tmp_path, []), stage=3, processes=1)
    check_zero3(_config(tmp_path, []), stage=2, processes=8)  # ZeRO-2 keeps whole weights
    check_zero3(_config(tmp_path, ["chunk_size=0"]), stage=3, processes=8)


def test_zero3_refuses_compiled_layers(tmp_path):
    from dgpo_edge.train.trainer import check_zero3

    with pytest.raises(InputError, match="model.compile=true"):
        check_zero3(_config(tmp_path, ["chunk_size=0", "model.compile=true"]), stage=3, processes=2)
    check_zero3(_config(tmp_path, ["model.compile=true"]), stage=2, processes=2)   # ZeRO-2 keeps whole weights


def test_zero3_refuses_dev_evaluation(tmp_path):
    from dgpo_edge.train.trainer import check_zero3

    dev = ["chunk_size=0", "data.dev=dev.jsonl", "data.retriever=corpus.jsonl"]
    with pytest.raises(InputError, match=r"data\.dev .* ZeRO-3 \(2 processes\)"):
        check_zero3(_config(tmp_path, dev), stage=3, processes=2)
    # One process too: the fast rollout engine's CUDA graphs cannot capture ZeRO-3's gathers.
    with pytest.raises(InputError, match=r"data\.dev .* ZeRO-3 \(1 process\)"):
        check_zero3(_config(tmp_path, dev), stage=3, processes=1)
    check_zero3(_config(tmp_path, dev), stage=2, processes=2)
    check_zero3(_config(tmp_path, dev), stage=None, processes=2)
    # data.report alone evaluates as well (rank 0 would wait on shards while the others wait on it)
    report = ["chunk_size=0", "data.report=test.jsonl", "data.retriever=corpus.jsonl"]
    with pytest.raises(InputError, match=r"data\.report .* ZeRO-3 \(2 processes\)"):
        check_zero3(_config(tmp_path, report), stage=3, processes=2)
