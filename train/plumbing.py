"""Run plumbing shared by every trainer (`train sft | kd`, `train ppo | dgpo | grpo`).

- **accelerator**: `make_accelerator` (one process, DDP, or DeepSpeed ZeRO - whatever
  `accelerate launch` set up), `zero_stage`, `whole_weights` (loading whole models under ZeRO-3),
  `fill_deepspeed_autos`, and the warmup-then-decay `lr_lambda`;
- **run directory and checkpoints**: `prepare_run_dir` (resolved config, resume from
  `checkpoints/last`, recovery from an interrupted swap) and `write_last` (model, tokenizer,
  accelerate state and trainer state, written atomically);
- **Ctrl-C**: `Interrupts` (a loop stopped by SIGINT saves its last whole step; `train tgo`'s loop
  over chunks of questions uses it too) and `TrainingInterrupted`;
- **metric sinks**: `Loggers` (metrics.csv / eval.csv, TensorBoard, W&B), `progress_bar` (the rich bar
  on a terminal, `PlainProgress` lines elsewhere) and `peak_memory_gb`.

Nothing here knows a loss or an algorithm: a trainer passes its config, its state as a dict and its
metric rows.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import math
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import aside, check_folder_path, check_holds_only, replace_dir, settle

from .config import resolved_stage, write_resolved


# --- accelerator and schedule -----------------------------------------------------------------

def make_accelerator(config: Any, *, deepspeed_plugins: dict | None = None, accumulate: int | None = None) -> Any:
    """An Accelerator honouring run.precision and optim.grad_accum (and any `accelerate launch` setup).

    `deepspeed_plugins` (name -> DeepSpeedPlugin) lets one DeepSpeed run hold several engines (the RL
    actor and critic); `accumulate` overrides optim.grad_accum (RL: micro-batches per mini-batch)."""
    import torch
    from accelerate import Accelerator

    precision = config.run.precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"
    # cpu=True without a GPU: processes started by `accelerate launch`/torchrun then join over gloo.
    # Not under a DeepSpeed launch: cpu=True would silently drop DeepSpeed, and DeepSpeed picks its
    # own device (DS_ACCELERATOR=cpu runs it on CPU, as the tests do).
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    # RL steps accumulate micro-batches themselves (no optim.grad_accum there).
    if accumulate is None:
        accumulate = getattr(config.optim, "grad_accum", 1)
    mixed = "bf16" if precision == "bf16" else "no"
    _forget_other_precision(mixed)
    return Accelerator(gradient_accumulation_steps=accumulate, cpu=not (torch.cuda.is_available() or deepspeed),
                       mixed_precision=mixed, deepspeed_plugins=deepspeed_plugins)


def _forget_other_precision(mixed: str) -> None:
    """accelerate keeps one AcceleratorState per process and refuses a second mixed precision, so a
    process that trains runs in turn (a notebook, a sweep, the tests) could not go from fp32 to
    bf16. The precision part is dropped; the process group (PartialState) is kept."""
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state and AcceleratorState().mixed_precision != mixed:
        AcceleratorState._reset_state(reset_partial_state=False)


def zero_stage(accelerator: Any) -> int | None:
    """The DeepSpeed ZeRO stage this run uses, or None without DeepSpeed."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return None if plugin is None else int(plugin.zero_stage)


@contextlib.contextmanager
def whole_weights(accelerator: Any):
    """Load models inside this block with all their weights on every rank, even under ZeRO-3.

    Once an Accelerator with a DeepSpeed plugin exists, transformers builds every model partitioned
    under ZeRO-3 (accelerate 1.15 ignores `zero3_init_flag: false` there), so a frozen teacher would
    have empty weights. Loading everything before the Accelerator would avoid that too, but the run
    would then learn only after the (slow) loads that ZeRO-3 refuses its config (`check_zero3`), and
    the loads need the Accelerator's device and precision anyway; so the switch is off for the loads
    instead. The student loaded here is partitioned by `prepare`, like any model under ZeRO-2/3.
    """
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()  # generate() reads it to keep ZeRO-3 ranks in step


def lr_lambda(total: int, warmup: int, schedule: str) -> Callable[[int], float]:
    """Multiplier of the base lr after `step` optimizer steps: linear warmup, then decay to 0."""
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress
    return f


