"""bench/worlds_loo.sh's control flow, with PYTHON set to a recorder instead of an interpreter: which
stages a lane skips, which evaluations it runs (MIX_DEV, EVAL_WORLDS, EVAL_TEACHER) and where its log
goes (one per held-out world, MIX_TAG and depth). The stages themselves are tested with the real trainers
elsewhere (tests/test_worlds_mix.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = "factbook=0.5 notes=0.3 notes@2=0.2"


@pytest.fixture
def work(tmp_path):
    """A work dir whose mixture, worlds, teacher and KD runs exist (so those stages are skipped)."""
    out = tmp_path / "out"
    for folder in ("worlds-mix/all", "worlds/notes-s1"):
        (out / folder).mkdir(parents=True)
        (out / folder / "manifest.json").write_text("{}")
    for run in ("worlds-teacher-sft-all", "worlds-kd-all", "worlds-kd-all-30l"):
        (out / "runs" / run).mkdir(parents=True)
        (out / "runs" / run / "summary.json").write_text("{}")
    recorder = tmp_path / "python"
    recorder.write_text(f"#!/bin/sh\necho \"$*\" >> {shlex.quote(str(tmp_path / 'calls.log'))}\n")
    recorder.chmod(0o755)
    return tmp_path


def run_lane(work: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHON": str(work / "python"), "WORK_DIR": str(work / "out"), "WEIGHTS": WEIGHTS,
               "DGPO_MINUTES": "0", "PREP_STUDENT": "0", "COMMIT": "abc1234", "GPUS": "", **env}
    return subprocess.run(["bash", str(ROOT / "bench" / "worlds_loo.sh"), "none"], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def lane(work: Path, **env: str) -> list[str]:
    run_lane(work, **env).check_returncode()
    calls = (work / "calls.log").read_text().splitlines()
    (work / "calls.log").unlink()
    return calls


def evaluations(calls: list[str]) -> list[tuple[str, str, str]]:
    """(model name, data folder, splits) of each bench/factbook_eval.py call."""
    out = []
    for call in calls:
        if "factbook_eval.py" in call:
            args = call.split()
            value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
            out.append((value("--model").split("=")[0], Path(value("--data")).name, value("--splits")))
    return out


def test_a_lane_scores_kd_and_teacher_on_every_world_and_the_unseen_notes(work):
    calls = lane(work)
    assert not any(" train " in c for c in calls)   # the finished stages are skipped
    assert evaluations(calls) == [(m, w, "test") for m in ("kd@all", "teacher@all")
                                  for w in ("notes-s1", "factbook", "notes")]
    assert "worlds_results.py" in calls[-1]
    assert (work / "out" / "logs" / "worlds-lane-none.log").is_file()


def test_mix_dev_eval_worlds_and_eval_teacher_narrow_what_is_scored(work):
    calls = lane(work, MIX_DEV="1", EVAL_WORLDS="factbook", EVAL_TEACHER="0", STUDENT_LAYERS="30")
    assert evaluations(calls) == [("kd-30l@all", "all", "dev"), ("kd-30l@all", "notes-s1", "test"),
                                  ("kd-30l@all", "factbook", "test")]
    dev = next(c for c in calls if "--splits dev" in c)
    assert "worlds-eval/mixture-all.jsonl" in dev
    assert (work / "out" / "logs" / "worlds-lane-none-30l.log").is_file()   # its own log beside the 15-layer lane's


def test_worlds_depths_runs_one_lane_per_depth_and_the_teacher_once(work):
    environ = {**os.environ, "PYTHON": str(work / "python"), "WORK_DIR": str(work / "out"), "WEIGHTS": WEIGHTS,
               "PREP_STUDENT": "0", "COMMIT": "abc1234", "GPUS": "", "RESULTS": str(work / "worlds.json")}
    subprocess.run(["bash", str(ROOT / "bench" / "worlds_depths.sh"), "15", "30"], check=True, env=environ,
                   cwd=ROOT, capture_output=True, timeout=60)
    calls = (work / "calls.log").read_text().splitlines()
    scored = sorted(evaluations(calls))
    assert scored == sorted((m, w, "dev" if w == "all" else "test") for m in ("kd@all", "kd-30l@all", "teacher@all")
                            for w in ("all", "notes-s1", "factbook", "notes"))
    # collected once, after both lanes, into RESULTS
    assert [c for c in calls if "worlds_results.py" in c] == [calls[-1]]
    assert calls[-1].endswith(f"--out {work / 'worlds.json'}")


def test_worlds_depths_defaults_to_the_shipped_mixture(work):
    """Without WEIGHTS, the mixture is bench/worlds_weights.sh's (which bench/lease/prepare.sh builds too)."""
    environ = {**os.environ, "PYTHON": str(work / "python"), "WORK_DIR": str(work / "out"), "PREP_STUDENT": "0",
               "COMMIT": "abc1234", "GPUS": "", "RESULTS": str(work / "worlds.json")}
    environ.pop("WEIGHTS", None)
    (work / "out" / "worlds-mix" / "all" / "manifest.json").unlink()   # so the lane mixes (and trains:
    shutil.rmtree(work / "out" / "runs")                                # runs of a mixture that is gone are refused)
    subprocess.run(["bash", str(ROOT / "bench" / "worlds_depths.sh"), "15"], check=True, env=environ,
                   cwd=ROOT, capture_output=True, timeout=60)
    shipped = (ROOT / "bench" / "worlds_weights.sh").read_text().split('SHIPPED_WEIGHTS="')[1].split('"')[0].split()
    mix = next(c for c in (work / "calls.log").read_text().splitlines() if " data mix " in c)
    assert [a for a in mix.split() if "=" in a and not a.startswith("-")] == shipped


