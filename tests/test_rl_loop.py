"""`train ppo | dgpo | grpo` end to end on CPU with tiny real models (train/rl/loop.py).

The toy task is the rollout tests' one: a BM25 corpus of five invented
countries and one question ("What is the capital of Freedonia"). The student
is the memorizer with its logits scaled so that sampling at T = 0.5 repeats
its episode 10% of the time (other right answers bring the sampled EM to
0.25-0.4; greedy is always right); the teacher is the same model trained further until it is
confident. Every part is real: rollouts search the real store, rewards are
exact match, models are transformers Llamas over SmolLM2's tokenizer.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import test_rollout_support as support  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402
from cli_helpers import assert_one_line_error, invoke  # noqa: E402
from train_helpers import ctrl_c, ctrl_c_after, ctrl_c_in_optimizer_step, holds_line, interrupted  # noqa: E402

from dgpo_edge.train.rl.loop import run_rl  # noqa: E402
from dgpo_edge.train.rl.config import load_rl_config  # noqa: E402
from dgpo_edge.transcript import encoder_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUESTION, GOLD = support.EPISODES[0][0], support.EPISODES[0][1]
TIMING = {"elapsed_s", "peak_mem_gb", "rollout_tokens_per_s"}


def _episode(tokenizer, retriever):
    """(ids [1, L], positions whose next token is generated [1, L], those next tokens [N])."""
    tt = support.episode_transcripts(tokenizer, retriever)[0].tokenize(encoder_for(tokenizer))
    ids = torch.tensor([tt.ids])
    where = torch.tensor([tt.mask[1:] + [0]], dtype=torch.bool)
    return ids, where, ids[:, 1:][where[:, :-1]]


def _confident(model, tokenizer, retriever):
    """The memorizer trained on its episode until the loss is small: sampling agrees with greedy."""
    model = copy.deepcopy(model)
    ids, where, targets = _episode(tokenizer, retriever)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        loss = torch.nn.functional.cross_entropy(model.lm_head(model.model(input_ids=ids).last_hidden_state[where]),
                                                 targets)
        if loss.item() < 0.02:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def _calibrated(model, tokenizer, retriever, temperature: float = 0.5, target: float = 0.1):
    """The memorizer with its logits scaled so that sampling at `temperature` reproduces its episode
    with probability `target`.

    The memorizer stops training once greedy is right, so how often sampling
    succeeds depends on the machine's floating point (0 to 0.5 seen across CPU
    kernels). Scaling the final norm scales every logit (argmax unchanged),
    which pins the starting reward and so the pace of learning.
    """
    model = copy.deepcopy(model)
    ids, where, targets = _episode(tokenizer, retriever)
    with torch.no_grad():
        logits = model.lm_head(model.model(input_ids=ids).last_hidden_state[where]).double()

    def logp(scale: float) -> float:
        return float(torch.log_softmax(logits * scale / temperature, -1).gather(1, targets[:, None]).sum())

    lo, hi = 1e-3, 1e3               # log p(episode) rises with the scale while every target is the argmax
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if logp(mid) < math.log(target) else (lo, mid)
    with torch.no_grad():
        model.model.norm.weight.mul_(math.sqrt(lo * hi))
    return model


@pytest.fixture()
def cpu_path(monkeypatch):
    """The CPU path CI runs, also on a GPU machine: CUDA reported absent, and accelerate's per-process
    state (whose device an earlier test in this process may have set to cuda) dropped before and after."""
    from accelerate.state import AcceleratorState

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="module")
def toy(request, tmp_path_factory):
    """Folders: student, teacher, train.jsonl (the question 32 times), dev.jsonl, corpus.jsonl."""
    tok = support.smol_tok_fixture(request, tmp_path_factory)
    root = tmp_path_factory.mktemp("rl-toy")
    retriever = support.bm25_retriever(root)
    student = _calibrated(support.memorized_model(tok, retriever, support.cache_dir(request, tmp_path_factory,
                                                                                    "dgpo-rollout-models")),
                          tok, retriever)
    teacher = _confident(student, tok, retriever)
    retriever.close()
    for name, model in (("student", student), ("teacher", teacher)):
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    row = {"question": QUESTION, "golden_answers": [GOLD]}
    (root / "train.jsonl").write_text("".join(json.dumps({"id": f"q{i}", **row}) + "\n" for i in range(32)))
    (root / "dev.jsonl").write_text(json.dumps({"id": "d0", **row}) + "\n")
    (root / "corpus.jsonl").write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n"
                                               for p in support.CORPUS))
    return root


def write_rl_config(toy: Path, out: Path, **sections) -> Path:
    """8 rollouts a step at T = 0.5, one search, short turns; `sections` override."""
    config = {"run": {"out_dir": str(out), "precision": "fp32", "seed": 0},
              "model": {"path": str(toy / "student")},
              "data": {"train": str(toy / "train.jsonl"), "retriever": str(toy / "corpus.jsonl")},
              "rollout": {"prompts_per_step": 8, "batch_size": 32, "temperature": 0.5},
              "protocol": {"max_turn_tokens": 40, "max_searches": 1},
              "ppo": {"mini_batch": 4, "micro_batch": 4},
              "teacher": {"path": str(toy / "teacher"), "beta": 0.01},
              "optim": {"steps": 3, "lr": 3e-4, "critic_lr": 1e-3, "warmup_ratio": 0.0},
              "log": {"tensorboard": False, "progress": False}}
    for name, values in sections.items():
        config.setdefault(name, {}).update(values) if isinstance(values, dict) else config.__setitem__(name, values)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rows(run: Path, drop_timing: bool = True) -> list[dict]:
    with open(run / "metrics.csv", newline="") as f:
        out = list(csv.DictReader(f))
    return [{k: v for k, v in r.items() if not (drop_timing and (k in TIMING or k.startswith("time_")))}
            for r in out]


def test_dgpo_raises_the_reward(toy, tmp_path):
    out = tmp_path / "dgpo"
    cfg = load_rl_config("dgpo", write_rl_config(toy, out, rollout={"prompts_per_step": 32},
                                                 ppo={"mini_batch": 16, "micro_batch": 16}, optim={"steps": 8}))
    summary = run_rl(cfg)
    assert summary["steps"] == 8 and summary["rollouts"] == 8 * 32
    em = [float(r["em"]) for r in rows(out)]
    first = rows(out)[0]
    assert float(first["teacher_share"]) == pytest.approx(1 - em[0])      # the failed rollouts, only them
    assert math.isfinite(float(first["kl_teacher"])) and float(first["kl_teacher"]) > 0
    # Each step's EM is a mean of 32 samples (standard error ~0.09), so compare window means. With torch's
    # default, AVX2 and AVX-512 kernels (ATEN_CPU_CAPABILITY) the last three steps beat the first two by
    # 0.26-0.44; a run that does not learn stays near 0.
    assert sum(em[-3:]) / 3 >= sum(em[:2]) / 2 + 0.15, em


def test_ppo_trains_every_parameter_of_actor_and_critic(toy, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "ppo"
    summary = run_rl(load_rl_config("ppo", write_rl_config(toy, out, optim={"steps": 2, "lr": 1e-3})))
    assert summary["algorithm"] == "ppo" and summary["steps"] == 2
    before = load_file(toy / "student" / "model.safetensors")
    after = load_file(out / "checkpoints" / "last" / "model.safetensors")
    assert all(not torch.equal(before[k], after[k]) for k in before)
    critic = load_file(out / "checkpoints" / "last" / "state" / "model_1.safetensors")
    assert critic["head.weight"].abs().sum() > 0          # the zero-initialised value head learned
    r = rows(out)[-1]
    assert r["teacher_share"] == "0.0" and r["kl_teacher"] == "nan"   # PPO: no teacher term
    assert float(r["value_loss"]) >= 0 and 0 <= float(r["clip_frac"]) <= 1
    for key in ("time_rollout_s", "time_logp_s", "time_critic_s", "time_update_s", "time_step_s"):
        assert float(rows(out, drop_timing=False)[-1][key]) > 0


def test_grpo_uses_groups_and_no_critic(toy, tmp_path):
    out = tmp_path / "grpo"
    cfg = load_rl_config("grpo", write_rl_config(toy, out, rollout={"prompts_per_step": 2, "samples_per_prompt": 4},
                                                 optim={"steps": 2}, teacher={"path": ""}))
    assert not cfg.uses_critic and not cfg.uses_teacher
    summary = run_rl(cfg)
    assert summary["rollouts"] == 2 * 2 * 4
    r = rows(out, drop_timing=False)[-1]
    assert r["value_loss"] == "" and r["time_critic_s"] == ""       # no critic at all
    assert not (out / "checkpoints" / "last" / "state" / "model_1.safetensors").exists()


def test_grpo_with_a_teacher_is_dgpo_with_grpo(toy, tmp_path):
    out = tmp_path / "grpo-teacher"
    cfg = load_rl_config("grpo", write_rl_config(toy, out, rollout={"prompts_per_step": 2, "samples_per_prompt": 4},
                                                 optim={"steps": 1}, teacher={"beta": 0.1}))
    assert cfg.uses_teacher and not cfg.uses_critic
    run_rl(cfg)
    r = rows(out)[0]
    failed = 1 - float(r["em"])
    assert float(r["teacher_share"]) == pytest.approx(failed)
    if failed:
        assert float(r["reward"]) < float(r["em"]) and float(r["kl_teacher"]) > 0


@pytest.mark.parametrize("teacher", [{"estimator": "reverse_full"}, {"estimator": "k3", "placement": "loss"},
                                     {"apply_to": "all"}])
def test_teacher_term_variants_run(toy, tmp_path, teacher):
    out = tmp_path / "variant"
    run_rl(load_rl_config("dgpo", write_rl_config(toy, out, optim={"steps": 1}, teacher=teacher)))
    r = rows(out)[0]
    if teacher.get("apply_to") == "all":
        assert r["teacher_share"] == "1.0"
    if teacher.get("placement") == "loss":   # the term is in the loss: the reward is the plain score
        assert float(r["reward"]) == pytest.approx(float(r["em"]))
    else:
        assert float(r["reward"]) < float(r["em"])
    assert float(r["kl_teacher"]) >= 0


def test_resume_after_kill_9_logs_the_same_metrics(toy, tmp_path):
    steps = {"optim": {"steps": 4}, "log": {"save_every": 1}}
    whole = tmp_path / "whole"
    run_rl(load_rl_config("dgpo", write_rl_config(toy, whole, **steps)))
    killed = tmp_path / "killed"
    config = write_rl_config(toy, killed, **steps)
    # The same thread count as this process: summation order then matches, so counts at a threshold
    # (clip fractions) do not flip on a last-bit difference.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "dgpo_edge", "train", "dgpo", "--config", str(config)],
                            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (killed / "metrics.csv").is_file() and len(rows(killed)) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(rows(killed))
    assert 2 <= done < 4, "the run should have been killed mid-way"
    summary = run_rl(load_rl_config("dgpo", config))                   # resumes from checkpoints/last
    assert summary["steps"] == 4
    assert_same_metrics(rows(killed), rows(whole))


def _interrupted(config: Path, **kw) -> str:
    """A DGPO run that must stop on Ctrl-C; returns its line."""
    return interrupted(lambda: run_rl(load_rl_config("dgpo", config), **kw))


def _evaluations(run: Path) -> list[dict]:
    with open(run / "eval.csv", newline="") as f:
        return list(csv.DictReader(f))


def _best(run: Path) -> tuple:
    summary = json.loads((run / "summary.json").read_text())
    return summary["best"], summary["best_step"]


def test_ctrl_c_saves_the_last_whole_step_and_the_resumed_run_logs_the_same_metrics(toy, tmp_path, monkeypatch,
                                                                                     capsys):
    """Ctrl-C saved nothing since the last checkpoint (log.save_minutes: 10 by default). Now, after a
    step, inside its update (the step is finished first, its save included), inside its rollouts (the
    step before, saved already here) or inside its evaluation (stopped at once), checkpoints/last
    holds the last whole step, and the resumed run logs the uninterrupted run's metrics and
    evaluations. (A Ctrl-C inside step 2's update stopped the run before step 2's evaluation, which the
    resumed run, starting at step 3, never made; then the step's evaluation was made before stopping,
    however long it took.) A step whose evaluation a Ctrl-C stopped or left is saved before it, and the
    resumed run evaluates it first, the last step's too."""
    from dgpo_edge.train.rl.loop import RLTrainer

    steps = {"optim": {"steps": 4}, "data": {"dev": str(toy / "dev.jsonl")}, "eval": {"every": 2}}
    whole = tmp_path / "whole"
    run_rl(load_rl_config("dgpo", write_rl_config(toy, whole, **steps)))
    assert "train dgpo: step 1/4, reward " in capsys.readouterr().err   # progress lines: stderr is no terminal
    run = tmp_path / "stopped"
    config = write_rl_config(toy, run, **steps)

    assert _interrupted(config, on_step=ctrl_c_after(1)) == holds_line(run, 1)
    with ctrl_c_in_optimizer_step(monkeypatch, at=1):   # step 2's first optimizer step: its evaluation left
        assert _interrupted(config) == holds_line(run, 2, eval_pending=True)
    assert not (run / "eval.csv").exists()
    real_rollouts = RLTrainer._rollouts
    with monkeypatch.context() as m:   # step 3's rollouts, once the resumed run has evaluated step 2
        m.setattr(RLTrainer, "_rollouts", lambda self, step: (step == 2 and ctrl_c()) or real_rollouts(self, step))
        assert _interrupted(config) == holds_line(run, 2)
    assert [r["step"] for r in _evaluations(run)] == ["2"]
    real_decoder = RLTrainer._eval_decoder
    with monkeypatch.context() as m:   # the evaluation of step 4, the last
        m.setattr(RLTrainer, "_eval_decoder", lambda self: (self.state.step == 4 and ctrl_c()) or real_decoder(self))
        assert _interrupted(config) == holds_line(run, 4, eval_pending=True)
    assert [r["step"] for r in _evaluations(run)] == ["2"]
    assert run_rl(load_rl_config("dgpo", config))["steps"] == 4
    assert_same_metrics(rows(run), rows(whole))
    assert _evaluations(run) == _evaluations(whole) and _best(run) == _best(whole)


