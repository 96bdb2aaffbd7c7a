"""bench/factbook_lanes.sh, the one-lease driver of the FactbookQA rows, against a stand-in
bench/factbook_rows.sh that records how it was called (the real stages need a GPU)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# run names come from the real script (factbook_rows.real.sh name), as the lanes ask for them
STUB = """#!/usr/bin/env bash
[ "$1" = name ] && exec bash bench/factbook_rows.real.sh "$@"
echo "$* | gpu=${CUDA_VISIBLE_DEVICES:-} tag=${TAG:-}" >> out/calls.log
case $1 in
  row) echo "$2 $3 ${MICRO_BATCH:-}" >> out/micro.log
       d=out/runs/$(bash bench/factbook_rows.real.sh name "$2" "$3")
       mkdir -p "$d" && echo '{}' > "$d/report.jsonl" && echo '{}' > "$d/summary.json" ;;
  reports) echo "reports of $3 $4 $5" ;;
esac
"""


@pytest.fixture
def lanes(tmp_path):
    (tmp_path / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "factbook_lanes.sh", tmp_path / "bench")
    shutil.copy(ROOT / "bench" / "factbook_rows.sh", tmp_path / "bench" / "factbook_rows.real.sh")
    (tmp_path / "bench" / "factbook_rows.sh").write_text(STUB)

    def run(*lanes, **env):
        return subprocess.run(["bash", str(tmp_path / "bench" / "factbook_lanes.sh"), "3", *lanes],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "EVAL_LAST": "0", **env})
    return tmp_path, run


def _before_each_row(root: Path, shell: str) -> None:
    """Run `shell` first in the stand-in's `row` stage (to fail a row, or record its order)."""
    stub = (root / "bench" / "factbook_rows.sh").read_text()
    (root / "bench" / "factbook_rows.sh").write_text(stub.replace("  row) ", f"  row) {shell}\n       ", 1))


def test_rows_run_on_their_gpus_after_the_teacher_with_their_own_variants(lanes):
    root, run = lanes
    r = run("0=dgpo:0,ppo:1", "1=kd_jsd:0,dgpo:1:b01", VARIANT_b01="teacher.beta=0.01 ppo.clip=0.1",
            ROW_ARGS="eval.every=100", KD_ARGS="optim.lr=5e-4")
    assert r.returncode == 0, r.stderr
    calls = (root / "out" / "calls.log").read_text().splitlines()
    assert calls[0] == "start | gpu= tag="
    assert "KD start: not reported" in (root / "out" / "logs" / "lanes.log").read_text()   # the stand-in says none
    # the rows that need the teacher start after it (PPO needs none: it may log first, run beside it)
    teacher = calls.index("teacher | gpu=0 tag=")
    assert all(calls.index(c) > teacher for c in calls if c.startswith(("row dgpo", "row kd_")))
    assert "eval out/eval/lanes-ref.jsonl test,dev teacher kd base | gpu=0 tag=" in calls
    rows = sorted(c for c in calls if c.startswith("row "))
    assert rows == ["row dgpo 0 eval.every=100 | gpu=0 tag=",
                    "row dgpo 1 eval.every=100 teacher.beta=0.01 ppo.clip=0.1 | gpu=1 tag=b01",
                    "row kd_jsd 0 optim.lr=5e-4 | gpu=1 tag=",   # KD rows take KD_ARGS, not the RL rows' ROW_ARGS
                    "row ppo 1 eval.every=100 | gpu=0 tag="]
    (reports,) = [c for c in calls if c.startswith("reports ")]
    assert set(reports.split(" | ")[0].split()[2:]) == {"rl-dgpo-s0", "rl-dgpo-b01-s1", "kd-jsd-s0", "rl-ppo-s1"}
    assert (root / "out" / "logs" / "lanes.done").is_file()
    assert (root / "out" / "logs" / "rl-dgpo-b01-s1.log").is_file()