def test_mix_tag_gives_an_experiment_its_own_mixture_runs_and_rows(work):
    """MIX_TAG=records beside the finished `all`: its own mixture folder, teacher, KD run and row names."""
    calls = lane(work, MIX_TAG="records")
    mix = next(c for c in calls if " data mix " in c)
    assert mix.endswith(f"--out {work / 'out' / 'worlds-mix' / 'all-records'} --keep")
    trained = [c for c in calls if " train " in c]
    assert [c.split()[3] for c in trained] == ["sft", "kd"]
    assert f"run.out_dir={work / 'out' / 'runs' / 'worlds-teacher-sft-all-records'}" in trained[0]
    assert f"run.out_dir={work / 'out' / 'runs' / 'worlds-kd-all-records'}" in trained[1]
    assert {name for name, _, _ in evaluations(calls)} == {"kd@all-records", "teacher@all-records"}
    # its own log, so that the untagged lane of the same held-out world can run beside it
    assert (work / "out" / "logs" / "worlds-lane-none-records.log").is_file()
    assert not (work / "out" / "logs" / "worlds-lane-none.log").exists()


def test_runs_of_a_mixture_that_is_gone_are_refused_before_anything_runs(work):
    """The mixture removed (say, to mix it from other WEIGHTS) while its runs stay: they would be
    skipped as done and scored as if trained on the new mixture."""
    (work / "out" / "worlds-mix" / "all" / "manifest.json").unlink()
    done = run_lane(work)
    assert done.returncode == 2
    assert "worlds-teacher-sft-all" in done.stderr and "worlds-kd-all-30l" in done.stderr
    assert "MIX_TAG" in done.stderr
    assert not (work / "calls.log").exists()   # nothing mixed, trained or scored


def test_rows_of_a_mixture_that_is_gone_are_refused_too(work):
    """Its runs removed as well, but its evaluation rows left: a rerun would skip those evaluations."""
    out = work / "out"
    (out / "worlds-mix" / "all" / "manifest.json").unlink()
    shutil.rmtree(out / "runs")
    (out / "worlds-eval").mkdir()
    rows = out / "worlds-eval" / "notes.jsonl"
    rows.write_text('{"method": "kd@all-records", "split": "test"}\n')   # another mixture's row: no matter
    assert run_lane(work).returncode == 0
    rows.write_text('{"method": "kd-30l@all", "split": "test"}\n')
    done = run_lane(work)
    assert done.returncode == 2 and str(rows) in done.stderr


@pytest.mark.parametrize("tag", ["a b", "Records", "24l"])
def test_a_mix_tag_with_other_characters_or_a_depths_name_is_refused(work, tag):
    # 24l: worlds-kd-all-24l would be both the 24-layer run of `all` and the 15-layer one of `all-24l`
    done = run_lane(work, MIX_TAG=tag)
    assert done.returncode == 2 and "MIX_TAG" in done.stderr


@pytest.fixture
def adapter(tmp_path):
    folder = tmp_path / "shipped-adapter"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"lora weights")
    (folder / "adapter_config.json").write_text("{}")
    return folder