def fill_deepspeed_autos(accelerator: Any, optim: Any, world: int) -> None:
    """Give DeepSpeed's "auto" batch settings their values (accelerate fills them only from a
    prepared DataLoader, and this trainer batches by itself)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    for key, value in (("train_micro_batch_size_per_gpu", optim.batch_size),
                       ("gradient_accumulation_steps", optim.grad_accum),
                       ("gradient_clipping", optim.grad_clip),
                       ("train_batch_size", optim.batch_size * optim.grad_accum * world)):
        if ds.get(key, "auto") == "auto":
            ds[key] = value


# --- run directories and checkpoints ----------------------------------------------------------

def write_last(acc: Any, ckpt: Path, lm: Any, tokenizer: Any, state: dict, provenance: dict, *,
               module: Any = None, states: dict | None = None) -> None:
    """checkpoints/last: the model in transformers format, `state/` (accelerate: every prepared
    model, optimizer, registered scheduler and the RNG) and trainer_state.json.

    `module` is the prepared module holding `lm` as `.lm`; pass it under DeepSpeed ZeRO-3, where
    `lm` itself holds only empty shards: its weights are then gathered (every rank must call this).
    `states` (name -> Accelerator) replaces `acc`'s state/ by state/<name> per accelerator: under
    DeepSpeed each engine (RL actor, critic) has its own Accelerator, which saves only its own models.
    Written into a temp dir and swapped in, so a crash leaves the previous `last` intact.
    """
    from .lora import save_weights

    tmp = ckpt / ".last.tmp"
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    acc.wait_for_everyone()
    for holder, folder in _state_dirs(acc, tmp / "state", states):
        with _quiet_logger("accelerate.utils.other"):  # "Removed shared tensor": tied embeddings, saved once
            holder.save_state(str(folder))
    state_dict = None if module is None else lm_state_dict(acc, module)  # every rank: ZeRO-3 gathers
    if acc.is_main_process:
        save_weights(lm, tmp, state_dict)  # a LoRA model: merged, with adapter/ beside
        tokenizer.save_pretrained(tmp)
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2) + "\n")
        (tmp / "dgpo_edge.json").write_text(json.dumps(provenance, indent=2) + "\n")
        _swap_in(tmp, ckpt / "last")
    acc.wait_for_everyone()


class SaveClock:
    """`log.save_minutes`: whether that long has passed since the last checkpoints/last, so a run
    without evaluations (data.dev unset) and without log.save_every still loses at most that much
    to a crash, whatever its step time. The main process's clock decides for all: each reading its
    own could disagree, and a process saving alone would wait forever at the save's barrier."""

    def __init__(self, minutes: float):
        self.seconds, self.clock = minutes * 60, time.monotonic
        self.last = self.clock()

    def due(self, acc: Any) -> bool:
        """Call on every process at every step (with several processes it is a broadcast)."""
        if not self.seconds:
            return False
        due = self.clock() - self.last >= self.seconds
        if acc.num_processes > 1:
            import torch
            from accelerate.utils import broadcast

            due = bool(broadcast(torch.tensor([int(due)], device=acc.device), from_process=0).item())
        return due

    def saved(self) -> None:
        """Count the next interval from now (a save, or the loop's start: loading is not training)."""
        self.last = self.clock()


def lm_state_dict(acc: Any, module: Any) -> dict | None:
    """Under DeepSpeed ZeRO-3, the full weights of `module.lm` (module: a prepared wrapper holding the
    LM as `.lm`), named as the LM names them, gathered from the shards: every rank must call this, and
    the result is complete on the main process (None on the others). Otherwise None: the LM's own
    weights are complete, and `save_pretrained` reading them itself keeps tied weights tied
    (ZeRO-2's `get_state_dict` clones them apart). With bf16 on, DeepSpeed trains - and so saves -
    bf16 weights."""
    if zero_stage(acc) != 3:
        return None
    full = acc.get_state_dict(module)  # None on the other ranks
    return None if full is None else {k.removeprefix("lm."): v for k, v in full.items()}


@contextlib.contextmanager
def _quiet_logger(name: str):
    """Raise one library logger to ERROR for the duration of a block."""
    import logging

    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# What a run writes into run.out_dir (config.yaml first); a folder holding anything else is not a run's.
RUN_FILES = frozenset({"config.yaml", "metrics.csv", "eval.csv", "report.jsonl", "summary.json", "checkpoints",
                       "tb", "wandb"})