def test_rows_joined_by_plus_run_one_after_another(lanes):
    root, run = lanes
    # each row records its start and end, and lasts long enough for a parallel start to show
    _before_each_row(root, 'echo "begin $2" >> out/order.log; sleep 1; echo "end $2" >> out/order.log')
    r = run("0=kd_jsd:0+kd_seqkd:0+kd_reverse_kl:0", REFS="teacher")
    assert r.returncode == 0, r.stderr
    order = (root / "out" / "order.log").read_text().split("\n")
    assert order[:6] == ["begin kd_jsd", "end kd_jsd", "begin kd_seqkd", "end kd_seqkd",
                         "begin kd_reverse_kl", "end kd_reverse_kl"]
    calls = (root / "out" / "calls.log").read_text().splitlines()
    assert "eval out/eval/lanes-ref.jsonl test,dev teacher | gpu=0 tag=" in calls   # REFS chose the references


def test_ppo_on_the_teacher_then_dgpo_from_it(lanes):
    # the RL'd teacher is trained after the SFT teacher, and the DGPO row chained after it gets it
    # as its teacher through a variant
    root, run = lanes
    r = run("0=teacher_ppo:0+dgpo:0:rlt", REFS="", VARIANT_rlt="teacher.path=out/runs/rl-teacher_ppo-s0/checkpoints/best")
    assert r.returncode == 0, r.stderr
    calls = [c for c in (root / "out" / "calls.log").read_text().splitlines() if not c.startswith("reports")]
    assert calls == ["start | gpu= tag=", "teacher | gpu=0 tag=", "row teacher_ppo 0 | gpu=0 tag=",
                     "row dgpo 0 teacher.path=out/runs/rl-teacher_ppo-s0/checkpoints/best | gpu=0 tag=rlt"]


def test_dgpo_on_another_gpu_waits_until_the_ppo_teacher_has_finished(lanes):
    # GPU 1's DGPO row names the run GPU 0 trains as its teacher: it starts once that run has ended
    root, run = lanes
    _before_each_row(root, '[ "$2" = teacher_ppo ] && sleep 3; [ "$2" = dgpo ] && { [ -f out/runs/rl-teacher_ppo-s0/summary.json ]'
                           ' && echo "dgpo $3 after the teacher" || echo "dgpo $3 before the teacher"; } >> out/order.log')
    r = run("0=teacher_ppo:0+dgpo:0:rlt", "1=dgpo:1:rlt", REFS="",
            VARIANT_rlt="teacher.path=out/runs/rl-teacher_ppo-s0/checkpoints/best")
    assert r.returncode == 0, r.stderr
    assert sorted((root / "out" / "order.log").read_text().splitlines()) == [
        "dgpo 0 after the teacher", "dgpo 1 after the teacher"]


def test_a_kd_row_waits_for_the_run_its_kd_teacher_names(lanes):
    root, run = lanes
    _before_each_row(root, '[ "$2" = teacher_ppo ] && sleep 3; [ "$2" = kd_jsd ] && { [ -f out/runs/rl-teacher_ppo-s0/summary.json ]'
                           ' && echo "kd after the teacher" || echo "kd before the teacher"; } >> out/order.log')
    r = run("0=teacher_ppo:0", "1=kd_jsd:0:rlt", REFS="", VARIANT_rlt="kd.teacher=out/runs/rl-teacher_ppo-s0/checkpoints/best")
    assert r.returncode == 0, r.stderr
    assert (root / "out" / "order.log").read_text().splitlines() == ["kd after the teacher"]


def test_the_lanes_log_names_the_kd_start(lanes):
    root, run = lanes
    stub = root / "bench" / "factbook_rows.sh"
    stub.write_text(stub.read_text().replace(
        "case $1 in\n", "case $1 in\n  start) echo 'KD start: out/models/kd-start-abc123 (KD_ADAPTER=x)' ;;\n", 1))
    assert run("0=ppo:0", REFS="").returncode == 0
    assert "] KD start: out/models/kd-start-abc123 (KD_ADAPTER=x)" in (root / "out" / "logs" / "lanes.log").read_text()