def test_kd_adapter_and_dgpo_variants_train_the_adapter_side_by_side(work, adapter):
    """KD_ADAPTER: no KD run, the adapter merged once for the evaluations; DGPO_START=adapter: DGPO
    trains that adapter (LoRA over the pruned base); DGPO_VARIANTS: one run per variant with its own
    overrides, each best checkpoint scored and (PACK=1) its adapter copied where a lease returns it."""
    out = work / "out"
    done = out / "runs" / "worlds-dgpo-lora-all-24l+slow"     # one variant finished already
    (done / "checkpoints" / "best" / "adapter").mkdir(parents=True)
    (done / "checkpoints" / "best" / "adapter" / "adapter_model.safetensors").write_bytes(b"rl")
    (done / "summary.json").write_text("{}")
    calls = lane(work, KD_ADAPTER=str(adapter), DGPO_START="adapter", DGPO_VARIANTS="slow fast",
                 VARIANT_slow="optim.lr=5e-5", VARIANT_fast="optim.lr=2e-4 ppo.micro_batch=16",
                 DGPO_MINUTES="5", STUDENT_LAYERS="24", PACK="1", PACK_DIR=str(work / "pack"),
                 EVAL_WORLDS="factbook")
    student = out / "models" / "smollm2-135m-24l"
    digest = __import__("hashlib").sha256(b"lora weights").hexdigest()[:12]
    merged = out / "models" / f"kd-start-{digest}"
    assert not any(" train kd " in c for c in calls)
    assert [c for c in calls if " model merge " in c] == [
        f"-m dgpo_edge model merge {student} --adapter {adapter} --out {merged}"]
    trained = [c.split() for c in calls if " train dgpo " in c]
    assert len(trained) == 1                                   # the finished variant is skipped
    args = trained[0]
    assert f"run.out_dir={out / 'runs' / 'worlds-dgpo-lora-all-24l+fast'}" in args
    assert f"model.path={student}" in args and f"lora.init_from={adapter}" in args
    assert args[-2:] == ["optim.lr=2e-4", "ppo.micro_batch=16"]   # the variant's overrides come last
    scored = evaluations(calls)
    assert ("kd-24l@all", "factbook", "test") in scored
    assert [m for m, w, _ in scored if m.startswith("dgpo")] == ["dgpo-lora-24l+slow@all"] * 2
    kd_eval = next(c for c in calls if "kd-24l@all=" in c)
    assert f"kd-24l@all={merged}" in kd_eval
    packed = work / "pack" / "worlds-dgpo-lora-all-24l+slow-adapter"
    assert (packed / "adapter_model.safetensors").read_bytes() == b"rl"
    assert not (work / "pack" / "worlds-kd-all-24l-adapter").exists()   # KD_ADAPTER was not trained here
    # a second run replaces what it packed (cp -r into an existing folder would nest a copy inside)
    lane(work, KD_ADAPTER=str(adapter), DGPO_START="adapter", DGPO_VARIANTS="slow", VARIANT_slow="optim.lr=5e-5",
         DGPO_MINUTES="5", STUDENT_LAYERS="24", PACK="1", PACK_DIR=str(work / "pack"), EVAL_WORLDS="factbook")
    assert sorted(p.name for p in packed.iterdir()) == ["adapter_model.safetensors"]


def test_a_deadline_that_has_passed_starts_no_dgpo(work):
    calls = lane(work, DGPO_MINUTES="10", DEADLINE="1")
    assert not any(" train dgpo " in c for c in calls)


@pytest.mark.parametrize("env, needle", [
    ({"DGPO_VARIANTS": "lr1"}, "VARIANT_lr1"),
    ({"DGPO_VARIANTS": "Lr1", "VARIANT_Lr1": "optim.lr=1"}, "DGPO_VARIANTS"),
    ({"DGPO_START": "lora"}, "DGPO_START"),
    ({"KD_ADAPTER": "/nonexistent/adapter"}, "KD_ADAPTER"),
    ({"DGPO_MINUTES": "0.5"}, "DGPO_MINUTES"),
    ({"DEADLINE": "12:00"}, "DEADLINE"),
])
def test_bad_dgpo_settings_are_refused_before_anything_runs(work, env, needle):
    done = run_lane(work, **env)
    assert done.returncode == 2 and needle in done.stderr
    assert not (work / "calls.log").exists()


def test_a_dgpo_variants_run_of_a_mixture_that_is_gone_is_refused(work):
    out = work / "out"
    (out / "worlds-mix" / "all" / "manifest.json").unlink()
    shutil.rmtree(out / "runs")
    (out / "runs" / "worlds-dgpo-lora-all-24l+fast").mkdir(parents=True)
    done = run_lane(work)
    assert done.returncode == 2 and "worlds-dgpo-lora-all-24l+fast" in done.stderr


def test_a_rerun_from_another_kd_student_is_refused(work, adapter):
    """The KD rows and DGPO runs name the mixture and depth, not the KD student: a lane that trained
    its KD student, rerun with KD_ADAPTER (or the other way round), would skip them as done."""
    out = work / "out"
    (out / "worlds-eval").mkdir()
    rows = out / "worlds-eval" / "factbook.jsonl"
    rows.write_text(f'{{"method": "kd@all", "split": "test", "model": "{out}/runs/worlds-kd-all/checkpoints/best"}}\n')
    assert run_lane(work).returncode == 0                       # the same KD student: fine
    done = run_lane(work, KD_ADAPTER=str(adapter))
    assert done.returncode == 2 and str(rows) in done.stderr and "another KD student" in done.stderr
    rows.unlink()
    dgpo = out / "runs" / "worlds-dgpo-lora-all+lr1"
    dgpo.mkdir(parents=True)
    (dgpo / "config.yaml").write_text(f"model:\n  path: {out}/models/smollm2-135m\nlora:\n  init_from: /elsewhere\n")
    done = run_lane(work, KD_ADAPTER=str(adapter))
    assert done.returncode == 2 and str(dgpo) in done.stderr
    (dgpo / "config.yaml").write_text(f"model:\n  path: {out}/models/smollm2-135m\nlora:\n  init_from: {adapter}\n")
    assert run_lane(work, KD_ADAPTER=str(adapter)).returncode == 0   # its own start: resumed, not refused
