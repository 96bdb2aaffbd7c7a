"""bench/lease/watch.sh on a copy of the lease's layout (no GPU: nvidia-smi is absent here): what a
watch call leaves in $OUT for the device call to return."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_watch_returns_results_and_each_adapter_under_a_name_a_call_returns(tmp_path):
    tree = _watch_copy(tmp_path)
    run = tree / "out" / "runs" / "worlds-dgpo-lora-all-24l+lr5e5"
    run.mkdir(parents=True)
    (run / "eval.csv").write_text("step,dev_em\n40,0.78\n")
    adapter = tree / "out" / "pack" / "worlds-dgpo-lora-all-24l+lr5e5-adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"lora")
    (tree / "out" / "results").mkdir()
    (tree / "out" / "results" / "rows.jsonl").write_text('{"method": "rl50-grpo-s1"}\n')
    (tree / "out" / "logs" / "rl-dgpo-s0.log").write_text("Traceback (most recent call last):\nRuntimeError: boom\n")
    returned = tmp_path / "returned"
    returned.mkdir()
    done = subprocess.run(["bash", str(tree / "bench" / "lease" / "watch.sh"), "0"], capture_output=True, text=True,
                          env={**os.environ, "OUT": str(returned)}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "!! out/logs/rl-dgpo-s0.log: RuntimeError: boom" in done.stdout
    # '+' is not a name a device call returns: the file is renamed, the folder inside is not
    assert sorted(p.name for p in returned.iterdir()) == ["results.tgz", "worlds-dgpo-lora-all-24l_lr5e5-adapter.tgz"]
    with tarfile.open(returned / "worlds-dgpo-lora-all-24l_lr5e5-adapter.tgz") as tgz:
        assert "worlds-dgpo-lora-all-24l+lr5e5-adapter/adapter_model.safetensors" in tgz.getnames()
    with tarfile.open(returned / "results.tgz") as tgz:
        assert "results/worlds-dgpo-lora-all-24l+lr5e5.eval.csv" in tgz.getnames()
        assert "results/rows.jsonl" in tgz.getnames()   # a lease's rows written under out/results


def _watch_copy(tmp_path: Path) -> Path:
    tree = tmp_path / "checkout"
    (tree / "bench" / "lease").mkdir(parents=True)
    shutil.copy(ROOT / "bench" / "lease" / "watch.sh", tree / "bench" / "lease" / "watch.sh")
    (tree / "out" / "logs").mkdir(parents=True)
    return tree


def test_a_watch_ends_early_once_the_work_is_done(tmp_path):
    tree = _watch_copy(tmp_path)
    (tree / "out" / "logs" / "lease.done").touch()
    # 600 s asked: the subprocess timeout (60 s) fails the test unless the marker ends the wait
    done = subprocess.run(["bash", str(tree / "bench" / "lease" / "watch.sh"), "600"], capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if k != "OUT"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "the lease's work is done (out/logs/lease.done)" in done.stdout


def test_a_watch_of_whole_seconds_only(tmp_path):
    tree = _watch_copy(tmp_path)
    done = subprocess.run(["bash", str(tree / "bench" / "lease" / "watch.sh"), "5m"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == "error: SECONDS '5m': whole seconds"


def test_a_watch_cut_short_has_already_left_the_results_it_waited_on(tmp_path):
    """Near a lease's end a call's limit is the device time left, below the watch's SECONDS: the call is
    killed and returns only what is under $OUT by then. The wait brings the results every 60 s, so a
    cut call still returns the rows written while it waited (before, results.tgz came only at the end)."""
    tree = _watch_copy(tmp_path)
    (tree / "out" / "worlds-eval").mkdir(parents=True)
    (tree / "out" / "worlds-eval" / "notes.jsonl").write_text('{"method": "kd-24l@notes-out-club_asked"}\n')
    returned = tmp_path / "returned"
    returned.mkdir()
    watch = subprocess.Popen(["bash", str(tree / "bench" / "lease" / "watch.sh"), "300"], stdout=subprocess.DEVNULL,
                             env={**os.environ, "OUT": str(returned)}, start_new_session=True)
    try:
        for _ in range(100):   # the first bring is at once; give it up to 10 s
            if (returned / "results.tgz").exists():
                break
            time.sleep(0.1)
    finally:
        os.killpg(watch.pid, 9)   # the call's limit: killed, not asked to stop
        watch.wait()
    assert [p.name for p in returned.iterdir()] == ["results.tgz"]
    with tarfile.open(returned / "results.tgz") as tgz:
        assert "results/worlds-eval.notes.jsonl" in tgz.getnames()


def test_a_watch_on_a_machine_with_no_lease_work_says_so_at_once(tmp_path):
    """The lease's machine goes back 30 s after a call with none after it; the next watch is then lent a
    new, bare machine. It used to wait out its SECONDS there (two 300 s calls spent on 2026-12-02)."""
    tree = _watch_copy(tmp_path)
    shutil.rmtree(tree / "out")
    done = subprocess.run(["bash", str(tree / "bench" / "lease" / "watch.sh"), "600"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout.startswith("!! no lease work on this machine (no out/logs)")