def test_a_micro_batch_above_each_process_share_of_the_mini_batch_is_cut_to_it_and_said(toy, tmp_path, capsys):
    """ppo.micro_batch is per process and ppo.mini_batch over all of them: a micro-batch above each
    process's share was refused, so the shipped configs (mini 64, micro 32) stopped on 3 GPUs or more
    (8 processes: 8 each), where they ran before. Now the micro-batches are the share, said once (by the
    main process), and the no-gradient passes (ppo.forward_batch=0) keep the configured micro-batch."""
    from dgpo_edge.train.rl.loop import RLTrainer

    trainer = object.__new__(RLTrainer)   # the sizes alone: two processes cannot be had in this one
    trainer.config = load_rl_config("dgpo", write_rl_config(toy, tmp_path / "run"))   # mini 4, micro 4
    for rank in (0, 1):
        trainer.world, trainer.rank = 2, rank
        trainer._check_sizes()
        assert (trainer.micro_batch, trainer.forward_rows) == (2, 4)
    assert capsys.readouterr().out.splitlines() == [
        "ppo.micro_batch 4 is more than each process's 2 of ppo.mini_batch 4 over 2 processes: micro-batches of 2"]
    trainer.world, trainer.rank = 1, 0
    trainer._check_sizes()
    assert trainer.micro_batch == 4 and capsys.readouterr().out == ""


