"""The training loop shared by `train sft` and `train kd`.

What it does, in order: seeds; takes an `accelerate.Accelerator` (one process,
DDP, or DeepSpeed ZeRO: plumbing.make_accelerator); AdamW plus a
warmup-then-decay schedule; gradient accumulation; bf16 autocast where the GPU
has it; gradient clipping; a metric row every `log.every` steps (metrics.csv,
TensorBoard, W&B when asked); dev evaluation every `eval.every` steps through
a hook; checkpoints in transformers format, written atomically, `last` (with
the optimizer, scheduler and RNG state for resuming) and `best` (by
`eval.best_metric`).

Resuming: the data order is a pure function of (seed, epoch) and the position
a pure function of the optimizer step, so a run restarted from
`checkpoints/last` sees exactly the batches an uninterrupted run would have
seen next, with the same optimizer state and RNG - and so logs the same
numbers (a test checks this). Ctrl-C saves `last` at the last whole step, as the periodic save
does, and raises TrainingInterrupted (plumbing.Interrupts), so the rerun continues from there; one
during a dev evaluation stops it and saves the step before it (`eval_pending`), which the rerun
evaluates first.

The loss is a hook too: `loss_fn(module, batch) -> (loss, stats)`, where
`module` is the prepared `losses.MaskedLMLoss` (so DDP and autocast apply).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError

from .config import MAX_STEPS
from .data import Example, batch_order, collate
from .plumbing import (
    Interrupts,
    Loggers,
    SaveClock,
    evaluate_and_keep_best,
    fill_deepspeed_autos,
    lr_lambda,
    peak_memory_gb,
    prepare_run_dir,
    progress_bar,
    write_last,
)

TRAIN_COLUMNS = ("step", "epoch", "lr", "loss", "grad_norm", "tokens", "loss_tokens", "tokens_per_s",
                 "elapsed_s", "peak_mem_gb")
LossFn = Callable[[Any, dict], tuple[Any, dict]]
EvalFn = Callable[..., dict]   # evaluate(model, step, engine=None) -> metrics


@dataclass
class TrainState:
    """What a resumed run needs besides weights and optimizer state."""

    step: int = 0
    best: float | None = None
    best_step: int | None = None
    elapsed_s: float = 0.0
    eval_s: float = 0.0          # part of elapsed_s spent evaluating
    tokens: int = 0
    # The steps since the last metric row (their loss sum, count, tokens and seconds): a run resumed
    # between two rows averaged only the steps after the resume into the next one, so with log.every
    # > 1 that row's loss and tokens differed from the uninterrupted run's.
    window: dict = field(default_factory=dict)
    # Saved by a Ctrl-C during this step's dev evaluation: the resumed run makes it first.
    eval_pending: bool = False


def check_zero3(config: Any, stage: int | None, processes: int) -> None:
    """Refuse, before any model loads, the SFT/KD settings that ZeRO-3 cannot run.

    ZeRO-3 holds each parameter as shards that are gathered only inside its own module's forward:
    the chunked loss reads the LM-head weight outside that forward (it would see an empty shard).
    Dev evaluation runs on the main process alone: with several processes its forward passes wait
    forever for the other ranks to join the gathers, and even with one (seen on an H200) the fast
    rollout engine's CUDA-graph capture fails on them. So no evaluation, hence no `best`, under ZeRO-3.
    """
    if stage != 3:
        return
    if config.lora.on:
        raise InputError(f"lora.r={config.lora.r}, lora.init_from={config.lora.init_from}: LoRA is not supported under DeepSpeed ZeRO-3 (checkpoints "
                         "merge the adapters into whole weights); use DDP or ZeRO-2")
    if config.model.compile:   # its gathers run in hooks on every submodule, inside the compiled layers
        raise InputError("model.compile=true: compiled layers are not tried under DeepSpeed ZeRO-3, whose "
                         "parameter gathers run inside them; use DDP or ZeRO-2, or model.compile=false")
    if config.chunk_size:
        raise InputError(f"chunk_size={config.chunk_size}: the chunked loss cannot read the sharded LM head "
                         "under DeepSpeed ZeRO-3; set chunk_size=0 (full logits)")
    for key in ("dev", "report"):   # either one makes the trainer evaluate
        if getattr(config.data, key):
            raise InputError(f"data.{key} is set, but evaluation cannot run under DeepSpeed ZeRO-3 "
                             f"({processes} process{'es' if processes > 1 else ''}): it needs the whole weights "
                             f"in place, and ZeRO-3 holds shards; set data.{key}=null and evaluate the saved "
                             "checkpoints afterwards")


class Trainer:
    """Runs one training job; see the module docstring."""

    def __init__(self, config: Any, module: Any, tokenizer: Any, examples: list[Example],
                 loss_fn: LossFn, accelerator: Any, eval_fn: EvalFn | None = None,
                 on_step: Callable[[int, dict], None] | None = None):
        self.config = config
        self.tokenizer = tokenizer
        self.examples = examples
        self.loss_fn = loss_fn
        self.eval_fn = eval_fn
        self.on_step = on_step
        self.acc = accelerator
        self.out = Path(config.run.out_dir)
        self.ckpt = self.out / "checkpoints"
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.world = accelerator.num_processes
        self.global_batch = config.optim.batch_size * self.world
        if len(examples) < self.global_batch:
            raise InputError(f"{len(examples)} trajectories are fewer than one batch "
                             f"({config.optim.batch_size} x {self.world} processes)", config.data.train)
        self.micro_per_epoch = len(batch_order(len(examples), self.global_batch, 0, config.run.seed))
        steps_per_epoch = max(1, self.micro_per_epoch // config.optim.grad_accum)
        self.total_steps = config.optim.max_steps or max(1, math.ceil(config.optim.epochs * steps_per_epoch))
        if self.total_steps > MAX_STEPS:   # max_steps itself was checked with the config
            raise InputError(f"key 'optim.epochs' gives {self.total_steps:,} optimizer steps "
                             f"({config.optim.epochs:g} epochs x {steps_per_epoch:,}); at most {MAX_STEPS:,}")
        self._setup_optim(module)
        self.state = TrainState()
        self.save_clock = SaveClock(config.log.save_minutes)
        self.interrupts = Interrupts(accelerator)
        self._order_cache: dict[int, list[list[int]]] = {}
        self._eval_copy: Any = None     # the bf16 copy the evaluations decode (made at the first one)
        self._eval_engine: Any = None

    # -- setup -----------------------------------------------------------------------
    def _setup_optim(self, module: Any) -> None:
        import torch

        o = self.config.optim
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                      weight_decay=o.weight_decay)
        fill_deepspeed_autos(self.acc, o, self.world)
        warmup = round(o.warmup_ratio * self.total_steps)
        # Not passed to prepare(): accelerate would step it once per process.
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(self.total_steps, warmup, o.schedule))
        self.module, self.optimizer = self.acc.prepare(module, optimizer)
        self.acc.register_for_checkpointing(self.scheduler)

    @property
    def lm(self) -> Any:
        """The bare causal LM (unwrapped from DDP/DeepSpeed and the loss module)."""
        return self.acc.unwrap_model(self.module).lm

    def _batch(self, micro: int) -> dict:
        """This process's share of global micro-batch number `micro` (counted from the start)."""
        epoch, index = divmod(micro, self.micro_per_epoch)
        if epoch not in self._order_cache:
            self._order_cache = {epoch: batch_order(len(self.examples), self.global_batch, epoch,
                                                    self.config.run.seed)}
        rows = self._order_cache[epoch][index]
        bs = self.config.optim.batch_size
        mine = rows[self.acc.process_index * bs:(self.acc.process_index + 1) * bs] or rows[:bs]
        batch = collate([self.examples[i] for i in mine], self.pad_id)
        batch["examples"] = [self.examples[i] for i in mine]
        batch["micro"] = micro
        return {k: (v.to(self.acc.device) if hasattr(v, "to") else v) for k, v in batch.items()}

    # -- the loop ----------------------------------------------------------------------
    def train(self) -> dict:
        """Train to `total_steps`, resuming when a last checkpoint exists; returns the summary."""
        self._prepare_run_dir()
        logger = Loggers(self.config, self.out, self.acc.is_main_process, self.state.step,
                         self.state.eval_pending)
        t_start = time.perf_counter() - self.state.elapsed_s
        start_step = self.state.step
        try:
            if self.eval_fn and self.config.eval.at_start and self.state.step == 0:
                self._evaluate(logger)   # in the try: stopped here, the line says what this run left
            self.save_clock.saved()   # log.save_minutes count training, not loading and a first evaluation
            self._window = window = self._new_window(self.state.window)
            with self.interrupts.watch(), progress_bar(self.acc.is_main_process, self.total_steps, start_step,
                                                       self.config.stage, bar=self.config.log.progress) as advance:
                if self.state.eval_pending:   # the saved step's evaluation, which a Ctrl-C stopped
                    self._after_step(logger)
                while self.state.step < self.total_steps:
                    self.interrupts.step_begins(self.state.step + 1)
                    stats = self._optimizer_step()
                    self.state.step += 1
                    window["loss"] += stats["loss"]
                    window["n"] += 1
                    window["tokens"] += stats["tokens"]
                    window["loss_tokens"] += stats["loss_tokens"]
                    self.state.tokens += stats["tokens"]
                    self.state.elapsed_s = time.perf_counter() - t_start
                    advance(stats["loss"])
                    if self.state.step % self.config.log.every == 0 or self.state.step == self.total_steps:
                        logger.train_row(self._train_row(window, stats), TRAIN_COLUMNS)
                        self._window = window = self._new_window({})
                    self._after_step(logger)
                    if self.on_step:
                        self.on_step(self.state.step, stats)
                    self.interrupts.step_ends()   # last: a Ctrl-C in the update waits for the save
        except KeyboardInterrupt:
            logger.close()
            self.interrupts.stop(self.state.step, self.save_last,
                                 self.interrupts.last_holds(self.ckpt / "last", self.config.run.resume))
        self.state.elapsed_s = time.perf_counter() - t_start  # include the final evaluation and save
        logger.close()
        self.acc.end_training()  # the process group, under a distributed launch
        return self._summary()

    @staticmethod
    def _new_window(saved: dict) -> dict:
        """A metric window: the steps since the last metric row that `saved` (a resumed run's
        TrainState.window) holds, or none ({}: at the start, and after each row)."""
        return {"loss": saved.get("loss", 0.0), "n": saved.get("n", 0), "tokens": saved.get("tokens", 0),
                "loss_tokens": saved.get("loss_tokens", 0), "t0": time.perf_counter() - saved.get("seconds", 0.0)}

    def _optimizer_step(self) -> dict:
        """One optimizer step over grad_accum micro-batches; returns averaged stats."""
        import torch

        ga = self.config.optim.grad_accum
        loss_sum, tokens, loss_tokens, grad_norm = 0.0, 0, 0, float("nan")
        self.module.train()
        for j in range(ga):
            batch = self._batch(self.state.step * ga + j)
            with self.acc.accumulate(self.module):   # sets sync_gradients for this micro-batch on entry
                loss, _ = self.loss_fn(self.module, batch)
                if self.acc.sync_gradients:
                    # The weights change from here on: under DeepSpeed, backward on the micro-batch that
                    # syncs runs the engine's optimizer step itself (the step() below is a no-op there).
                    self.interrupts.commit()
                self.acc.backward(loss)
                if self.acc.sync_gradients:
                    if self.config.optim.grad_clip > 0:
                        norm = self.acc.clip_grad_norm_(self.module.parameters(), self.config.optim.grad_clip)
                        grad_norm = float(norm) if norm is not None else float("nan")
                    self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
            loss_sum += float(loss.detach())
            tokens += int(batch["attention_mask"].sum())
            loss_tokens += int(batch["target_mask"].sum())
        self.scheduler.step()
        # Average the logged loss over processes so every rank's CSV row is the same number.
        mean = self.acc.reduce(torch.tensor([loss_sum / ga], device=self.acc.device), reduction="mean")
        world_tokens = self.acc.reduce(torch.tensor([tokens, loss_tokens], device=self.acc.device),
                                       reduction="sum")
        return {"loss": float(mean[0]), "grad_norm": grad_norm, "tokens": int(world_tokens[0]),
                "loss_tokens": int(world_tokens[1])}

    def _after_step(self, logger: Loggers) -> None:
        step = self.state.step
        every = self.config.eval.every
        at_end = step == self.total_steps
        evaluated = False
        if self.eval_fn and ((every and step % every == 0) or at_end):
            self._evaluate(logger)
            evaluated = True
        save_every = self.config.log.save_every
        timed = self.save_clock.due(self.acc)   # on every process at every step (a broadcast)
        if at_end or evaluated or timed or (save_every and step % save_every == 0):
            self.save_last()

    def _train_row(self, window: dict, stats: dict) -> dict:
        dt = max(1e-9, time.perf_counter() - window["t0"])
        epoch = self.state.step * self.config.optim.grad_accum / self.micro_per_epoch
        return {"step": self.state.step, "epoch": round(epoch, 4), "lr": self.scheduler.get_last_lr()[0],
                "loss": window["loss"] / window["n"], "grad_norm": stats["grad_norm"],
                "tokens": window["tokens"], "loss_tokens": window["loss_tokens"],
                "tokens_per_s": round(window["tokens"] / dt, 1), "elapsed_s": round(self.state.elapsed_s, 2),
                "peak_mem_gb": round(peak_memory_gb(), 3)}

    # -- evaluation and checkpoints -------------------------------------------------------
    def _evaluate(self, logger: Loggers) -> dict:
        """Run the eval hook on the main process; keep `best` when the metric improves."""
        def evaluate() -> dict:
            was_training = self.lm.training
            self.lm.eval()
            try:
                with self.interrupts.evaluating():
                    model, engine = self._eval_decoder()
                    return self.eval_fn(model, self.state.step, engine)
            finally:
                self.lm.train(was_training)

        return evaluate_and_keep_best(self.acc, self.state, evaluate, logger, self.config.eval.best_metric,
                                      lambda metrics: self._save_model(self.ckpt / "best", metrics))

    def _eval_decoder(self) -> tuple[Any, Any]:
        """The model and engine an evaluation decodes with, as RL evaluations do: with eval.weights
        auto on a GPU in bf16 (or bf16_copy), a bf16 copy of the weights (LoRA merged), refreshed at
        each evaluation, through one engine kept for the run, so its CUDA graphs are captured once;
        otherwise the training weights, with an engine of their own per call. (On an H100 an
        evaluation of 300 dev and 740 test FactbookQA questions took about 95 s the second way inside
        an RL run and 15-20 s the first: docs/benchmarks.md.)"""
        from .rollout_copy import RolloutCopy, wants_copy

        if not wants_copy(self.config.eval.weights, self.acc):
            return self.lm, None
        if self._eval_copy is None:
            from .rollout import make_engine

            self._eval_copy = RolloutCopy(self.lm)
            rollout = getattr(self.eval_fn, "rollout", None)   # make_eval_fn's hook says how it decodes
            self._eval_engine = rollout and make_engine(self._eval_copy.model, self.tokenizer, rollout)
        else:
            self._eval_copy.sync(self.lm)
        return self._eval_copy.model, self._eval_engine

    def provenance(self, metrics: dict | None = None) -> dict:
        """What produced a checkpoint (written beside it as dgpo_edge.json)."""
        from dgpo_edge.jsonio import file_digest

        if not hasattr(self, "_data_digest"):
            self._data_digest = {"path": str(self.config.data.train), **file_digest(self.config.data.train)}
        return {"made_by": f"dgpo-edge train {self.config.stage}", "step": self.state.step,
                "metrics": metrics or {}, "config": str(self.out / "config.yaml"),
                "train_data": self._data_digest}

    def _save_model(self, path: Path, metrics: dict | None = None) -> None:
        """`best`, from the main process; its weights are complete there, since `check_zero3`
        refuses evaluation (and so `best`) under ZeRO-3."""
        from .lora import save_checkpoint

        save_checkpoint(self.lm, self.tokenizer, path, extra=self.provenance(metrics))

    def save_last(self, eval_pending: bool = False) -> None:
        """checkpoints/last: model + tokenizer (transformers format) and state/ for resuming;
        `eval_pending`: the step's evaluation was stopped, for the resumed run to make."""
        self.state.eval_pending = eval_pending
        window = getattr(self, "_window", None)
        self.state.window = {} if not window else {
            **{k: window[k] for k in ("loss", "n", "tokens", "loss_tokens")},
            "seconds": time.perf_counter() - window["t0"]}
        write_last(self.acc, self.ckpt, self.lm, self.tokenizer, self.state.__dict__, self.provenance(),
                   module=self.module)
        self.save_clock.saved()
        self.interrupts.saved = self.state.step

    def _prepare_run_dir(self) -> None:
        saved = prepare_run_dir(self.acc, self.config, self.out)
        if saved is not None:
            self.state = TrainState(**saved)
            self.interrupts.saved = self.state.step

    def _summary(self) -> dict:
        s = self.state
        train_s = max(s.elapsed_s - s.eval_s, 1e-9)
        summary = {"steps": s.step, "elapsed_s": round(s.elapsed_s, 2), "eval_s": round(s.eval_s, 2),
                   "tokens": s.tokens, "tokens_per_s": round(s.tokens / train_s, 1),
                   "peak_mem_gb": round(peak_memory_gb(), 3), "best": s.best, "best_step": s.best_step,
                   "best_metric": self.config.eval.best_metric, "processes": self.world}
        if self.acc.is_main_process:
            from dgpo_edge.jsonio import write_json
            write_json(self.out / "summary.json", summary)
        return summary