def test_the_sft_row_needs_no_teacher(lanes):
    # kd_sft (the KD recipe on the gold trajectories) runs even when the teacher fails; a KD-loss row
    # beside it is skipped, and kd_sft takes the KD rows' overrides and run name
    root, run = lanes
    stub = root / "bench" / "factbook_rows.sh"
    stub.write_text(stub.read_text().replace("case $1 in\n", "case $1 in\n  teacher) exit 1 ;;\n", 1))
    r = run("0=kd_sft:0,kd_jsd:0", REFS="", KD_ARGS="optim.lr=5e-4", ROW_ARGS="eval.every=100")
    assert r.returncode == 1   # the teacher failed
    rows = [c for c in (root / "out" / "calls.log").read_text().splitlines() if c.startswith("row ")]
    assert rows == ["row kd_sft 0 optim.lr=5e-4 | gpu=0 tag="]
    assert "skip kd_jsd s0: no teacher" in (root / "out" / "logs" / "lanes.log").read_text()
    assert (root / "out" / "runs" / "kd-sft-s0" / "summary.json").is_file()


def test_a_row_whose_teacher_run_failed_is_skipped_without_waiting(lanes):
    root, run = lanes
    _before_each_row(root, '[ "$2" = teacher_ppo ] && exit 1')
    r = run("0=teacher_ppo:0", "1=dgpo:1:rlt", REFS="",
            VARIANT_rlt="teacher.path=out/runs/rl-teacher_ppo-s0/checkpoints/best")
    assert r.returncode == 1
    log = (root / "out" / "logs" / "lanes.log").read_text()
    assert "skip dgpo-rlt s1: its teacher rl-teacher_ppo-s0 did not finish" in log
    assert not any(c.startswith("row dgpo") for c in (root / "out" / "calls.log").read_text().splitlines())


def test_a_failed_row_stops_its_chain_and_the_command_fails(lanes):
    # the RL'd teacher failed: the DGPO row that needs it does not start; another lane goes on;
    # a row stopped by the deadline (124) is not a failure and does not stop its chain
    root, run = lanes
    _before_each_row(root, '[ "$2" = teacher_ppo ] && exit 1; [ "$2" = grpo ] && exit 124')
    r = run("0=teacher_ppo:0+dgpo:0:rlt", "1=grpo:0+ppo:0", REFS="", VARIANT_rlt="teacher.path=elsewhere")
    assert r.returncode == 1
    rows = [c.split(" |")[0] for c in (root / "out" / "calls.log").read_text().splitlines() if c.startswith("row ")]
    assert sorted(rows) == ["row grpo 0", "row ppo 0", "row teacher_ppo 0"]
    log = (root / "out" / "logs" / "lanes.log").read_text()
    assert "not started after teacher_ppo s0 failed: dgpo:0:rlt" in log and "failed: teacher_ppo s0 (" in log
    assert (root / "out" / "logs" / "lanes.failed").read_text().split("\n")[0] == "teacher_ppo s0"
    assert (root / "out" / "logs" / "lanes.done").is_file()