SAMPLED = ("em", "answered", "response_length", "searches", "invalid_rate", "teacher_share", "lr", "critic_lr")
# Fractions of tokens past a clip bound: float rounding can move a token across the bound, and the
# tokens of one response carry nearly the same value or ratio, so they cross it together.
AT_A_BOUND = ("clip_frac", "vf_clip_frac")


def close(key: str, got: str, want: str) -> bool:
    """Equal up to float rounding; for the clip fractions, up to ten tokens of a step's ~1,000 across
    a clip bound (runs cut to other widths use other attention kernel tilings, a ratio or value within
    rounding of its bound lands on either side, and its response's neighbouring tokens with it:
    vf_clip_frac 0.0047 against 0.00085, four tokens, was seen on CI)."""
    return float(got) == pytest.approx(float(want), rel=1e-4, abs=1e-2 if key in AT_A_BOUND else 1e-6)


def assert_same_metrics(got: list[dict], want: list[dict]) -> None:
    """What the sampled tokens decide must be equal; losses equal up to float rounding (the killed
    run is another process, which may pick other kernels)."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        assert {k: a[k] for k in SAMPLED} == {k: b[k] for k in SAMPLED}
        for key in a:
            if key not in SAMPLED and a[key] not in ("", "nan"):
                assert close(key, a[key], b[key]), key


def test_a_run_keeping_the_cache_between_turns_logs_the_same_metrics(toy, tmp_path):
    # rollout.reuse_cache reaches the engine and changes nothing the run computes (the toy searches,
    # so episodes have later turns; the fast engine on CPU).
    from dgpo_edge.train.rl.loop import RLTrainer

    runs = {}
    for reuse in (False, True):
        out = tmp_path / f"reuse-{reuse}"
        config = write_rl_config(toy, out, optim={"steps": 2}, rollout={"engine": "fast", "reuse_cache": reuse})
        assert RLTrainer(load_rl_config("dgpo", config)).rollout_config.reuse_cache is reuse
        run_rl(load_rl_config("dgpo", config))
        runs[reuse] = rows(out)
    assert float(runs[True][0]["searches"]) > 0
    assert_same_metrics(runs[True], runs[False])
    # on unless a config turns it off (measured faster on a GPU, docs/benchmarks.md)
    default = write_rl_config(toy, tmp_path / "default", optim={"steps": 1})
    assert RLTrainer(load_rl_config("dgpo", default)).rollout_config.reuse_cache is True


def test_collapse_stop_ends_the_run(toy, tmp_path):
    out = tmp_path / "collapse"
    # A hair-trigger watch: any step below the best one-step average stops the run.
    cfg = load_rl_config("ppo", write_rl_config(toy, out, optim={"steps": 12, "lr": 3e-3},
                                                collapse={"window": 1, "drop": 0.01, "min_best": 0.0, "stop": True}))
    summary = run_rl(cfg)
    assert summary["stopped"] and summary["steps"] < 12
    assert rows(out)[-1]["collapse"] == "1"
    assert (out / "checkpoints" / "last" / "trainer_state.json").is_file()


@pytest.mark.parametrize("lora", [{}, {"r": 4, "train_norms": True}])
def test_rollouts_from_the_bf16_copy_keep_the_ratio_exact(toy, tmp_path, lora):
    # rollout.weights=bf16_copy: episodes are decoded by a bf16 copy of the actor (LoRA merged),
    # refreshed after every optimizer step; old log-probs still come from the training weights, so
    # with one mini-batch per step the PPO ratio is 1 (approx_kl 0, nothing clipped).
    from dgpo_edge.train.rl.loop import RLTrainer

    out = tmp_path / "copy"
    cfg = load_rl_config("dgpo", write_rl_config(toy, out, rollout={"weights": "bf16_copy"},
                                                 ppo={"mini_batch": 8, "micro_batch": 8},
                                                 optim={"steps": 2, "lr": 1e-3}, lora=lora))
    trainer = RLTrainer(cfg)
    assert trainer.engine.model is trainer.rollout_copy.model is trainer.rollout_lm
    summary = trainer.train()
    assert summary["steps"] == 2
    for r in rows(out):
        assert abs(float(r["approx_kl"])) < 1e-5 and float(r["clip_frac"]) == 0.0
    got = trainer.rollout_copy.model.state_dict()
    from dgpo_edge.train.lora import is_lora, merged_state_dict
    want = merged_state_dict(trainer.lm) if is_lora(trainer.lm) else trainer.lm.state_dict()
    assert all(torch.equal(got[k], want[k].to(torch.bfloat16)) for k in got)   # synced after the last step
    assert any(not torch.equal(v.cpu(), load_student(toy)[k].to(torch.bfloat16)) for k, v in got.items())  # and trained


@pytest.mark.parametrize("eval_engine, eval_weights", [("auto", "auto"), ("plain", "auto"), ("auto", "training")])
def test_evaluations_decode_with_the_rollouts_copy_and_engine(toy, tmp_path, eval_engine, eval_weights):
    # The run's engine (graphs captured, over the bf16 copy synced after each step) serves the
    # evaluations too, unless eval.engine asks for another decoder than the rollouts use or
    # eval.weights for the training weights.
    from dgpo_edge.train.rl.loop import RLTrainer

    cfg = load_rl_config("ppo", write_rl_config(toy, tmp_path / "run", teacher={"path": ""},
                                                rollout={"weights": "bf16_copy", "engine": "fast"},
                                                eval={"every": 1, "at_start": True, "engine": eval_engine,
                                                      "weights": eval_weights},
                                                optim={"steps": 2, "lr": 1e-3}))
    trainer = RLTrainer(cfg)
    calls = []

    def spy(model, step, engine=None):
        calls.append((step, model, engine, {k: v.clone() for k, v in model.state_dict().items()}))
        return {"dev_em": 0.0}
    trainer.eval_fn = lambda: spy
    trainer.train()
    assert [c[0] for c in calls] == [0, 1, 2]
    on_copy = eval_engine == "auto" and eval_weights == "auto"
    for _, model, engine, weights in calls:
        if on_copy:
            assert model is trainer.rollout_copy.model and engine is trainer.engine
        else:
            assert model is trainer.lm and engine is None
    if on_copy:   # each evaluation saw the weights of its step, in bf16
        assert any(not torch.equal(calls[0][3][k], calls[2][3][k]) for k in calls[0][3])
        final = trainer.lm.state_dict()
        assert all(torch.equal(v, final[k].to(torch.bfloat16)) for k, v in calls[2][3].items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bf16 autocast, fast engine)")
def test_on_a_gpu_the_first_ratio_is_one_within_bf16_tolerance(toy, tmp_path):
    # The GPU path: bf16 autocast, the fast engine (CUDA graphs) decoding a bf16 copy. Old log-probs
    # and the first mini-batch's log-probs come from the same training weights, so the ratio is 1.
    from dgpo_edge.train.rl.loop import RLTrainer

    out = tmp_path / "gpu"
    cfg = load_rl_config("dgpo", write_rl_config(toy, out, run={"precision": "bf16"},
                                                 ppo={"mini_batch": 8, "micro_batch": 8},
                                                 optim={"steps": 2, "lr": 1e-3}))
    trainer = RLTrainer(cfg)
    assert trainer.rollout_copy is not None and trainer.engine.model is trainer.rollout_copy.model
    trainer.train()
    for r in rows(out):
        assert abs(float(r["approx_kl"])) < 1e-3 and float(r["clip_frac"]) == 0.0


def load_student(toy: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(toy / "student" / "model.safetensors")


def test_rollout_weights_default_to_the_training_weights_on_cpu(toy, tmp_path):
    from dgpo_edge.train.rl.loop import RLTrainer

    trainer = RLTrainer(load_rl_config("ppo", write_rl_config(toy, tmp_path / "plain", teacher={"path": ""})))
    assert trainer.rollout_copy is None and trainer.rollout_lm is trainer.lm
    assert trainer.engine.attention == "sdpa"
    trainer = RLTrainer(load_rl_config("ppo", write_rl_config(
        toy, tmp_path / "first", teacher={"path": ""}, rollout={"attention": "matmul", "fused_sampling": False})))
    assert trainer.engine.attention == "matmul"   # the engine as first written, for before/after benchmarks


def test_teacher_with_another_tokenizer_is_refused(toy, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "other-teacher"
    model = support.tiny_model("llama", 300)
    model.save_pretrained(other)
    qwen = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers" / "qwen2"
    if not qwen.is_dir():
        pytest.skip("needs ../shared/data/tokenizers/qwen2")
    AutoTokenizer.from_pretrained(qwen).save_pretrained(other)
    config = write_rl_config(toy, tmp_path / "run", teacher={"path": str(other)})
    assert_one_line_error(invoke("train", "dgpo", "--config", config), "same tokenizer")


@pytest.mark.parametrize("override, message", [
    ("teacher.path=", "teacher.path"),
    ("rollout.samples_per_prompt=1", None),
    ("ppo.mini_batch=3", "ppo.mini_batch"),
    ("ppo.micro_batch=8", "key 'ppo.micro_batch' (8) must be at most ppo.mini_batch (4)"),
    ("teacher.estimator=k2", "teacher.estimator"),
    ("ppo.gamma=1.5", "ppo.gamma"),
    ("rollout.max_turns=3", "unknown"),
    ("rollout.attention=flash", "must be one of"),
    ("head_rows=0", "head_rows"),
    ("teacher.threshold=0", "teacher.threshold"),
    ("teacher.threshold=1.5", "teacher.threshold"),
    ("collapse.min_best=2", "collapse.min_best"),
    ("ppo.pad_to_multiple=0", "ppo.pad_to_multiple"),
    ("ppo.forward_batch=-1", "ppo.forward_batch"),
])
def test_config_errors_exit_2_naming_the_key(toy, tmp_path, override, message):
    config = write_rl_config(toy, tmp_path / "run")
    command = "grpo" if override.startswith("rollout.samples") else "dgpo"
    assert_one_line_error(invoke("train", command, "--config", config, override), message or "samples_per_prompt")
    assert not (tmp_path / "run").exists()                       # nothing written


def test_a_dev_or_report_split_without_questions_is_refused_before_the_run(toy, tmp_path):
    config = write_rl_config(toy, tmp_path / "run")
    (tmp_path / "empty.jsonl").write_text("\n")
    for key in ("data.dev", "data.report"):
        overrides = [f"{key}={tmp_path / 'empty.jsonl'}"]
        assert_one_line_error(invoke("train", "ppo", "--config", config, *overrides), "empty.jsonl: empty file")
        assert not (tmp_path / "run").exists()
        # a limit of 0 is refused as a setting, naming its key (config.validate_seed_and_limits)
        overrides = [f"{key}={toy / 'dev.jsonl'}", f"{key}_limit=0"]
        assert_one_line_error(invoke("train", "ppo", "--config", config, *overrides), f"'{key}_limit' must be >= 1")
        assert not (tmp_path / "run").exists()


def test_yaml_algorithm_must_match_the_command(toy, tmp_path):
    config = write_rl_config(toy, tmp_path / "run", algorithm="ppo")
    assert_one_line_error(invoke("train", "dgpo", "--config", config), "train ppo")


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True])
def test_two_cpu_processes_split_the_rollouts(toy, tmp_path, compiled):
    # compiled: ppo.compile under DDP, as the paper config runs on 8 GPUs
    import socket

    from safetensors.torch import load_file

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp"
    config = write_rl_config(toy, out, optim={"steps": 2}, ppo={"mini_batch": 4, "micro_batch": 2, "compile": compiled})
    # The same thread count as this process: summation order then matches, so counts at a threshold
    # (clip fractions) do not flip on a last-bit difference.
    # CUDA hidden: on a GPU machine both ranks would take its first GPU, which NCCL refuses
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "TOKENIZERS_PARALLELISM": "false",
           "CUDA_VISIBLE_DEVICES": ""}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
              str(ROOT / "train" / "configs" / "accelerate-cpu-2proc.yaml"), "--main_process_port", str(port),
              "-m", "dgpo_edge", "train", "dgpo", "--config", str(config)]
    done = subprocess.run(launch, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ppo.compile found no" not in done.stdout                       # the DDP-wrapped layers were found
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["rollouts"] == 2 * 8      # 4 questions per process per step
    assert done.stdout.count("dgpo: 2 steps") == 1                         # one report, from rank 0
    assert len(rows(out)) == 2
    before = load_file(toy / "student" / "model.safetensors")
    after = load_file(out / "checkpoints" / "last" / "model.safetensors")
    assert all(not torch.equal(before[k], after[k]) for k in before)
    assert sorted(p.name for p in (out / "checkpoints/last/state").glob("random_states_*")) == \
        ["random_states_0.pkl", "random_states_1.pkl"]


def test_8bit_teacher_needs_bitsandbytes(toy, tmp_path):
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed: the refusal cannot be seen")
    config = write_rl_config(toy, tmp_path / "run", teacher={"load_in_8bit": True})
    assert_one_line_error(invoke("train", "dgpo", "--config", config), "bitsandbytes")


def test_head_rows_only_changes_the_pass_size():
    """Log-probs, entropies and full-vocabulary KL are the same whatever `head_rows` cuts them into."""
    from dgpo_edge.train.rl.models import PolicyHead, lm_full_vocab_kl

    student, teacher = support.tiny_model("llama", 97, seed=1), support.tiny_model("llama", 97, seed=2)
    ids = torch.randint(0, 97, (3, 20), generator=torch.Generator().manual_seed(0))
    attention = torch.ones_like(ids)
    mask = torch.zeros(3, 20)
    mask[:, 8:] = 1                                       # 12 generated tokens a row: 36 positions
    with torch.no_grad():
        whole = PolicyHead(student, rows=4096)(ids, attention, mask, 0.7, entropy=True)
        cut = PolicyHead(student, rows=5)(ids, attention, mask, 0.7, entropy=True)
    for a, b in zip(whole, cut):
        torch.testing.assert_close(a, b)
    assert bool((whole[0][mask.bool()] < 0).all()) and bool((whole[0][~mask.bool()] == 0).all())
    kl_whole = lm_full_vocab_kl(student, teacher, ids, attention, mask, "reverse", rows=4096)
    kl_cut = lm_full_vocab_kl(student, teacher, ids, attention, mask, "reverse", rows=7)
    torch.testing.assert_close(kl_whole, kl_cut)
    assert bool((kl_whole[mask.bool()] > 0).all())


def test_pass_sizes_and_rounded_widths_change_no_metric(toy, tmp_path):
    """ppo.forward_batch (rows per no-grad pass) and ppo.pad_to_multiple (widths rounded up, the
    extra columns masked out) are speed knobs: two DGPO steps log the same numbers with them."""
    runs = {}
    for name, ppo in (("plain", {}), ("knobs", {"forward_batch": 8, "pad_to_multiple": 16})):
        out = tmp_path / name
        run_rl(load_rl_config("dgpo", write_rl_config(toy, out, optim={"steps": 2}, ppo={"mini_batch": 4,
                                                                                        "micro_batch": 2, **ppo})))
        runs[name] = rows(out)
    for plain, knobs in zip(runs["plain"], runs["knobs"]):
        assert plain.keys() == knobs.keys()
        for key in plain:
            if plain[key] in ("", "nan") or key in ("lr", "critic_lr", "step"):
                assert plain[key] == knobs[key], key
            else:
                assert close(key, knobs[key], plain[key]), key


def test_compiled_layers_change_no_metric_and_compile_few_graphs(toy, tmp_path, monkeypatch, cpu_path):
    """ppo.compile (train/compiled_layers.py) is a speed knob: two DGPO steps log the same numbers
    up to float rounding, and the actor's, critic's and teacher's layers share a few graphs (a layer
    given a KV cache would make one graph per layer, past torch._dynamo's recompile limit)."""
    # cpu_path: on a GPU, eager runs compile graphs too (the fast engine's: 3 on an H200)
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()   # graphs another test compiled would be reused here and not counted
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", torch._dynamo.config.recompile_limit)
    runs, per_step = {}, []
    for name in ("eager", "compiled"):
        out = tmp_path / name
        before = counters["stats"]["unique_graphs"]
        run_rl(load_rl_config("dgpo", write_rl_config(toy, out, optim={"steps": 2},
                                                      ppo={"compile": name == "compiled"})),
               on_step=lambda step, row: per_step.append(counters["stats"]["unique_graphs"]))
        runs[name] = rows(out), counters["stats"]["unique_graphs"] - before
    (eager, eager_graphs), (compiled, graphs) = runs["eager"], runs["compiled"]
    assert eager_graphs == 0 and 0 < graphs <= 8, graphs
    # step 2 compiles nothing new: scoring runs in the update's (training) mode from step 1 on
    # (before, step 1 scored in the eval mode the models load in, and step 2 compiled a graph more)
    assert per_step[2] == per_step[3], per_step
    assert len(compiled) == len(eager) == 2
    for a, b in zip(compiled, eager):
        assert a.keys() == b.keys() and {k: a[k] for k in SAMPLED} == {k: b[k] for k in SAMPLED}
        for key in a:
            if a[key] in ("", "nan") or b[key] in ("", "nan"):
                assert a[key] == b[key], key          # a NaN from the compiled run alone fails here
            elif key in AT_A_BOUND:
                assert close(key, a[key], b[key]), key
            elif key not in SAMPLED:
                assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-3, abs=1e-5), key


