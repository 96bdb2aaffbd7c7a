"""The training loop shared by `train sft` and `train kd`.

What it does, in order: seeds; builds an `accelerate.Accelerator` (one process,
DDP, or DeepSpeed ZeRO - whatever `accelerate launch` set up); AdamW plus a
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
numbers (a test checks this).

The loss is a hook too: `loss_fn(module, batch) -> (loss, stats)`, where
`module` is the prepared `losses.MaskedLMLoss` (so DDP and autocast apply).
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import replace_dir

from .config import write_resolved
from .data import Example, batch_order, collate

TRAIN_COLUMNS = ("step", "epoch", "lr", "loss", "grad_norm", "tokens", "loss_tokens", "tokens_per_s",
                 "elapsed_s", "peak_mem_gb")
LossFn = Callable[[Any, dict], tuple[Any, dict]]
EvalFn = Callable[[Any, int], dict]


@dataclass
class TrainState:
    """What a resumed run needs besides weights and optimizer state."""

    step: int = 0
    best: float | None = None
    best_step: int | None = None
    elapsed_s: float = 0.0
    eval_s: float = 0.0          # part of elapsed_s spent evaluating
    tokens: int = 0


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
    return Accelerator(gradient_accumulation_steps=accumulate, cpu=not (torch.cuda.is_available() or deepspeed),
                       mixed_precision="bf16" if precision == "bf16" else "no", deepspeed_plugins=deepspeed_plugins)


def zero_stage(accelerator: Any) -> int | None:
    """The DeepSpeed ZeRO stage this run uses, or None without DeepSpeed."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return None if plugin is None else int(plugin.zero_stage)


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
    if config.lora.r:
        raise InputError(f"lora.r={config.lora.r}: LoRA is not supported under DeepSpeed ZeRO-3 (checkpoints "
                         "merge the adapters into whole weights); use DDP or ZeRO-2")
    if config.chunk_size:
        raise InputError(f"chunk_size={config.chunk_size}: the chunked loss cannot read the sharded LM head "
                         "under DeepSpeed ZeRO-3; set chunk_size=0 (full logits)")
    if config.data.dev:
        raise InputError(f"data.dev is set, but dev evaluation cannot run under DeepSpeed ZeRO-3 "
                         f"({processes} process{'es' if processes > 1 else ''}): it needs the whole weights "
                         "in place, and ZeRO-3 holds shards; set data.dev=null and evaluate the saved "
                         "checkpoints afterwards")


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
        self._setup_optim(module)
        self.state = TrainState()
        self._order_cache: dict[int, list[list[int]]] = {}

    # -- setup -----------------------------------------------------------------------
    def _setup_optim(self, module: Any) -> None:
        import torch

        o = self.config.optim
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                                      weight_decay=o.weight_decay)
        _fill_deepspeed_autos(self.acc, o, self.world)
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
        logger = _Loggers(self.config, self.out, self.acc.is_main_process, self.state.step)
        t_start = time.perf_counter() - self.state.elapsed_s
        if self.eval_fn and self.config.eval.at_start and self.state.step == 0:
            self._evaluate(logger)
        start_step = self.state.step
        window = {"loss": 0.0, "n": 0, "tokens": 0, "loss_tokens": 0, "t0": time.perf_counter()}
        with _progress(self.acc.is_main_process and self.config.log.progress, self.total_steps,
                       start_step, self.config.stage) as advance:
            while self.state.step < self.total_steps:
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
                    logger.train_row(self._train_row(window, stats))
                    window = {"loss": 0.0, "n": 0, "tokens": 0, "loss_tokens": 0, "t0": time.perf_counter()}
                self._after_step(logger)
                if self.on_step:
                    self.on_step(self.state.step, stats)
        self.state.elapsed_s = time.perf_counter() - t_start  # include the final evaluation and save
        logger.close()
        self.acc.end_training()  # the process group, under a distributed launch
        return self._summary()

    def _optimizer_step(self) -> dict:
        """One optimizer step over grad_accum micro-batches; returns averaged stats."""
        import torch

        ga = self.config.optim.grad_accum
        loss_sum, tokens, loss_tokens, grad_norm = 0.0, 0, 0, float("nan")
        self.module.train()
        for j in range(ga):
            batch = self._batch(self.state.step * ga + j)
            with self.acc.accumulate(self.module):
                loss, _ = self.loss_fn(self.module, batch)
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

    def _after_step(self, logger: _Loggers) -> None:
        step = self.state.step
        every = self.config.eval.every
        at_end = step == self.total_steps
        evaluated = False
        if self.eval_fn and ((every and step % every == 0) or at_end):
            self._evaluate(logger)
            evaluated = True
        save_every = self.config.log.save_every
        if at_end or evaluated or (save_every and step % save_every == 0):
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
    def _evaluate(self, logger: _Loggers) -> dict:
        """Run the eval hook on the main process; keep `best` when the metric improves."""
        metrics: dict = {}
        t0 = time.perf_counter()
        self.acc.wait_for_everyone()
        if self.acc.is_main_process:
            was_training = self.lm.training
            self.lm.eval()
            metrics = dict(self.eval_fn(self.lm, self.state.step))
            self.lm.train(was_training)
            logger.eval_row({"step": self.state.step, **metrics})
            key = self.config.eval.best_metric
            value = metrics.get(key)
            if value is not None and (self.state.best is None or value > self.state.best):
                self.state.best, self.state.best_step = float(value), self.state.step
                self._save_model(self.ckpt / "best", metrics)
        self.acc.wait_for_everyone()
        self.state.eval_s += time.perf_counter() - t0
        return metrics

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

    def save_last(self) -> None:
        """checkpoints/last: model + tokenizer (transformers format) and state/ for resuming."""
        write_last(self.acc, self.ckpt, self.lm, self.tokenizer, self.state.__dict__, self.provenance(),
                   module=self.module)

    def _prepare_run_dir(self) -> None:
        saved = prepare_run_dir(self.acc, self.config, self.out)
        if saved is not None:
            self.state = TrainState(**saved)

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