@pytest.mark.parametrize("teacher_ok", [True, False])
def test_the_last_evaluations_take_every_run_and_the_teacher_only_if_it_trained(lanes, teacher_ok):
    root, run = lanes
    for d in ("rl-dgpo-s0", "kd-jsd-s0"):
        (root / "out" / "runs" / d / "checkpoints" / "last").mkdir(parents=True)
    if not teacher_ok:
        stub = (root / "bench" / "factbook_rows.sh").read_text().replace("case $1 in", "case $1 in\n  teacher) exit 1 ;;", 1)
        (root / "bench" / "factbook_rows.sh").write_text(stub)
    r = run("0=ppo:0", REFS="", EVAL_LAST="1")
    assert r.returncode == (0 if teacher_ok else 1), r.stderr    # a failed teacher fails the command
    assert teacher_ok or (root / "out" / "logs" / "lanes.failed").read_text() == "teacher\n"
    evals = [c.split(" |")[0].split()[3:] for c in (root / "out" / "calls.log").read_text().splitlines()
             if c.startswith("eval out/eval/lanes-test.jsonl")]
    assert evals == [["kd", "rl-dgpo-s0", "kd-jsd-s0"] + (["teacher"] if teacher_ok else [])]


def _micro(root):
    return sorted((root / "out" / "micro.log").read_text().splitlines())


def test_rows_that_share_a_card_take_micro_batch_16(lanes):
    # alone on its card a row keeps the configs' 32; two rows at once on one card take 16 (two
    # 24-layer rows at 32 ran out of a 140 GB card); a given MICRO_BATCH holds for every row
    root, run = lanes
    assert run("0=ppo:0,dgpo:0", "1=ppo:1+dgpo:1", REFS="").returncode == 0
    assert _micro(root) == ["dgpo 0 16", "dgpo 1 32", "ppo 0 16", "ppo 1 32"]
    (root / "out" / "micro.log").unlink()
    assert run("0=ppo:2,dgpo:2", "1=ppo:3", REFS="", MICRO_BATCH="8").returncode == 0
    assert _micro(root) == ["dgpo 2 8", "ppo 2 8", "ppo 3 8"]


@pytest.mark.parametrize("error, resumed", [("torch.OutOfMemoryError: CUDA out of memory.", True),
                                            ("ValueError: something else", False)])
def test_a_row_out_of_gpu_memory_resumes_at_half_the_micro_batch(lanes, error, resumed):
    root, run = lanes
    # the first try of dgpo 0 fails (out of memory, or another error) before it records anything
    _before_each_row(root, f'[ "$2" = dgpo ] && [ ! -f out/tried ] && {{ touch out/tried; echo "{error}"; exit 1; }}')
    r = run("0=dgpo:0,ppo:0", REFS="")
    assert r.returncode == (0 if resumed else 1)
    log = (root / "out" / "logs" / "lanes.log").read_text()
    if resumed:
        assert _micro(root) == ["dgpo 0 8", "ppo 0 16"]   # the second try at half of 16
        assert "dgpo s0 ran out of GPU memory; resumed from its last checkpoint at micro-batch 8" in log
        assert "OutOfMemoryError" in (root / "out" / "logs" / "rl-dgpo-s0.oom1.log").read_text()
        assert not (root / "out" / "logs" / "lanes.failed").exists()
    else:   # another failure is not tried again
        assert _micro(root) == ["ppo 0 16"]
        assert (root / "out" / "logs" / "lanes.failed").read_text() == "dgpo s0\n"


def _fake_nvidia_smi(root: Path, free_mib: list[int]) -> dict[str, str]:
    """A PATH whose nvidia-smi reports, call by call, these MiB free (the last one from then on)."""
    bin_dir = root / "fakebin"
    bin_dir.mkdir()
    (root / "free.txt").write_text("\n".join(map(str, free_mib)) + "\n")
    script = bin_dir / "nvidia-smi"
    script.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {root}/smi.log