def test_the_report_split_is_recorded_at_every_evaluation_and_never_chosen_by(toy, tmp_path):
    """data.report: each evaluation appends the split's detailed row (EM per type, per-question
    scores) to report.jsonl; eval.csv and the best checkpoint's metrics hold dev only; a resumed
    run keeps the rows of the steps it does not repeat."""
    out = tmp_path / "run"
    sections = {"data": {"dev": str(toy / "dev.jsonl"), "report": str(toy / "train.jsonl"), "report_limit": 4},
                "eval": {"every": 1, "at_start": True}, "log": {"save_every": 1}}
    run_rl(load_rl_config("ppo", write_rl_config(toy, out, optim={"steps": 2}, **sections)))
    report = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert [r["step"] for r in report] == [0, 1, 2]
    for r in report:
        assert r["split"] == str(toy / "train.jsonl") and r["n"] == 4 and len(r["scores"]) == 4
        assert r["em"] == sum(r["scores"]) / 4 and set(r["em_by_type"]) == {"?"} and "hit_ratio" in r
        # each question right or lost somewhere, in file order and counted by type
        assert len(r["outcomes"]) == 4 and r["outcomes"].count("right") == sum(r["scores"])
        # and what each was answered and searched: nothing where it gave no answer or did not search
        assert len(r["answers"]) == len(r["search_queries"]) == 4
        for o, answer, queries in zip(r["outcomes"], r["answers"], r["search_queries"]):
            assert answer == "" if o == "no_answer" else isinstance(answer, str)
            assert queries == [] if o == "no_search" else all(isinstance(q, str) for q in queries)
            assert queries or o not in ("not_found", "misread")
        assert sum(r["outcomes_by_type"]["?"].values()) == 4
    from dgpo_edge.train.models import load_lm
    actor, _ = load_lm(str(out / "checkpoints" / "last"))
    assert {r["params"] for r in report} == {sum(p.numel() for p in actor.parameters())}
    assert {r["dtype"] for r in report} == {"float32"}   # on a CPU the rollouts decode the training weights
    with open(out / "eval.csv", newline="") as f:
        header = next(csv.reader(f))
    assert all(k == "step" or k.startswith("dev_") for k in header)
    best = json.loads((out / "checkpoints" / "best" / "dgpo_edge.json").read_text())
    assert "_report" not in best["metrics"] and "scores" not in json.dumps(best["metrics"])
    run_rl(load_rl_config("ppo", write_rl_config(toy, out, optim={"steps": 3}, **sections)))   # resumes at 2
    assert [json.loads(line)["step"] for line in (out / "report.jsonl").read_text().splitlines()] == [0, 1, 2, 3]

    # bench/report_rows.py: the rows as table rows, once each; a folder without a report writes nothing
    table, script = tmp_path / "rows.jsonl", str(ROOT / "bench" / "report_rows.py")
    for _ in range(2):
        r = subprocess.run([sys.executable, script, str(out), "--out", str(table), "--step", "3", "--commit", "abc"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    (row,) = [json.loads(line) for line in table.read_text().splitlines()]
    assert (row["method"], row["split"], row["rl_steps"], row["commit"]) == ("rl3-run", "train", 3, "abc")
    assert row["scores"] == json.loads((out / "report.jsonl").read_text().splitlines()[-1])["scores"]
    r = subprocess.run([sys.executable, script, str(tmp_path), "--out", str(tmp_path / "none.jsonl")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no report.jsonl" in r.stderr and not (tmp_path / "none.jsonl").exists()


def test_rl_continues_a_saved_adapter(toy, tmp_path, cpu_path):
    # cpu_path: fp32 on the CPU (on a GPU the models would sit in CUDA memory, the reference in bf16)
    # lora.init_from: the actor is model.path (the base) + the saved adapter, training on; the critic
    # and the reference start from the same student, merged; checkpoints hold the continued adapter.
    from dgpo_edge.train.config import LoRASection
    from dgpo_edge.train.lora import apply_lora, merged_state_dict, save_adapter
    from dgpo_edge.train.models import load_checkpoint
    from dgpo_edge.train.rl.loop import RLTrainer

    start = load_checkpoint(toy / "student")[0]
    apply_lora(start, LoRASection(r=4, train_norms=True, save_dtype="f32"))
    with torch.no_grad():
        for name, param in start.named_parameters():
            if "lora_B" in name or name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.05)
    save_adapter(start, tmp_path / "adapter")
    student = merged_state_dict(start)

    out = tmp_path / "continued"
    cfg = load_rl_config("ppo", write_rl_config(toy, out, teacher={"path": ""}, ppo={"kl_ref": 0.01},
                                                lora={"init_from": str(tmp_path / "adapter")},
                                                optim={"steps": 1, "lr": 1e-3}))
    trainer = RLTrainer(cfg)
    actor = merged_state_dict(trainer.lm)
    assert all(torch.allclose(actor[k], v, atol=1e-6) for k, v in student.items())
    critic = trainer.critic.state_dict()
    body = {k.removeprefix("body."): v for k, v in critic.items()}
    shared = [k for k in student if k.removeprefix("model.") in body]
    assert shared and all(torch.allclose(body[k.removeprefix("model.")], student[k], atol=1e-6) for k in shared)
    reference = trainer.reference.state_dict()
    assert all(torch.allclose(reference[k].float(), v, atol=1e-6) for k, v in student.items())
    assert all(p.requires_grad for p in trainer.critic.parameters())   # the whole critic trains
    before = {k: v.clone() for k, v in trainer.critic.state_dict().items()}
    trainer.train()
    after = trainer.critic.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before if "layers.0.mlp" in k)
    saved = json.loads((out / "checkpoints" / "last" / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and (out / "checkpoints" / "last" / "adapter" / "norms.safetensors").is_file()


def test_the_rollout_time_is_split_into_engine_and_search(toy, tmp_path):
    # metrics.csv says where a rollout's time goes: the engine's calls, the searches, and (the
    # rest) host work between turns - what the RL speed work needs to see on a GPU.
    out = tmp_path / "timed"
    run_rl(load_rl_config("ppo", write_rl_config(toy, out, teacher={"path": ""}, optim={"steps": 2})))
    for r in rows(out, drop_timing=False):
        rollout, decode, search = (float(r[f"time_{k}_s"]) for k in ("rollout", "rollout_decode", "rollout_search"))
        assert 0 < decode <= rollout and 0 < search <= rollout - decode + 1e-3


def test_a_model_with_dropout_is_refused_before_training(toy, tmp_path):
    """Scoring and the update both run in training mode: dropout would make the ratio noise."""
    from dgpo_edge.errors import InputError

    out = tmp_path / "run"
    config = write_rl_config(toy, out, model={"random_init": {"attention_dropout": 0.1}})
    with pytest.raises(InputError, match=r"config.attention_dropout = 0.1"):
        run_rl(load_rl_config("ppo", config))
    assert not (out / "metrics.csv").exists()
    critic = tmp_path / "critic"   # a critic of its own (critic.path) is checked too, and named
    shutil.copytree(toy / "student", critic)
    settings = json.loads((critic / "config.json").read_text())
    (critic / "config.json").write_text(json.dumps({**settings, "attention_dropout": 0.2}))
    with pytest.raises(InputError, match=r"attention_dropout = 0.2") as info:
        run_rl(load_rl_config("ppo", write_rl_config(toy, tmp_path / "run2", critic={"path": str(critic)})))
    assert str(critic) in str(info.value)