def check_before_loading(config: Any) -> None:
    """What a run can check before any model loads, so that a mistake costs no loading time: the
    files of data.train, data.dev and data.report and their rows, run.out_dir (prepare_run_dir checks it again
    once the models are loaded, on every process together), and the models' paths."""
    from .data import check_trajectory_rows, require_data_files
    from .evaluation import check_questions

    require_data_files(config.data)
    if config.stage in ("sft", "kd"):   # trajectories; RL reads its questions before its models anyway
        check_trajectory_rows(config.data.train, config.data.limit)
    check_questions(config.data)
    check_run_dir(Path(config.run.out_dir), config.stage)
    check_model_paths(config)


def check_model_paths(config: Any) -> None:
    """Every model the run will load (student, tokenizer, KD's or DGPO's teacher, the critic) can be
    found, before the first loads (models.check_model_spec)."""
    from .models import check_model_spec

    m = config.model
    own_tokenizer = bool(m.tokenizer)   # else each model's tokenizer is read from its own path
    check_model_spec(m.path, "model.path", tokenizer=not own_tokenizer)
    if own_tokenizer:
        check_model_spec(m.tokenizer, "model.tokenizer", model=False)
    kd = getattr(config, "kd", None)
    if kd is not None and kd.teacher:
        check_model_spec(kd.teacher, "kd.teacher")
    if getattr(config, "uses_critic", False) and config.critic.path:
        check_model_spec(config.critic.path, "critic.path", tokenizer=not own_tokenizer)
    if getattr(config, "uses_teacher", False):
        check_model_spec(config.teacher.path, "teacher.path")


def check_run_dir(out: Path, stage: str | None = None) -> None:
    """Refuse a run.out_dir that is a file or lies under one, or a folder of anything but a training run:
    a run writes its config, metrics and checkpoints there, and replaces or removes the files of those names.
    With `stage`, a run of another command too (`train sft` into a KD run's folder): its checkpoint
    fits another model, and its config.yaml would be overwritten before that showed."""
    check_folder_path(out, "run.out_dir")
    check_holds_only(out, RUN_FILES, "a training run's", "give run.out_dir a folder of its own",
                     first=("config.yaml", "a run"), alone=("checkpoints",))
    previous = out / "config.yaml"
    other = resolved_stage(previous) if stage is not None and previous.is_file() else None
    if other is not None and other != stage:
        raise InputError(f"holds a `train {other}` run, and this is `train {stage}`: give run.out_dir a folder "
                         f"of its own", out)


def _settle_checkpoint(folder: Path) -> None:
    """Put back `.NAME.old` when a save of checkpoints/NAME was killed between its two renames
    (`settle`: by replace_dir's journal, one error line when that fails), else remove it once NAME is
    there. Without a journal it is what a dgpo-edge older than the journal left, and checkpoints/ is
    the run's own: a leftover `.best.old` would otherwise stop the run, hours in, at its next best."""
    settle(folder)
    old = aside(folder)
    if not folder.exists() and old.exists():
        os.replace(old, folder)
    elif folder.exists() and old.exists():
        shutil.rmtree(old)


def prepare_run_dir(acc: Any, config: Any, out: Path, *, states: dict | None = None) -> dict | None:
    """Create out_dir, recover from an interrupted swap, and - when `run.resume` and `checkpoints/last`
    exist - load the saved state (from state/<name> into each of `states`, as `write_last` saved it);
    then write the resolved config. Returns trainer_state or None."""
    check_run_dir(out, config.stage)   # on every process, so that all of them stop,
    acc.wait_for_everyone()   # and before the main process writes a file that another would see
    ckpt = out / "checkpoints"
    last = ckpt / "last"
    old = aside(last)
    resuming = config.run.resume and ((last / "trainer_state.json").is_file()
                                      or (not last.exists() and (old / "trainer_state.json").is_file()))
    if acc.is_main_process:
        ckpt.mkdir(parents=True, exist_ok=True)
        for name in ("last", "best"):   # a save killed between the two renames of replace_dir
            _settle_checkpoint(ckpt / name)
    acc.wait_for_everyone()
    saved = None
    if resuming:   # before the config is written: a checkpoint that does not fit leaves the run as it was
        try:
            for holder, folder in _state_dirs(acc, last / "state", states):
                holder.load_state(str(folder))
        except RuntimeError as e:   # torch's size mismatch / missing keys
            raise InputError(f"does not fit this config's model (another model shape?): "
                             f"{str(e).strip().splitlines()[-1].strip()[:200]}", last) from None
        saved = json.loads((last / "trainer_state.json").read_text())
    if acc.is_main_process:
        previous = out / "config.yaml"
        before = previous.read_text() if previous.is_file() else None
        if write_resolved(config, out).read_text() != before and before is not None and resuming:
            print(f"warning: resuming {last} with a config that differs from the run's previous one")
        if saved is not None:
            print(f"resuming from {last} at step {saved['step']}")
    acc.wait_for_everyone()
    return saved