f={root}/free.txt
head -1 "$f"; [ "$(wc -l < "$f")" -gt 1 ] && sed -i 1d "$f"; exit 0
""")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OOM_POLL_S": "0"}


def test_a_row_out_of_gpu_memory_waits_for_the_card_and_resumes_until_it_fits(lanes):
    # two tries out of memory, the third fits; before each resume the card is asked for its free
    # memory until it has OOM_FREE_GB (40 GB) free: 10 GB, then 20 GB, then 60 GB
    root, run = lanes
    _before_each_row(root, '[ "$2" = dgpo ] && [ "$(ls out/tried* 2>/dev/null | wc -l)" -lt 2 ] '
                           '&& { touch out/tried$RANDOM; echo "torch.OutOfMemoryError: CUDA"; exit 1; }')
    r = run("1=dgpo:0", REFS="", **_fake_nvidia_smi(root, [10240, 20480, 61440]))
    assert r.returncode == 0, r.stderr
    assert _micro(root) == ["dgpo 0 8"]   # 32 alone on its card, then 16, then 8: the try that fitted
    log = (root / "out" / "logs" / "lanes.log").read_text()
    assert "gpu 1: dgpo s0 waits for 40 GB free (10 GB now)" in log
    assert log.count("ran out of GPU memory; resumed") == 2
    assert "-i 1" in (root / "smi.log").read_text()   # the row's own card
    logs = root / "out" / "logs"
    assert (logs / "rl-dgpo-s0.oom1.log").is_file() and (logs / "rl-dgpo-s0.oom2.log").is_file()


def test_a_row_out_of_gpu_memory_is_not_resumed_more_than_oom_resumes_times(lanes):
    root, run = lanes
    _before_each_row(root, '[ "$2" = dgpo ] && { echo "torch.OutOfMemoryError: CUDA"; exit 1; }')
    r = run("0=dgpo:0", REFS="", OOM_RESUMES="1")
    assert r.returncode == 1
    log = (root / "out" / "logs" / "lanes.log").read_text()
    assert log.count("ran out of GPU memory; resumed") == 1
    assert (root / "out" / "logs" / "lanes.failed").read_text() == "dgpo s0\n"


def test_a_kd_row_out_of_gpu_memory_is_not_resumed_at_another_micro_batch(lanes):
    # the micro-batch is the RL rows' (a KD row's batch is its config's): a KD row that fails fails
    root, run = lanes
    _before_each_row(root, '[ "$2" = kd_jsd ] && { echo "torch.OutOfMemoryError: CUDA"; exit 1; }')
    r = run("0=kd_jsd:0,ppo:0", REFS="")
    assert r.returncode == 1 and _micro(root) == ["ppo 0 16"]
    log = (root / "out" / "logs" / "lanes.log").read_text()
    assert "ran out of GPU memory" not in log
    assert "(micro-batch" not in next(line for line in log.splitlines() if "gpu 0: kd_jsd s0 for up to" in line)


def test_a_failed_last_evaluation_fails_the_command(lanes):
    root, run = lanes
    (root / "out" / "runs" / "rl-ppo-s0" / "checkpoints" / "last").mkdir(parents=True)
    stub = (root / "bench" / "factbook_rows.sh").read_text().replace("case $1 in", "case $1 in\n  eval) exit 1 ;;", 1)
    (root / "bench" / "factbook_rows.sh").write_text(stub)
    r = run("0=ppo:0", REFS="", EVAL_LAST="1")
    assert r.returncode == 1
    assert (root / "out" / "logs" / "lanes.failed").read_text() == "evaluation on gpu 0\n"
    assert (root / "out" / "logs" / "lanes.done").is_file()


def test_pack_writes_the_named_runs_that_have_a_checkpoint(lanes):
    root, run = lanes
    (root / "out" / "runs" / "rl-ppo-s0" / "checkpoints" / "last").mkdir(parents=True)
    r = run("0=ppo:0", REFS="", PACK="rl-ppo-s0 rl-dgpo-s9")
    assert r.returncode == 0, r.stderr
    calls = (root / "out" / "calls.log").read_text().splitlines()
    assert [c for c in calls if c.startswith("pack ")] == ["pack rl-ppo-s0 | gpu= tag="]
    log = (root / "out" / "logs" / "lanes.log").read_text()
    assert "packed rl-ppo-s0 (status 0)" in log and "not packed: rl-dgpo-s9 has no checkpoint" in log


def test_no_references_with_empty_refs(lanes):
    root, run = lanes
    assert run("0=dgpo:0", REFS="").returncode == 0
    assert not [c for c in (root / "out" / "calls.log").read_text().splitlines() if c.startswith("eval ")]


@pytest.mark.parametrize("lane, needle", [
    ("0=dgpo:0+", "bad lane"),
    ("0=dgpo:0+dgpo:0", "row dgpo:0 is given twice"),
    ("0=dgpo", "bad lane '0=dgpo'"),
    ("0=dgpo:0:Beta", "bad lane"),
    ("0=dgpo:0:b02", "row dgpo:0:b02 needs its overrides in VARIANT_b02"),
    ("0=dpgo:0", "unknown method dpgo"),
    ("0=dgpo:0 REFS=teachr", "REFS: unknown reference teachr"),
    ("0=dgpo:0,ppo:0 1=dgpo:0", None),
])
def test_a_bad_lane_stops_before_anything_runs(lanes, lane, needle):
    root, run = lanes
    if needle is None:   # the same row in two lanes would train one run folder twice
        lane, needle = lane.split(), "row dgpo:0 is given twice"
        r = run(*lane)
    elif " REFS=" in lane:
        lane, refs = lane.split(" REFS=")
        r = run(lane, REFS=refs)
    else:
        r = run(lane)
    assert r.returncode == 2 and needle in r.stderr
    assert not (root / "out" / "calls.log").exists()


# --- bench/factbook_rows.sh row: the command each RL method runs ---------------------------------

PYTHON_STUB = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
"""