# --- run directories and checkpoints (shared with the RL trainer) ---------------------------

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


def prepare_run_dir(acc: Any, config: Any, out: Path, *, states: dict | None = None) -> dict | None:
    """Create out_dir, write the resolved config, recover from an interrupted swap, and - when
    `run.resume` and `checkpoints/last` exist - load the saved state (from state/<name> into each of
    `states`, as `write_last` saved it); returns trainer_state or None."""
    ckpt = out / "checkpoints"
    last, old = ckpt / "last", ckpt / ".last.old"
    resuming = config.run.resume and ((last / "trainer_state.json").is_file()
                                      or (not last.exists() and (old / "trainer_state.json").is_file()))
    if acc.is_main_process:
        ckpt.mkdir(parents=True, exist_ok=True)
        if not last.exists() and old.exists():  # crashed between the two renames of _swap_in
            os.replace(old, last)
        previous = out / "config.yaml"
        before = previous.read_text() if previous.is_file() else None
        if write_resolved(config, out).read_text() != before and before is not None and resuming:
            print(f"warning: resuming {last} with a config that differs from the run's previous one")
    acc.wait_for_everyone()
    if not resuming:
        return None
    for holder, folder in _state_dirs(acc, last / "state", states):
        holder.load_state(str(folder))
    saved = json.loads((last / "trainer_state.json").read_text())
    if acc.is_main_process:
        print(f"resuming from {last} at step {saved['step']}")
    return saved


def _state_dirs(acc: Any, root: Path, states: dict | None) -> list[tuple[Any, Path]]:
    """(accelerator, folder) pairs for save_state/load_state: `root` alone, or root/<name> per entry."""
    return [(acc, root)] if not states else [(holder, root / name) for name, holder in states.items()]


def _fill_deepspeed_autos(accelerator: Any, optim: Any, world: int) -> None:
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


def _swap_in(tmp: Path, dest: Path) -> None:
    """`replace_dir`: `dest` (`last`) is kept as `.last.old` between the renames, which
    `_prepare_run_dir` restores after a crash there."""
    replace_dir(tmp, dest)


def peak_memory_gb() -> float:
    """Peak GPU memory allocated by torch, or the process's peak RSS on CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# --- metric sinks ---------------------------------------------------------------------------

class _Loggers:
    """metrics.csv / eval.csv (rows after a resumed step are dropped), TensorBoard, W&B."""

    def __init__(self, config: Any, out: Path, main: bool, start_step: int):
        self.main = main
        self.train_csv = out / "metrics.csv"
        self.eval_csv = out / "eval.csv"
        self.tb = None
        self.wandb = None
        if not main:
            return
        for path in (self.train_csv, self.eval_csv):
            _truncate_csv(path, start_step)
        if config.log.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(out / "tb"), purge_step=start_step + 1 if start_step else None)
        if config.log.wandb:
            try:
                import wandb
            except ImportError:
                raise InputError("log.wandb is set but wandb is not installed (pip install wandb)") from None
            self.wandb = wandb.init(project=config.log.wandb_project, dir=str(out),
                                    config=dataclasses.asdict(config), resume="allow")

    def train_row(self, row: dict, columns: tuple = TRAIN_COLUMNS) -> None:
        self._write(self.train_csv, row, columns, "train")

    def eval_row(self, row: dict) -> None:
        self._write(self.eval_csv, row, tuple(row), "dev")

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
        if self.tb:
            for k, v in numbers.items():
                self.tb.add_scalar(f"{prefix}/{k}", v, row["step"])
            self.tb.flush()
        if self.wandb:
            self.wandb.log({f"{prefix}/{k}": v for k, v in numbers.items()}, step=row["step"])

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _truncate_csv(path: Path, step: int) -> None:
    """Keep the rows up to `step` (those a resumed run will not log again); drop a torn last line.

    Step 0 is a fresh start (no checkpoint to resume): a previous attempt's rows all go.
    """
    if not path.exists():
        return
    if step == 0:
        path.unlink()
        return
    from dgpo_edge.jsonio import atomic_open

    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    header, body = rows[0], rows[1:]
    keep = [r for r in body if len(r) == len(header) and r[0].isdigit() and int(r[0]) <= step]
    with atomic_open(path) as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(keep)


@contextlib.contextmanager
def _progress(enabled: bool, total: int, done: int, label: str):
    """A rich progress bar; yields `advance(loss)`."""
    if not enabled:
        yield lambda loss: None
        return
    from rich.progress import TextColumn

    from dgpo_edge.progress import add_stage, stage_progress

    # stderr, steps as the unit, an ETA that ignores the steps a resumed run had already done
    with stage_progress(transient=True, extra=(TextColumn("loss {task.fields[loss]}"),)) as bar:
        task = add_stage(bar, f"train {label}", "train", done, total, unit="steps", loss="-")
        yield lambda loss: bar.update(task, advance=1, loss=f"{loss:.4f}")
