"""`dgpo-edge train ppo | dgpo | grpo`: the reinforcement-learning loop.

One step:

1. **rollout** - this process's share of the step's questions (`batch.step_prompts`),
   `rollout.samples_per_prompt` episodes each, sampled by the student with the
   fast rollout engine (train/rollout.py; the same protocol code as the edge agent).
2. **score** - without gradients: the log-probs of the sampled tokens under the
   current student ("old", recomputed in training numerics), the critic's values,
   the reference's log-probs when `ppo.kl_ref` > 0, and - for the rollouts that
   receive DGPO's term (`teacher.threshold`, `teacher.apply_to`) and only for
   them - the teacher's log-probs.
3. **advantages** - token rewards (the exact-match score on the last generated
   token, minus beta * k_t on the tokens of selected rollouts), then GAE with a
   critic over `critic.value_mask`'s positions, whitened per `ppo.whiten` (ppo,
   dgpo; both the reference's way by default, see math.py), or group-normalised
   scores (grpo).
4. **update** - `ppo.epochs` passes over shuffled mini-batches of `ppo.mini_batch`
   rollouts, each accumulated over micro-batches: the clipped policy loss, the
   entropy bonus and (placement "loss") the teacher term for the actor; the
   clipped value loss for the critic; one optimizer step each per mini-batch.

Processes: one, DDP, or DeepSpeed ZeRO-2 with the actor and the critic as two DeepSpeed
engines (deepspeed.py; ZeRO-3 is refused).

The math is in math.py, the models in models.py (loading: train/models.py). Everything random is
seeded by (seed, step, process), and checkpoints/last holds the models,
optimizers, schedulers, RNG and the loop state, so a run killed at any point
and resumed logs the same metrics as one that never stopped (a test checks it).
Ctrl-C saves it at the last whole step first (plumbing.Interrupts); one during a dev evaluation
stops it and saves the step before it, which the resumed run evaluates first.
Metrics per step go to metrics.csv and TensorBoard; dev EM to eval.csv.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from dgpo_edge.errors import InputError

from . import deepspeed as rl_deepspeed
from . import math as rl_math
from .batch import StepBatch, by_length, pack, step_prompts, step_seed
from .config import RLConfig
from .models import (
    PolicyHead,
    check_no_dropout,
    check_same_tokenizer,
    frozen_logps,
    lm_full_vocab_kl,
    make_critic,
)
from ..compiled_layers import compile_models
from ..rollout import RolloutConfig, generate_rollouts, make_engine, observation_blocks
from ..rollout_copy import RolloutCopy, wants_copy
from ..models import load_frozen, load_lm, load_tokenizer
from ..plumbing import (
    Interrupts,
    Loggers,
    SaveClock,
    check_before_loading,
    evaluate_and_keep_best,
    lr_lambda,
    peak_memory_gb,
    prepare_run_dir,
    progress_bar,
    write_last,
    zero_stage,
)

RL_COLUMNS = ("step", "reward", "em", "answered", "response_length", "searches", "invalid_rate",
              "teacher_share", "kl_teacher", "kl_ref", "entropy", "policy_loss", "value_loss", "clip_frac",
              "approx_kl", "vf_clip_frac", "grad_norm", "critic_grad_norm", "lr", "critic_lr", "collapse",
              "time_rollout_s", "time_rollout_decode_s", "time_rollout_search_s", "time_logp_s", "time_critic_s",
              "time_teacher_s", "time_update_s", "time_step_s", "rollout_tokens_per_s", "elapsed_s", "peak_mem_gb")


@dataclass
class RLState:
    """What a resumed run needs besides the models, optimizers and RNG."""

    step: int = 0
    best: float | None = None
    best_step: int | None = None
    elapsed_s: float = 0.0
    eval_s: float = 0.0
    rollouts: int = 0
    collapse: dict = field(default_factory=dict)
    stopped: str | None = None
    eval_pending: bool = False   # saved by a Ctrl-C during this step's evaluation: the resumed run makes it first


class _Clock:
    """Wall-clock laps per phase (synchronising the GPU so a phase owns its kernels)."""

    def __init__(self, device: Any):
        self.cuda = device.type == "cuda"
        self.laps: dict[str, float] = {}
        self.t = self._now()

    def _now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def lap(self, name: str) -> None:
        now = self._now()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.t
        self.t = now


class RLTrainer:
    """Runs one `train ppo|dgpo|grpo` job; see the module docstring."""

    def __init__(self, config: RLConfig, on_step: Callable[[int, dict], None] | None = None):
        self.config = config
        self.on_step = on_step
        # Under DeepSpeed the critic's engine has an Accelerator of its own (deepspeed.py).
        self.acc, self.critic_acc = rl_deepspeed.make_rl_accelerators(config)
        self.deepspeed = zero_stage(self.acc) is not None
        self.out = Path(config.run.out_dir)
        self.ckpt = self.out / "checkpoints"
        self.bf16 = self.acc.mixed_precision == "bf16"
        self.world, self.rank = self.acc.num_processes, self.acc.process_index
        self._check_sizes()
        check_before_loading(config)
        self._load_data()
        self._load_models()
        self._setup_optim()
        self.state = RLState()
        self.save_clock = SaveClock(config.log.save_minutes)
        self.interrupts = Interrupts(self.acc)
        self.watch = rl_math.CollapseWatch(config.collapse.window, config.collapse.drop, config.collapse.min_best)

    # -- setup ---------------------------------------------------------------------------------
    def _check_sizes(self) -> None:
        """Refuse batch sizes the processes cannot split; set `micro_batch`, this process's."""
        c, world = self.config, self.world
        if c.rollout.prompts_per_step % world or c.ppo.mini_batch % world:
            raise InputError(f"rollout.prompts_per_step ({c.rollout.prompts_per_step}) and ppo.mini_batch "
                             f"({c.ppo.mini_batch}) must be multiples of the {world} processes")
        # A process's micro-batches are cut from its share of a mini-batch, so none is larger than that
        # share. Said, not refused: a config's micro-batch fits one GPU, and the shipped ones (mini 64,
        # micro 32) run on 8 (the config check refuses a micro-batch above the whole mini-batch).
        self.micro_batch = rl_deepspeed.micro_batches(c, world)[0]
        if self.micro_batch < c.ppo.micro_batch and self.rank == 0:
            print(f"ppo.micro_batch {c.ppo.micro_batch} is more than each process's {self.micro_batch} of "
                  f"ppo.mini_batch {c.ppo.mini_batch} over {world} processes: micro-batches of {self.micro_batch}")

    def _load_data(self) -> None:
        from dgpo_edge.datasets import read_qa

        from ..evaluation import open_retriever

        self.examples = read_qa(self.config.data.train, limit=self.config.data.limit)
        if not self.examples:
            raise InputError("no training questions", self.config.data.train)
        self.retriever = open_retriever(self.config.data.retriever)

    def _load_models(self) -> None:
        from ..lora import apply_lora, merged_copy

        c = self.config
        torch.manual_seed(c.run.seed)
        actor, self.tokenizer = load_lm(c.model.path, c.model.tokenizer, c.model.random_init, c.run.seed)
        check_no_dropout(actor, c.model.path)   # RL scores and updates in training mode: before more loads
        if c.model.gradient_checkpointing:
            actor.gradient_checkpointing_enable()
        self.pad_id = self.tokenizer.pad_token_id
        device = self.acc.device
        # The starting student. With lora.init_from, model.path is the adapter's base, so the
        # student is base + adapter, merged into a plain model for the critic and the reference.
        student = merged_copy(apply_lora(actor, c.lora)) if c.lora.init_from else actor
        self.critic = None
        if c.uses_critic:  # a second copy of the student (same seed for a random init)
            if c.lora.init_from and not c.critic.path:
                body = copy.deepcopy(student)
            else:
                body, _ = load_lm(c.critic.path or c.model.path, c.model.tokenizer, c.model.random_init, c.run.seed)
            if c.model.gradient_checkpointing:
                body.gradient_checkpointing_enable()
            self.critic = make_critic(body)
        self.reference = None
        if c.ppo.kl_ref > 0:  # the starting student, frozen: a copy, not a second load from disk
            self.reference = _frozen_copy(student, device, self.bf16)
        if not c.lora.init_from:
            apply_lora(actor, c.lora)  # after the copy: the reference has no adapters
        del student
        self.teacher = None
        if c.uses_teacher:  # the cheap tokenizer check before the weights
            check_same_tokenizer(self.tokenizer, load_tokenizer(c.teacher.path), c.teacher.path)
            self.teacher, _ = load_frozen(c.teacher.path, device, self.bf16, c.teacher.load_in_8bit)
        if self.critic is not None:   # the actor was checked as it loaded
            check_no_dropout(self.critic, c.critic.path or c.model.path)
        self._actor = actor

    def _setup_optim(self) -> None:
        o, c = self.config.optim, self.config
        policy = PolicyHead(self._actor, c.head_rows)
        adam = lambda params, lr: torch.optim.AdamW(params, lr=lr, betas=(o.beta1, o.beta2), eps=o.eps,  # noqa: E731
                                                    weight_decay=o.weight_decay)
        schedule = lambda opt, warm: torch.optim.lr_scheduler.LambdaLR(  # noqa: E731
            opt, lr_lambda(o.steps, round(warm * o.steps), o.schedule))
        actor_opt = adam([p for p in policy.parameters() if p.requires_grad], o.lr)  # LoRA: adapters only
        self.actor_sched = schedule(actor_opt, o.warmup_ratio)
        (self._prepare_engines if self.deepspeed else self._prepare_ddp)(policy, actor_opt, adam, schedule)
        # The rollout engine reads its model's parameters in place (the actor's, or the bf16 copy's,
        # refreshed in place after each optimizer step): its CUDA graphs stay valid, so one engine
        # serves the whole run.
        r = c.rollout
        self.rollout_config = RolloutConfig(
            protocol=c.protocol, temperature=r.temperature, top_p=r.top_p, batch_size=r.batch_size, engine=r.engine,
            attention=r.attention, fused_sampling=r.fused_sampling, layers=r.layers, lm_head=r.lm_head,
            reuse_cache=r.reuse_cache, chat_template=c.data.chat_template)
        self.rollout_copy = RolloutCopy(self.lm) if wants_copy(r.weights, self.acc) else None
        self.engine = make_engine(self.rollout_lm, self.tokenizer, self.rollout_config)
        self.blocks = observation_blocks(self.tokenizer)   # kept across steps: passages come back
        if c.ppo.compile:   # after the rollout copy and the engine were made from the eager layers
            frozen = [] if c.teacher.load_in_8bit else [self.teacher]
            compile_models([self.lm, self.critic, *frozen], "ppo.compile")

    def _prepare_ddp(self, policy: Any, actor_opt: Any, adam: Callable, schedule: Callable) -> None:
        """One process, or DDP: actor and critic prepared together by the one Accelerator."""
        o = self.config.optim
        if self.critic is not None:
            critic_opt = adam(self.critic.parameters(), o.critic_lr)
            self.critic_sched = schedule(critic_opt, o.critic_warmup_ratio)
            self.policy, self.actor_opt, self.critic, self.critic_opt = self.acc.prepare(
                policy, actor_opt, self.critic, critic_opt)
            self.acc.register_for_checkpointing(self.critic_sched)
        else:
            self.policy, self.actor_opt = self.acc.prepare(policy, actor_opt)
            self.critic_opt = self.critic_sched = None
        self.acc.register_for_checkpointing(self.actor_sched)

    def _prepare_engines(self, policy: Any, actor_opt: Any, adam: Callable, schedule: Callable) -> None:
        """DeepSpeed: the actor and the critic each prepared by its own Accelerator (deepspeed.py);
        the schedulers stay on the raw AdamW, whose learning rate the engines' optimizers read."""
        o = self.config.optim
        self.policy, self.actor_opt = rl_deepspeed.prepare(self.acc, "actor", policy, actor_opt, self.config)
        self.acc.register_for_checkpointing(self.actor_sched)
        self.critic_opt = self.critic_sched = None
        if self.critic is not None:
            critic_opt = adam(self.critic.parameters(), o.critic_lr)
            self.critic_sched = schedule(critic_opt, o.critic_warmup_ratio)
            self.critic, self.critic_opt = rl_deepspeed.prepare(self.critic_acc, "critic", self.critic, critic_opt,
                                                                self.config)
            self.critic_acc.register_for_checkpointing(self.critic_sched)

    def _states(self) -> dict | None:
        """Under DeepSpeed, each engine's Accelerator with its folder under checkpoints/last/state."""
        if not self.deepspeed:
            return None
        return {"actor": self.acc, **({"critic": self.critic_acc} if self.critic is not None else {})}

    @property
    def rollout_lm(self) -> Any:
        """The model rollouts are decoded with: the bf16 copy, or the actor itself."""
        return self.lm if self.rollout_copy is None else self.rollout_copy.model

    def _eval_decoder(self) -> tuple[Any, Any]:
        """The model and engine the evaluations decode with: the rollouts' own (the bf16 copy, synced
        after every step, through the engine whose graphs are already captured) unless eval.engine
        asks for another decoder or eval.weights for the training weights; then the training
        weights, with an engine of their own per call.
        (With an engine of its own over the fp32 weights, a FactbookQA evaluation of 300 dev and 740
        test questions in batches of 150 took about 95 s on an H100 shared by two runs, where a
        step's 128 rollouts took 1.2 s.)"""
        e = self.config.eval
        if e.weights != "training" and e.engine in ("auto", self.config.rollout.engine):
            return self.rollout_lm, self.engine
        return self.lm, None

    def _sync_rollout_copy(self) -> None:
        if self.rollout_copy is not None:
            self.rollout_copy.sync(self.lm)

    @property
    def lm(self) -> Any:
        """The bare causal LM being trained."""
        return self.acc.unwrap_model(self.policy).lm

    def eval_fn(self) -> Callable[..., dict] | None:
        """Greedy dev EM with this run's own episode limits (the `protocol` section its rollouts use),
        so a run is evaluated on the kind of episode it trains on (and data.report for the record);
        None without data.dev and data.report."""
        from ..evaluation import make_eval_fn

        return make_eval_fn(self.config, self.tokenizer)

    # -- the loop --------------------------------------------------------------------------------
    def train(self) -> dict:
        """Run to `optim.steps` (or a collapse stop), resuming from checkpoints/last when present."""
        eval_fn = self.eval_fn()   # first: a bad dev or report file stops the run before its folder is touched
        saved = prepare_run_dir(self.acc, self.config, self.out, states=self._states())
        if saved is not None:
            self.state = RLState(**saved)
            self.interrupts.saved = self.state.step
            self.watch.load_state_dict(self.state.collapse)
            self._sync_rollout_copy()   # the actor's weights were just restored
        logger = Loggers(self.config, self.out, self.acc.is_main_process, self.state.step,
                         self.state.eval_pending)
        t_start = time.perf_counter() - self.state.elapsed_s
        total = self.config.optim.steps
        try:
            if eval_fn and self.config.eval.at_start and self.state.step == 0:
                self._evaluate(eval_fn, logger)   # in the try: stopped here, the line says what this run left
            self.save_clock.saved()   # log.save_minutes count training, not loading and a first evaluation
            with self.interrupts.watch(), progress_bar(self.acc.is_main_process, total, self.state.step,
                                                       self.config.algorithm, shows="reward",
                                                       bar=self.config.log.progress) as advance:
                if self.state.eval_pending:   # the saved step's evaluation, which a Ctrl-C stopped
                    self._after_step(eval_fn, logger)
                while self.state.step < total and self.state.stopped is None:
                    self.interrupts.step_begins(self.state.step + 1)
                    row = self.step()
                    self.state.step += 1
                    self.state.elapsed_s = time.perf_counter() - t_start
                    row.update(step=self.state.step, elapsed_s=round(self.state.elapsed_s, 2),
                               peak_mem_gb=round(peak_memory_gb(), 3))
                    self._watch_collapse(row)
                    advance(row["reward"])
                    if self.state.step % self.config.log.every == 0 or self.state.step == total:
                        logger.train_row(row, RL_COLUMNS)
                    self._after_step(eval_fn, logger)
                    if self.on_step:
                        self.on_step(self.state.step, row)
                    self.interrupts.step_ends()   # last: a Ctrl-C in the update waits for the save
        except KeyboardInterrupt:
            logger.close()
            self.interrupts.stop(self.state.step, self.save_last,
                                 self.interrupts.last_holds(self.ckpt / "last", self.config.run.resume))
        self.state.elapsed_s = time.perf_counter() - t_start
        logger.close()
        summary = self._summary()
        self.acc.end_training()  # the process group, under a distributed launch
        return summary

    def step(self) -> dict:
        """One RL step on this process; returns the metric row (averaged over processes)."""
        clock = _Clock(self.acc.device)
        batch, rollouts = self._rollouts(self.state.step)
        clock.lap("rollout")
        scored = self._score(batch, clock)
        stats = self._update(batch, scored)
        self._sync_rollout_copy()
        clock.lap("update")
        row = self._metrics(batch, rollouts, scored, stats)
        row.update({f"time_{k}_s": round(v, 3) for k, v in clock.laps.items()})
        row["time_step_s"] = round(sum(clock.laps.values()), 3)
        row["rollout_tokens_per_s"] = round(row.pop("_generated") / max(clock.laps["rollout"], 1e-9), 1)
        # inside the rollout: the engine's calls and the searches (the rest is host work between turns)
        row.update({f"time_rollout_{k}_s": round(v, 3) for k, v in self._rollout_timings.items()})
        self.state.rollouts += len(rollouts) * self.world
        return row

    # -- 1. rollouts -------------------------------------------------------------------------------
    def _rollouts(self, step: int) -> tuple[StepBatch, list]:
        c = self.config
        picks = step_prompts(len(self.examples), c.rollout.prompts_per_step, step, c.run.seed, self.rank, self.world)
        n = c.rollout.samples_per_prompt
        chosen = [self.examples[i] for i in picks for _ in range(n)]
        groups = [i for i in picks for _ in range(n)]
        config = replace(self.rollout_config, seed=step_seed(c.run.seed, step, self.rank))
        self._rollout_timings = {"decode": 0.0, "search": 0.0}
        rollouts = generate_rollouts(self.rollout_lm, self.tokenizer, [e.question for e in chosen],
                                     [tuple(e.answers) for e in chosen], self.retriever, config, engine=self.engine,
                                     timings=self._rollout_timings, blocks=self.blocks)
        return pack(rollouts, groups, self.pad_id, self.acc.device, c.ppo.pad_to_multiple), rollouts

    # -- 2. scoring and advantages ----------------------------------------------------------------
    @torch.no_grad()
    def _score(self, batch: StepBatch, clock: _Clock) -> dict:
        """old log-probs, values, reference and teacher terms, rewards, advantages ([B, L] each)."""
        c = self.config
        self._train_mode()   # as the update will be: one mode, so compiled layers need no eval-mode graph
        out: dict[str, Any] = {"old_logp": self._forward_all(lambda b: self.policy(
            b.input_ids, b.attention_mask, b.mask, c.rollout.temperature)[0], batch)}
        clock.lap("logp")
        penalty = torch.zeros_like(batch.mask)
        if self.reference is not None:
            ref = self._forward_all(lambda b: frozen_logps(self.reference, b.input_ids, b.attention_mask, b.mask,
                                                           c.rollout.temperature, c.head_rows), batch)
            out["kl_ref"] = rl_math.teacher_kl(out["old_logp"], ref, "k1")
            penalty = penalty + c.ppo.kl_ref * out["kl_ref"] * batch.mask
        if self.critic is not None:
            out["values"] = self._forward_all(lambda b: self.critic(b.input_ids, b.attention_mask), batch)
            out["value_mask"] = rl_math.value_mask(batch.attention_mask, batch.mask, c.critic.value_mask)
            clock.lap("critic")
        out["rows"] = torch.zeros_like(batch.scores, dtype=torch.bool)
        if self.teacher is not None:
            out.update(self._teacher_terms(batch, out["old_logp"]))
            clock.lap("teacher")
            if c.teacher.placement == "reward":
                penalty = penalty + rl_math.teacher_penalty(out["kl_teacher"], batch.mask, out["rows"],
                                                            c.teacher.beta)
        out["penalty"] = penalty
        out["rewards"] = rl_math.token_rewards(batch.scores, batch.mask, penalty)
        out["advantages"], out["returns"] = self._advantages(batch, out)
        return out

    def _teacher_terms(self, batch: StepBatch, old_logp: torch.Tensor) -> dict:
        """k_t for the rows that receive the term; the teacher runs on those rows only."""
        t = self.config.teacher
        rows = rl_math.selective_rows(batch.scores, t.threshold, t.apply_to)
        kl = torch.zeros_like(batch.mask)
        teacher_logp = torch.zeros_like(batch.mask)
        index = rows.nonzero()[:, 0]
        if len(index):
            sub = batch.rows(index)
            width = sub.input_ids.shape[1]
            if t.estimator in rl_math.KL_ESTIMATORS:
                lp = self._forward_all(lambda b: frozen_logps(self.teacher, b.input_ids, b.attention_mask, b.mask,
                                                              self.config.rollout.temperature,
                                                              self.config.head_rows), sub)
                teacher_logp[index, :width] = lp
                kl[index, :width] = rl_math.teacher_kl(old_logp[index, :width], lp, t.estimator)
            else:
                direction = t.estimator.split("_")[0]
                kl[index, :width] = self._forward_all(lambda b: lm_full_vocab_kl(
                    self.lm, self.teacher, b.input_ids, b.attention_mask, b.mask, direction,
                    self.config.rollout.temperature, self.config.head_rows), sub)
        return {"rows": rows, "kl_teacher": kl * batch.mask, "teacher_logp": teacher_logp}

    def _advantages(self, batch: StepBatch, s: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        p = self.config.ppo
        if self.critic is not None:  # GAE steps through the critic's positions (critic.value_mask)
            adv, ret = rl_math.gae(s["rewards"].cpu(), s["values"].cpu(), s["value_mask"].cpu(), p.gamma, p.lam)
            adv, ret = adv.to(batch.mask.device), ret.to(batch.mask.device)
            return rl_math.whiten_advantages(adv, batch.mask, batch.attention_mask, p.whiten, self._sum), ret
        # GRPO: the group-normalised score on every generated token, minus the penalty still to
        # come on that row (the teacher term as a return-to-go, undiscounted, not normalised).
        group = rl_math.grpo_advantages(batch.scores, batch.groups)
        to_go = s["penalty"].flip(-1).cumsum(-1).flip(-1)
        return (group[:, None] - to_go) * batch.mask, None

    def _train_mode(self) -> None:
        """Actor and critic in training mode for scoring and the update alike. The models load in eval
        mode, so step 1's old log-probs and values used to run in eval mode and later steps' in
        training mode: the same numbers without dropout, but under ppo.compile one more graph per pass,
        compiled inside step 2."""
        self.policy.train()
        if self.critic is not None:
            self.critic.train()

    def _sum(self, value: torch.Tensor) -> torch.Tensor:
        """`value` summed over all processes (the global batch's statistics for ppo.whiten=reference)."""
        return self.acc.reduce(value, "sum") if self.world > 1 else value

    @property
    def forward_rows(self) -> int:
        """Rows per no-gradient pass: ppo.forward_batch, 0 meaning ppo.micro_batch as configured (not
        cut to a process's share of a mini-batch: these passes are not part of one)."""
        return self.config.ppo.forward_batch or self.config.ppo.micro_batch

    def _forward_all(self, fn: Callable[[StepBatch], torch.Tensor], batch: StepBatch) -> torch.Tensor:
        """fn over batches of `ppo.forward_batch` rows (no gradients kept), reassembled into [B, L]."""
        size = self.forward_rows
        out = torch.zeros_like(batch.mask)
        rows = torch.arange(batch.input_ids.shape[0], device=batch.mask.device)
        order = by_length(rows, batch.attention_mask)   # similar lengths together: little padding
        for i in range(0, len(order), size):
            index = order[i:i + size]
            sub = batch.rows(index)
            with self._autocast():
                out[index, :sub.input_ids.shape[1]] = fn(sub).float()
        return out

    def _autocast(self):
        return torch.autocast(self.acc.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    # -- 4. update ----------------------------------------------------------------------------------
    def _update(self, batch: StepBatch, s: dict) -> dict:
        """ppo.epochs passes of mini-batch steps; returns token-weighted mean stats."""
        c = self.config
        n = batch.input_ids.shape[0]
        per_mini = c.ppo.mini_batch // self.world   # rollouts per optimizer step on this process
        totals: dict[str, float] = {}
        self._train_mode()
        for epoch in range(c.ppo.epochs):
            g = torch.Generator().manual_seed(step_seed(c.run.seed, self.state.step, self.rank, 1000 + epoch))
            perm = torch.randperm(n, generator=g).to(batch.mask.device)
            for start in range(0, n, per_mini):
                stats = self._mini_batch(batch, s, perm[start:start + per_mini])
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
        self.actor_sched.step()
        if self.critic_sched is not None:
            self.critic_sched.step()
        weight = totals.pop("_tokens", 0.0) or 1.0
        steps = totals.pop("_steps", 1.0)
        out = {k: v / weight for k, v in totals.items() if not k.endswith("grad_norm")}
        out.update({k: v / steps for k, v in totals.items() if k.endswith("grad_norm")})
        return out

    def _mini_batch(self, batch: StepBatch, s: dict, index: torch.Tensor) -> dict:
        """One optimizer step of actor (and critic) over the rows `index`, in micro-batches."""
        c = self.config
        tokens = float(batch.mask[index].sum().clamp(min=1))
        # The critic's loss is a mean over its own positions (critic.value_mask), weighted the same way.
        value_tokens = float(s["value_mask"][index].sum().clamp(min=1)) if "value_mask" in s else 1.0
        stats = {"_tokens": 0.0, "_steps": 1.0}
        # The mini-batch's gradient is a token-weighted sum over its micro-batches, whatever rows each
        # holds: micro-batches of similar lengths compute less padding for the same update.
        index = by_length(index, batch.attention_mask)
        micros = [index[i:i + self.micro_batch] for i in range(0, len(index), self.micro_batch)]
        for j, micro in enumerate(micros):
            sub = batch.rows(micro)
            width = sub.input_ids.shape[1]
            cut = {k: v[micro, :width] for k, v in s.items() if torch.is_tensor(v) and v.dim() == 2}
            # token means over the whole mini-batch: actor over generated tokens, critic over its positions
            shares = (float(sub.mask.sum()) / tokens,
                      float(cut["value_mask"].sum()) / value_tokens if "value_mask" in cut else 0.0)
            sync = j == len(micros) - 1
            for k, v in self._micro_losses(sub, cut, s["rows"][micro], shares, sync).items():
                stats[k] = stats.get(k, 0.0) + v * float(sub.mask.sum())
            stats["_tokens"] += float(sub.mask.sum())
        stats["grad_norm"] = self._clip_and_step(self.policy, self.actor_opt)
        if self.critic is not None:
            stats["critic_grad_norm"] = self._clip_and_step(self.critic, self.critic_opt)
        return stats

    def _micro_losses(self, sub: StepBatch, s: dict, rows: torch.Tensor, shares: tuple[float, float],
                      sync: bool) -> dict:
        """Backward of the actor (and critic) losses of one micro-batch, weighted by `shares` (its part
        of the mini-batch's actor and critic token means); returns its stats."""
        c = self.config
        share, value_share = shares
        with self._no_sync(self.policy, sync), self._autocast():
            logp, entropy = self.policy(sub.input_ids, sub.attention_mask, sub.mask, c.rollout.temperature, True)
        pl, pstats = rl_math.policy_loss(logp, s["old_logp"], s["advantages"], sub.mask, c.ppo.clip)
        ent = rl_math.masked_mean(entropy, sub.mask)
        loss = pl - c.ppo.entropy * ent
        if self.teacher is not None and c.teacher.placement == "loss":
            loss = loss + c.teacher.beta * rl_math.kl_penalty_loss(logp, s["teacher_logp"], sub.mask, rows,
                                                                   c.teacher.estimator)
        self._backward(self.policy, loss * share, sync)
        stats = {"policy_loss": float(pl.detach()), "entropy": float(ent.detach()), **pstats}
        if self.critic is not None:
            with self._no_sync(self.critic, sync), self._autocast():
                values = self.critic(sub.input_ids, sub.attention_mask)
            vl, vstats = rl_math.value_loss(values, s["values"], s["returns"], s["value_mask"], c.ppo.value_clip)
            self._backward(self.critic, vl * value_share, sync)
            stats.update(value_loss=float(vl.detach()), **vstats)
        return stats

    def _no_sync(self, module: Any, sync: bool):
        """Skip DDP's gradient all-reduce on all but the last micro-batch of a mini-batch
        (DeepSpeed: the engine's own boundary does that, see `_backward`)."""
        if sync or self.world == 1 or self.deepspeed:
            return contextlib.nullcontext()
        return self.acc.no_sync(module)

    def _backward(self, module: Any, loss: torch.Tensor, sync: bool) -> None:
        """Accumulate the gradients of one micro-batch; `sync` marks the mini-batch's last."""
        if self.deepspeed:
            rl_deepspeed.backward(module, loss, sync)
            return
        with self._no_sync(module, sync):
            self.acc.backward(loss)

    def _clip_and_step(self, module: Any, optimizer: Any) -> float:
        self.interrupts.commit()   # the weights change from here on
        if self.deepspeed:
            return rl_deepspeed.step(module)
        norm = float("nan")
        if self.config.optim.grad_clip > 0:
            value = self.acc.clip_grad_norm_(module.parameters(), self.config.optim.grad_clip)
            norm = float(value) if value is not None else norm
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    # -- metrics, evaluation, checkpoints -------------------------------------------------------------
    def _metrics(self, batch: StepBatch, rollouts: list, s: dict, stats: dict) -> dict:
        mask = batch.mask
        rows = s["rows"]
        turns = sum(len(r.transcript.turns()) for r in rollouts)
        local = {
            "reward": float(s["rewards"].sum(1).mean()),   # score minus the penalties, per rollout
            "em": float(batch.scores.mean()),
            "answered": sum(r.answer is not None for r in rollouts) / len(rollouts),
            "response_length": float(mask.sum(1).mean()),
            "searches": sum(r.n_searches for r in rollouts) / len(rollouts),
            "invalid_rate": sum(r.n_invalid for r in rollouts) / max(turns, 1),
            "teacher_share": float(rows.float().mean()),
            "kl_teacher": float(rl_math.masked_mean(s["kl_teacher"], mask * rows[:, None])) if "kl_teacher" in s
            else float("nan"),
            "kl_ref": float(rl_math.masked_mean(s["kl_ref"], mask)) if "kl_ref" in s else float("nan"),
            **stats,
            "_generated": float(mask.sum()),
        }
        names = sorted(local)
        reduced = self.acc.reduce(torch.tensor([local[k] for k in names], device=self.acc.device), "mean")
        row = dict(zip(names, (float(v) for v in reduced)))
        row["_generated"] *= self.world
        row["lr"] = self.actor_sched.get_last_lr()[0]
        row["critic_lr"] = self.critic_sched.get_last_lr()[0] if self.critic_sched else float("nan")
        return row

    def _watch_collapse(self, row: dict) -> None:
        alarm = self.watch.update(row["reward"])
        row["collapse"] = int(alarm)
        self.state.collapse = self.watch.state_dict()
        if alarm and self.acc.is_main_process:
            print(f"warning: reward collapse at step {self.state.step}: moving average far below its best "
                  f"{self.watch.best:.4f}" + ("; stopping (collapse.stop)" if self.config.collapse.stop else ""))
        if alarm and self.config.collapse.stop:
            self.state.stopped = f"collapse at step {self.state.step}"

    def _after_step(self, eval_fn: Any, logger: Any) -> None:
        step, every = self.state.step, self.config.eval.every
        at_end = step == self.config.optim.steps or self.state.stopped is not None
        evaluated = bool(eval_fn) and ((every and step % every == 0) or at_end)
        if evaluated:
            self._evaluate(eval_fn, logger)
        save_every = self.config.log.save_every
        timed = self.save_clock.due(self.acc)   # on every process at every step (a broadcast)
        if at_end or evaluated or timed or (save_every and step % save_every == 0):
            self.save_last()

    def _evaluate(self, eval_fn: Any, logger: Any) -> None:
        from ..lora import save_checkpoint

        def evaluate() -> dict:
            with self.interrupts.evaluating():
                model, engine = self._eval_decoder()
                return eval_fn(model, self.state.step, engine)

        evaluate_and_keep_best(self.acc, self.state, evaluate, logger, self.config.eval.best_metric,
                               lambda metrics: save_checkpoint(self.lm, self.tokenizer, self.ckpt / "best",
                                                               extra=self._provenance(metrics)))

    def _provenance(self, metrics: dict | None = None) -> dict:
        from dgpo_edge.jsonio import file_digest

        if not hasattr(self, "_data_digest"):  # hashed once, not at every checkpoint
            self._data_digest = {"path": str(self.config.data.train), **file_digest(self.config.data.train)}
        return {"made_by": f"dgpo-edge train {self.config.algorithm}", "step": self.state.step,
                "metrics": metrics or {}, "config": str(self.out / "config.yaml"), "train_data": self._data_digest}

    def save_last(self, eval_pending: bool = False) -> None:
        """checkpoints/last; `eval_pending`: the step's evaluation was stopped, for the resumed run to make."""
        self.state.eval_pending = eval_pending
        write_last(self.acc, self.ckpt, self.lm, self.tokenizer, asdict(self.state), self._provenance(),
                   states=self._states())
        self.save_clock.saved()
        self.interrupts.saved = self.state.step

    def _summary(self) -> dict:
        from dgpo_edge.jsonio import write_json

        s = self.state
        summary = {"algorithm": self.config.algorithm, "steps": s.step, "rollouts": s.rollouts,
                   "elapsed_s": round(s.elapsed_s, 2), "eval_s": round(s.eval_s, 2),
                   "peak_mem_gb": round(peak_memory_gb(), 3), "best": s.best, "best_step": s.best_step,
                   "best_metric": self.config.eval.best_metric, "stopped": s.stopped, "processes": self.world}
        if self.acc.is_main_process:
            write_json(self.out / "summary.json", summary)
        return summary


def _frozen_copy(model: Any, device: Any, bf16: bool) -> Any:
    ref = copy.deepcopy(model).to(device=device, dtype=torch.bfloat16 if bf16 else torch.float32)
    ref.requires_grad_(False)
    return ref.eval()


def run_rl(config: RLConfig, on_step: Callable[[int, dict], None] | None = None) -> dict:
    """Train per `config`; returns the summary (also written to out_dir/summary.json)."""
    return RLTrainer(config, on_step).train()