@pytest.fixture
def rows(tmp_path):
    """bench/factbook_rows.sh in a scratch tree, its python a stand-in that records the command."""
    (tmp_path / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "factbook_rows.sh", tmp_path / "bench")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"stand-in")
    py = tmp_path / "py"
    py.write_text(PYTHON_STUB)
    py.chmod(0o755)

    def row(method, *extra, **env):
        calls = tmp_path / "calls.log"
        calls.unlink(missing_ok=True)
        r = subprocess.run(["bash", str(tmp_path / "bench" / "factbook_rows.sh"), "row", method, "0", *extra],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHON": str(py), "CALLS": str(calls),
                                "KD_ADAPTER": str(adapter), **env})
        return r, (calls.read_text().split() if calls.exists() else [])
    return row


def _value(args, key):
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(key + "=")]
    return value


@pytest.mark.parametrize("method, command, config, teacher, grouped", [
    ("ppo", "ppo", "factbook-ppo", False, False),
    ("dgpo", "dgpo", "factbook-dgpo", True, False),
    ("grpo", "grpo", "factbook-ppo", False, True),
    ("dgpo_grpo", "grpo", "factbook-dgpo", True, True),
])
def test_each_rl_row_runs_its_trainer_with_the_shared_settings(rows, method, command, config, teacher, grouped):
    r, args = rows(method, "optim.lr=2e-5", STEPS="50", MICRO_BATCH="8")
    assert r.returncode == 0, r.stderr
    assert args[:5] == ["-m", "dgpo_edge", "train", command, "--config"]
    assert args[5] == f"train/configs/{config}.yaml"
    assert _value(args, "run.out_dir") == f"out/runs/rl-{method}-s0"
    assert (_value(args, "optim.steps"), _value(args, "ppo.micro_batch")) == ("50", "8")
    assert _value(args, "data.report") == "out/factbookqa/test.jsonl"
    assert _value(args, "model.path").startswith("out/models/kd-start-")      # every row from the KD start
    assert any(a.startswith("teacher.path=") for a in args) == teacher
    # GRPO rows: four samples of the same 128 questions, two optimizer steps a step
    group = ["rollout.samples_per_prompt=4", "rollout.batch_size=512", "ppo.mini_batch=256"]
    assert all(g in args for g in group) == grouped and any(g in args for g in group) == grouped
    assert args[-1] == "optim.lr=2e-5"                                        # the caller's overrides win


