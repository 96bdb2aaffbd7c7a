"""`accelerate launch` with two CPU processes (gloo): the distributed path of the trainer, end to end."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cpu_processes_share_the_global_batch(tmp_path_factory, tmp_path):
    tok = smol_tokenizer_dir(tmp_path_factory)
    model = tiny_model_dir(tok, tmp_path / "model")
    data = write_toy_data(tmp_path / "data")
    common = {"optim": {"max_steps": 3, "lr": 1e-2}}
    # log.save_minutes ~0: a checkpoint at every step, decided by rank 0's clock and broadcast (the
    # ranks' own clocks could disagree, and a rank saving alone would hang at the save's barrier)
    two = write_config(tmp_path / "two.yaml", model, data["train"], tmp_path / "two",
                       optim={**common["optim"], "batch_size": 1}, log={"save_minutes": 1e-9})
    one = write_config(tmp_path / "one.yaml", model, data["train"], tmp_path / "one",
                       optim={**common["optim"], "batch_size": 2})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
              str(ROOT / "train" / "configs" / "accelerate-cpu-2proc.yaml"), "--main_process_port", str(_free_port()),
              "-m", "dgpo_edge", "train", "sft", "--config", str(two)]
    done = subprocess.run(launch, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 3
    assert done.stdout.count("trained 3 steps") == 1  # one report, from rank 0
    single = subprocess.run([sys.executable, "-m", "dgpo_edge", "train", "sft", "--config", str(one)],
                            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    assert single.returncode == 0, single.stderr[-3000:]
    # Two processes x 1 row see exactly the rows one process x 2 rows sees, step by step.
    two_rows, one_rows = read_metrics(tmp_path / "two" / "metrics.csv"), read_metrics(tmp_path / "one" / "metrics.csv")
    assert [r["tokens"] for r in two_rows] == [r["tokens"] for r in one_rows]
    assert [r["loss_tokens"] for r in two_rows] == [r["loss_tokens"] for r in one_rows]
    # and the synchronised (all-reduced) update trains: the saved weights moved
    from safetensors.torch import load_file

    before, after = load_file(model / "model.safetensors"), load_file(tmp_path / "two/checkpoints/last/model.safetensors")
    assert all(not (before[k] == after[k]).all() for k in before)
    assert sorted(p.name for p in (tmp_path / "two/checkpoints/last/state").glob("random_states_*")) == \
        ["random_states_0.pkl", "random_states_1.pkl"]