def _state_dirs(acc: Any, root: Path, states: dict | None) -> list[tuple[Any, Path]]:
    """(accelerator, folder) pairs for save_state/load_state: `root` alone, or root/<name> per entry."""
    return [(acc, root)] if not states else [(holder, root / name) for name, holder in states.items()]


def _swap_in(tmp: Path, dest: Path) -> None:
    """`replace_dir`: `dest` (`last`) is kept as `.last.old` between the renames, which
    `prepare_run_dir` restores after a crash there. An empty `dest` is removed first: replace_dir
    fills an empty folder file by file, and a crash or a Ctrl-C between two files would leave a `last`
    with a trainer_state.json but not all of its weights, which a resumed run would load."""
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()
    replace_dir(tmp, dest)


# --- Ctrl-C -------------------------------------------------------------------------------------

class TrainingInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C once it saved what it could; `str()` is the line to show (what
    checkpoints/last holds and how to go on). A KeyboardInterrupt, so a caller that does not know it
    stops all the same."""


class Interrupts:
    """Ctrl-C (SIGINT) in a loop of steps whose work is kept (`train sft|kd|ppo|dgpo|grpo`: an optimizer
    step, saved in checkpoints/last; `train tgo`: a chunk of questions, appended to --out): the run
    stops with the last whole step kept.

    A step changes what is kept from `commit` on (the weights from its first optimizer step; tgo's
    output from its first append), and what follows (the step count, the scheduler, the metric row,
    the evaluation and the save; tgo's progress file) belongs to it: stopped in between, the checkpoint
    would mix two steps, and a chunk stopped between its two appends would be redone in part. So from
    `commit` to `step_ends`, which the loop calls once all of that is done, a first Ctrl-C only asks
    the loop to stop at `step_ends`; anywhere else it stops at once, and `stop` saves: after
    `step_ends` the state is that step's, before `commit` the previous step's once `stop` has put back
    what the begun step drew (the random generators, and accelerate's micro-batch count, which decides
    where gradients sync): the resumed run draws them again. A trainer's dev evaluation (`evaluating`)
    is the exception: it changes nothing a checkpoint holds, and on a big dev set it can take a minute
    or more, so a Ctrl-C inside it (or one that came earlier in the step) stops it at once, and `stop`
    saves the step as it was before the evaluation (the generators put back), marked `eval_pending`:
    the resumed run evaluates that step first, as the uninterrupted run did, so its eval rows and
    `best` are the same. A second Ctrl-C stops at once. A trainer sets `saved` to the step that
    checkpoints/last holds for this run (resumed from or saved), so `stop` does not write the same
    step again; tgo keeps each chunk as it ends, and has nothing to save.

    With one process only (`acc`: the run's accelerator; None: one process without one): with several,
    every rank would have to stop at the same step to save together (a save waits for all of them), so
    there Ctrl-C stops the run as it always did. `unit` names a step in the lines ("chunk" for tgo),
    `finishing` is the line of a first Ctrl-C inside one: what it waits for, and what a second gives up.
    """

    def __init__(self, acc: Any = None, unit: str = "step",
                 finishing: str = ("saving once this step is finished, leaving its dev evaluation, if one is still "
                                   "to come, to the resumed run (Ctrl-C again stops at once, without saving it)")):
        self.acc = acc
        self.enabled = acc is None or acc.num_processes == 1
        self.unit, self.finishing = unit, finishing
        # begun (nothing changed yet) | commit (the kept state is changing) | evaluating | done
        self.phase = "done"
        self.requested = False
        self.saved: int | None = None
        self.running = 0      # the step begun last (counted from 1)
        self._drawn: tuple | None = None
        self._before_eval: tuple | None = None

    @contextlib.contextmanager
    def watch(self):
        """Within the block, a first Ctrl-C inside a step's commit waits for the step's end. Not where
        SIGINT was ignored (a job started in the background keeps it so) or has another handler."""
        import signal
        import threading

        mine = (self.enabled and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        previous = signal.signal(signal.SIGINT, self._on_sigint) if mine else None
        try:
            yield
        finally:
            if mine:
                signal.signal(signal.SIGINT, previous)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.phase != "commit" or self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(f"interrupted: {self.finishing}", file=sys.stderr, flush=True)

    def step_begins(self, step: int) -> None:
        """Call as step number `step` (counted from 1) begins, before it draws anything."""
        self.phase = "begun"
        self.running = step
        self._drawn = (_rng_states(), None if self.acc is None else self.acc.step)

    def commit(self) -> None:
        """Call just before the step first changes what is kept (a trainer: its first optimizer step)."""
        self.phase = "commit"

    @contextlib.contextmanager
    def evaluating(self):
        """Around a dev evaluation (the hook's rollouts, not the logging and `best` that follow): a
        Ctrl-C inside it, or one that came earlier in the step, stops it at once; `stop` then saves the
        step as it was before the evaluation, for the resumed run to evaluate again."""
        previous, self.phase = self.phase, "evaluating"
        self._before_eval = _rng_states()   # an evaluation that draws would leave them moved
        if self.requested:   # a Ctrl-C in the update: no minutes of evaluation before stopping
            raise KeyboardInterrupt
        yield
        self.phase = previous

    def step_ends(self) -> None:
        """Call once the step is done, its bookkeeping, evaluation and save included; stops here when a
        Ctrl-C came after its commit."""
        self.phase = "done"
        if self.requested:
            raise KeyboardInterrupt

    def stop(self, step: int, save: Callable[..., None] | None, holds: Callable[[], str]) -> NoReturn:
        """Call from `except KeyboardInterrupt:` around the loop: `save(eval_pending=...)` the last whole
        step (unless `saved` says it is saved already; None: every step is kept as it ends) and raise
        TrainingInterrupted, whose line ends with `holds()` (what is kept and how to go on, read once
        saved: `last_holds` for a trainer); with several processes, re-raise."""
        if not self.enabled:
            raise   # the KeyboardInterrupt being handled
        if self.phase == "commit":   # a second Ctrl-C inside the step: half a step
            raise TrainingInterrupted(f"interrupted inside {self.unit} {self.running}: {holds()}") from None
        if self.phase == "begun":
            rng, acc_step = self._drawn
            _set_rng_states(rng)
            if self.acc is not None:
                self.acc.step = acc_step
        pending = self.phase == "evaluating"
        if pending:
            _set_rng_states(self._before_eval)
        self.phase = "done"
        if save is not None and step and self.saved != step:
            try:
                save(eval_pending=pending)
            except KeyboardInterrupt:   # the save was written into a temp folder: `last` is as it was
                raise TrainingInterrupted(f"interrupted again while saving: {holds()}") from None
        raise TrainingInterrupted(f"interrupted: {holds()}") from None

    def last_holds(self, last: Path, resume: bool) -> Callable[[], str]:
        """`stop`'s `holds` for a trainer: what checkpoints/last holds (`last_holds`); with
        run.resume=false, a `last` this run did not save is an earlier attempt's."""
        return lambda: last_holds(last, resume, ours=resume or self.saved is not None)


def last_holds(last: Path, resume: bool, ours: bool = True) -> str:
    """What checkpoints/last holds, and how to go on from it (`run.resume`: whether the run had it on).
    `ours=False`: this run, a fresh start, saved nothing, and has dropped the metric rows of whatever
    `last` holds (Loggers), so resuming from it is not what to offer."""
    saved = _saved_state(last)
    if saved is None:
        return f"nothing saved ({last} not written yet)"
    step, pending = saved
    if not ours:
        return (f"nothing saved by this run (run.resume=false): {last} still holds an earlier attempt's step {step}, "
                "whose metric rows this run dropped; the same command starts again from step 0")
    how = "run the same command again" + ("" if resume else " with run.resume=true")
    before = ", before its dev evaluation, which the resumed run does first" if pending else ""
    return f"{last} holds step {step}{before}; {how} to resume from there"


def _saved_state(last: Path) -> tuple[int, bool] | None:
    """The step of checkpoints/last (or of `.last.old`, which prepare_run_dir restores) and whether
    its evaluation is still to be made (`eval_pending`), None without one."""
    for folder in (last, aside(last)):
        try:
            state = json.loads((folder / "trainer_state.json").read_text())
            return int(state["step"]), state.get("eval_pending") is True
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return None


def _rng_states() -> tuple:
    """The generators accelerate's save_state saves (Python, NumPy, torch, CUDA)."""
    import random

    import numpy
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return random.getstate(), numpy.random.get_state(), torch.get_rng_state(), cuda


def _set_rng_states(states: tuple) -> None:
    import random

    import numpy
    import torch

    python, numpy_state, cpu, cuda = states
    random.setstate(python)
    numpy.random.set_state(numpy_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


# --- metric sinks ---------------------------------------------------------------------------

def evaluate_and_keep_best(acc: Any, state: Any, evaluate: Callable[[], dict], logger: Any,
                           best_metric: str, save_best: Callable[[dict], None]) -> dict:
    """One evaluation, as both trainers run it: the hook on the main process (the others wait),
    its row logged (a data.report row beside it, recorded and never chosen by), `save_best(metrics)`
    when `best_metric` beats `state.best`, and the time added to `state.eval_s`."""
    t0 = time.perf_counter()
    metrics: dict = {}
    acc.wait_for_everyone()
    if acc.is_main_process:
        metrics = dict(evaluate())
        report = metrics.pop("_report", None)
        logger.eval_row({"step": state.step, **metrics}, report)
        value = metrics.get(best_metric)
        if value is not None and (state.best is None or value > state.best):
            save_best(metrics)   # first: stopped inside it, `best` and the state name the same step
            state.best, state.best_step = float(value), state.step
    acc.wait_for_everyone()
    state.eval_s += time.perf_counter() - t0
    return metrics


def peak_memory_gb() -> float:
    """Peak GPU memory allocated by torch, or the process's peak RSS on CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class Loggers:
    """metrics.csv / eval.csv / report.jsonl (rows after a resumed step are dropped), TensorBoard, W&B.

    `eval_pending`: the resumed step's evaluation was stopped by a Ctrl-C and is done again first, so
    its eval.csv and report.jsonl rows go too, and TensorBoard's events from that step on: a resumed
    run stopped again after writing them, before its next save, resumes from the same pending step,
    and would otherwise write them twice."""

    def __init__(self, config: Any, out: Path, main: bool, start_step: int, eval_pending: bool = False):
        self.main = main
        self.train_csv = out / "metrics.csv"
        self.eval_csv = out / "eval.csv"
        self.report_jsonl = out / "report.jsonl"
        self.tb = None
        self.wandb = None
        if not main:
            return
        evals_through = start_step - 1 if eval_pending else start_step
        header, kept = _truncate_csv(self.train_csv, start_step)
        _truncate_csv(self.eval_csv, evals_through)
        _truncate_jsonl(self.report_jsonl, evals_through)
        if config.log.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            if not start_step:   # a fresh start (run.resume=false, or nothing saved yet): as the CSVs,
                # the previous attempt's curves go, or TensorBoard draws both runs as one
                for old in (out / "tb").glob("events.out.tfevents.*"):
                    old.unlink()
            # Events from the first step this run logs on are purged: TensorBoard drops what an attempt
            # that crashed before its next save logged there. A pending evaluation is logged again at
            # the resumed step itself, so that step is purged too, and its kept train row put back.
            purge = start_step + (0 if eval_pending else 1) if start_step else None
            self.tb = SummaryWriter(str(out / "tb"), purge_step=purge)
            if eval_pending and kept and kept[-1][0] == str(start_step):   # that step's row, as logged
                self._tb_scalars("train", start_step, dict(zip(header[1:], map(_number, kept[-1][1:]))))
        if config.log.wandb:
            try:
                import wandb
            except ImportError:
                raise InputError("log.wandb is set but wandb is not installed (pip install wandb)") from None
            self.wandb = wandb.init(project=config.log.wandb_project, dir=str(out),
                                    config=dataclasses.asdict(config), resume="allow")

    def train_row(self, row: dict, columns: tuple) -> None:
        self._write(self.train_csv, row, columns, "train")

    def eval_row(self, row: dict, report: dict | None = None) -> None:
        """An evaluation's metrics to eval.csv; `report` (data.report's row) to report.jsonl."""
        self._write(self.eval_csv, row, tuple(row), "dev")
        if report is not None and self.main:
            with open(self.report_jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": row["step"], **report}) + "\n")

    def _write(self, path: Path, row: dict, columns: tuple, prefix: str) -> None:
        if not self.main:
            return
        new = not path.exists() or path.stat().st_size == 0
        if not new:
            with open(path, newline="") as f:
                columns = tuple(next(csv.reader(f)))
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow(row)
        numbers = {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        self._tb_scalars(prefix, row["step"], numbers)
        if self.wandb:
            self.wandb.log({f"{prefix}/{k}": v for k, v in numbers.items()}, step=row["step"])

    def _tb_scalars(self, prefix: str, step: int, numbers: dict) -> None:
        """A row's numbers as TensorBoard scalars at `step` (None: an empty cell, none)."""
        if self.tb:
            for k, v in numbers.items():
                if v is not None:
                    self.tb.add_scalar(f"{prefix}/{k}", v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _number(cell: str) -> float | None:
    """A metrics.csv cell as the number it was logged as; None for an empty (or not numeric) one."""
    try:
        return float(cell)
    except ValueError:
        return None


def _truncate_jsonl(path: Path, step: int) -> None:
    """report.jsonl as `_truncate_csv` keeps a CSV: the rows up to `step`, a torn line dropped,
    nothing on a fresh start (step 0)."""
    if not path.exists():
        return
    if step == 0:
        path.unlink()
        return
    from dgpo_edge.jsonio import atomic_open

    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue   # a line torn by a crash
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= step:
            keep.append(line + "\n")
    with atomic_open(path) as f:
        f.writelines(keep)


def _truncate_csv(path: Path, step: int) -> tuple[list[str], list[list[str]]]:
    """Keep the rows up to `step` (those a resumed run will not log again); drop a torn last line.
    Returns the header and the rows kept (none when there is no file).

    Step 0 is a fresh start (no checkpoint to resume): a previous attempt's rows all go.
    """
    if not path.exists():
        return [], []
    if step == 0:
        path.unlink()
        return [], []
    from dgpo_edge.jsonio import atomic_open

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return [], []
    header, body = rows[0], rows[1:]
    keep = [r for r in body if len(r) == len(header) and r[0].isdigit() and int(r[0]) <= step]
    with atomic_open(path) as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(keep)
    return header, keep


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int, done: int, label: str, shows: str = "loss", bar: bool = True):
    """Training progress; yields `advance(value)`, the step's `shows` (SFT/KD: loss; RL: reward).
    `enabled`: this process reports (the main one). `bar` (log.progress): rich's bar, when stderr
    is a terminal; else, or without `bar`, `PlainProgress` lines, since in a log or a pipe the
    (transient) bar draws nothing at all."""
    from dgpo_edge import progress

    if not enabled:
        yield lambda value: None
        return
    if not (bar and progress.is_terminal(sys.stderr)):
        yield PlainProgress(total, done, label, shows)
        return
    from rich.progress import TextColumn

    # stderr, steps as the unit, an ETA that ignores the steps a resumed run had already done
    with progress.stage_progress(transient=True, extra=(TextColumn(f"{shows} {{task.fields[value]}}"),)) as live:
        task = progress.add_stage(live, f"train {label}", "train", done, total, unit="steps", value="-")
        yield lambda value: live.update(task, advance=1, value=f"{value:.4f}")


#: Seconds between two `PlainProgress` lines.
PLAIN_PROGRESS_S = 30.0


class PlainProgress:
    """Progress as plain lines on stderr, for a log or a pipe: `train sft: step 20/100, loss 1.2345,
    elapsed 0:01:02, eta 0:04:08` after the first step, then once PLAIN_PROGRESS_S have passed since
    the last line, and at the last step. Elapsed and ETA are this process's: a resumed run's earlier
    steps are not in its rate."""

    def __init__(self, total: int, done: int, label: str, shows: str, clock: Callable[[], float] = time.monotonic):
        self.total, self.step, self.base, self.label, self.shows = total, done, done, label, shows
        self.clock = clock
        self.t0 = clock()
        self.last: float | None = None

    def __call__(self, value: float) -> None:
        from dgpo_edge.progress import clock_text

        self.step += 1
        now = self.clock()
        if self.last is not None and now - self.last < PLAIN_PROGRESS_S and self.step < self.total:
            return
        self.last = now
        elapsed = now - self.t0
        eta = elapsed / (self.step - self.base) * max(0, self.total - self.step)
        print(f"train {self.label}: step {self.step}/{self.total}, {self.shows} {value:.4f}, "
              f"elapsed {clock_text(elapsed)}, eta {clock_text(eta)}", file=sys.stderr, flush=True)