def test_an_unknown_row_method_is_refused(rows):
    r, args = rows("dgpo_ppo")
    assert r.returncode == 2 and "unknown method dgpo_ppo" in r.stderr and not args


def test_a_deeper_adapter_starts_from_a_base_of_its_depth(rows):
    r, args = rows("dgpo", START="adapter")            # the shipped adapter's depth by default
    assert r.returncode == 0, r.stderr
    assert _value(args, "model.path") == "out/models/smollm2-135m-24l"
    r, args = rows("dgpo", START="adapter", STUDENT_LAYERS="15")
    assert r.returncode == 0, r.stderr
    assert _value(args, "model.path") == "out/models/smollm2-135m-15l"


def test_kd_loss_rows_train_a_student_of_the_rl_rows_depth(rows):
    # the KD-loss rows train from the pruned base the RL rows' KD start was merged into
    for layers in ("24", "15"):
        r, args = rows("kd_jsd", STUDENT_LAYERS=layers)
        assert r.returncode == 0, r.stderr
        assert _value(args, "model.path") == f"out/models/smollm2-135m-{layers}l" and "kd.loss=jsd" in args


def test_the_sft_row_is_the_kd_recipe_on_the_gold_trajectories(rows):
    # cross-entropy (SeqKD's loss) on oracle.jsonl, from the pruned base, one command: no teacher
    # trajectories are written first, as they are for kd_seqkd
    r, args = rows("kd_sft", "optim.lr=5e-4")
    assert r.returncode == 0, r.stderr
    assert args[:5] == ["-m", "dgpo_edge", "train", "kd", "--config"] and args.count("dgpo_edge") == 1
    assert _value(args, "kd.loss") == "seqkd" and _value(args, "data.train") == "out/factbookqa/oracle.jsonl"
    assert _value(args, "run.out_dir") == "out/runs/kd-sft-s0"
    assert _value(args, "model.path") == "out/models/smollm2-135m-24l" and args[-1] == "optim.lr=5e-4"


def test_a_rows_run_name_is_what_its_row_trains(rows, tmp_path):
    # `name` answers without a KD adapter (the lanes ask before anything exists) and agrees with the
    # run.out_dir each row trains
    def name(method, **env):
        r = subprocess.run(["bash", str(tmp_path / "bench" / "factbook_rows.sh"), "name", method, "0"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "KD_ADAPTER": "/nonexistent", **env})
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()
    cases = [("dgpo", {}), ("dgpo", {"START": "adapter", "TAG": "b01"}), ("teacher_ppo", {"START": "adapter"}),
             ("kd_jsd", {"TAG": "rlt"}), ("kd_sft", {})]
    assert [name(m, **env) for m, env in cases] == [
        "rl-dgpo-s0", "rl-dgpo-lora-b01-s0", "rl-teacher_ppo-s0", "kd-jsd-rlt-s0", "kd-sft-s0"]
    for method, env in cases:
        r, args = rows(method, **env)
        assert r.returncode == 0, r.stderr
        assert _value(args, "run.out_dir") == f"out/runs/{name(method, **env)}"


def test_unset_the_kd_start_is_table_1s_not_the_shipped_adapter(rows, tmp_path):
    # the shipped adapter is DGPO-trained: a Table 1 row started from it by default would pair
    # silently with rows from another start. Without KD_ADAPTER the rows take Table 1's KD student
    # from out/kd-start-adapter, or from git (none here: one error, nothing run)
    r, args = rows("dgpo", KD_ADAPTER="")
    assert r.returncode == 2 and not args
    assert "no KD adapter at out/kd-start-adapter/dgpo_edge/bundle/shipped/adapter" in r.stderr
    assert "git archive ba04eb7" in r.stderr
    table1 = tmp_path / "out" / "kd-start-adapter" / "dgpo_edge" / "bundle" / "shipped" / "adapter"
    table1.mkdir(parents=True)
    (table1 / "adapter_model.safetensors").write_bytes(b"table 1")
    r, args = rows("dgpo", KD_ADAPTER="")
    assert r.returncode == 0, r.stderr
    digest = hashlib.sha256(b"table 1").hexdigest()[:12]
    assert _value(args, "model.path") == f"out/models/kd-start-{digest}"
    r, args = rows("kd_jsd", KD_ADAPTER="/nowhere")   # a KD-loss row starts from the pruned base: no adapter needed
    assert r.returncode == 0, r.stderr


def test_rows_that_do_not_start_from_the_kd_student_need_no_adapter(rows, tmp_path):
    # PPO on the teacher, DGPO without cold start, a finished row and `start` itself run without one
    r, args = rows("teacher_ppo", KD_ADAPTER="")
    assert r.returncode == 0, r.stderr
    assert _value(args, "model.path") == "out/runs/factbook-teacher-sft/checkpoints/last"
    r, args = rows("dgpo_no_cold_start", KD_ADAPTER="")
    assert r.returncode == 0, r.stderr
    assert _value(args, "model.path") == "out/models/smollm2-135m-24l"
    done = tmp_path / "out" / "runs" / "rl-dgpo-s0"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    r, args = rows("dgpo", KD_ADAPTER="")
    assert r.returncode == 0 and not args, r.stderr   # done: skipped, not refused
    start = subprocess.run(["bash", str(tmp_path / "bench" / "factbook_rows.sh"), "start"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHON": str(tmp_path / "py"), "CALLS": str(tmp_path / "calls.log"),
                                "KD_ADAPTER": "", "SMOL_GGUF": "smol.gguf"})
    assert start.returncode == 0, start.stderr
    assert "no KD start: the rows that start from it will stop" in start.stderr
    assert not any("merge" in line for line in (tmp_path / "calls.log").read_text().splitlines())
    table1 = tmp_path / "out" / "kd-start-adapter" / "dgpo_edge" / "bundle" / "shipped" / "adapter"
    table1.mkdir(parents=True)
    (table1 / "adapter_model.safetensors").write_bytes(b"table 1")
    start = subprocess.run(["bash", str(tmp_path / "bench" / "factbook_rows.sh"), "start"],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHON": str(tmp_path / "py"), "CALLS": str(tmp_path / "calls.log"),
                                "KD_ADAPTER": "", "SMOL_GGUF": "smol.gguf"})
    digest = hashlib.sha256(b"table 1").hexdigest()[:12]
    assert start.returncode == 0 and f"KD start: out/models/kd-start-{digest} (KD_ADAPTER=out/kd-start-adapter/" \
        in start.stdout, start.stderr


def test_the_name_stage_prints_the_name_alone(tmp_path):
    # the lanes read its output: a CDPATH that makes cd print its folder must not get in
    (tmp_path / "bench").mkdir()
    shutil.copy(ROOT / "bench" / "factbook_rows.sh", tmp_path / "bench")
    r = subprocess.run(["bash", "bench/factbook_rows.sh", "name", "dgpo", "1"],   # relative, as the lanes call it
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "CDPATH": ".:"})
    assert r.returncode == 0 and r.stdout == "rl-dgpo-s1\n", (r.stdout, r.stderr)


def test_the_rows_default_depth_is_the_shipped_adapters():
    # the default KD start (Table 1's) and the shipped adapter it became are 24-layer adapters;
    # merging one over a base of another depth is refused
    import re

    script = (ROOT / "bench" / "factbook_rows.sh").read_text()
    (default,) = re.findall(r"LAYERS=\$\{STUDENT_LAYERS:-(\d+)\}", script)
    shipped = json.loads((ROOT / "dgpo_edge" / "bundle" / "shipped" / "student.json").read_text())
    assert int(default) == len(shipped["layers"])
