"""The config of `dgpo-edge train ppo | dgpo | grpo`: one dataclass, grouped sections.

The three commands share one config tree; the command names the algorithm:

- `ppo`  PPO with a critic (a value head on a copy of the student) and GAE.
- `dgpo` `ppo` plus the selective teacher term (`teacher` section).
- `grpo` several samples per question, group-normalised advantages, no critic;
         the teacher term applies too when `teacher.path` is set.

Defaults are the paper's hyperparameters where they exist (listed with the
method in docs/architecture.md#dgpo-as-implemented-here); the
shipped YAML files (train/configs/) scale batch sizes to one GPU. Loading,
overrides and error reporting are config.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dgpo_edge.protocol import ProtocolConfig

from ..config import EvalSection, LogSection, LoRASection, ModelSection, RunSection, Schedule, read_config_yaml
from ..decoding import AttentionChoice, DecoderChoice, LayerChoice, LMHeadChoice

# The episode limits that moved from `rollout` into the `protocol` section (read with a warning).
PROTOCOL_KEYS = ("top_k", "max_searches", "max_turn_tokens", "max_obs_tokens", "max_total_tokens")


@dataclass
class RLDataSection:
    """Questions to train and evaluate on, and the search engine."""

    train: str = ""              # QA file (any format dgpo_edge.datasets reads): questions + gold answers
    dev: str | None = None       # QA file for greedy dev EM
    retriever: str = ""          # an index dir (open_index) or a corpus .jsonl (BM25 in memory)
    limit: int | None = None     # use only the first N training questions
    dev_limit: int | None = 200  # evaluate on the first N dev questions
    # QA file evaluated beside dev at every evaluation, for the record only (report.jsonl: EM per
    # type, per-question scores); nothing chooses by it, so it may be the test split
    report: str | None = None
    report_limit: int | None = None  # the first N report questions (None: all)
    chat_template: bool = True   # wrap the Search-R1 prompt in the tokenizer's chat template


@dataclass
class RolloutSection:
    """How episodes are sampled each step (their limits: the `protocol` section)."""

    prompts_per_step: int = 512  # questions per step, over all processes (split across ranks)
    samples_per_prompt: int = 1  # rollouts per question (GRPO needs >= 2; PPO/DGPO use 1)
    temperature: float = 1.0
    top_p: float = 1.0
    batch_size: int = 256        # episodes decoded together
    engine: DecoderChoice = "auto"  # auto | fast (static cache, CUDA graphs) | plain
    # What the engine decodes with: a bf16 copy of the actor refreshed after every optimizer step
    # (train/rollout_copy.py), or the training weights themselves; auto = the copy for bf16 runs on
    # a GPU. Old log-probs are recomputed from the training weights either way.
    weights: Literal["auto", "bf16_copy", "training"] = "auto"
    # The fast engine's kernels: fused SDPA or the two-matmul attention; sampling compiled by
    # torch.compile (on CUDA) or eager. The defaults are the faster ones (docs/benchmarks.md).
    attention: AttentionChoice = "sdpa"
    fused_sampling: bool = True
    layers: LayerChoice = "auto"    # auto: train/fast_layers.py through torch.compile on CUDA (else the modules)
    lm_head: LMHeadChoice = "auto"  # auto: a transposed copy of the LM head on CUDA
    # An episode's later turns keep the fast engine's cache of the earlier ones and prefill only the
    # appended observation, not the whole conversation (train/fast_decode.py). On by default since it
    # was measured: 1.43x the tokens/s of the whole prefill at the paper's episode shape, the same
    # tokens (docs/benchmarks.md, "The kept cache, measured").
    reuse_cache: bool = True


@dataclass
class PPOSection:
    """The policy-gradient update."""

    epochs: int = 1              # passes over each step's rollouts
    mini_batch: int = 256        # rollouts per optimizer step (over all processes)
    micro_batch: int = 8         # rollouts per forward/backward (per process); above a process's share of a mini-batch, that share
    forward_batch: int = 0       # rollouts per no-grad pass (old log-probs, values, reference, teacher); 0 = micro_batch
    # Each micro-batch is cut to its longest row, rounded up to a multiple of this: fewer distinct
    # shapes, so attention kernels that plan per shape (cuDNN's) reuse their plans; 1 = no rounding.
    pad_to_multiple: int = 1
    # torch.compile the decoder layers of the actor, the critic and the teacher (dynamic shapes; train/compiled_layers.py)
    # for the update and the no-grad passes: fused elementwise kernels, the same math up to rounding;
    # the first step pays the compilation.
    compile: bool = False
    clip: float = 0.2            # policy ratio clip
    value_clip: float = 0.5      # critic clip around the old values
    entropy: float = 0.001       # entropy bonus coefficient
    gamma: float = 1.0           # GAE discount
    lam: float = 1.0             # GAE lambda
    kl_ref: float = 0.0          # coefficient of a KL-to-reference (frozen start) reward penalty; 0 = off
    # Advantage whitening (docs/rl.md): reference = over the response mask (observations included),
    # unbiased variance, global batch (all processes), as the reference DGPO code; generated = over
    # generated tokens only, biased variance, per process (the older behaviour); none = off.
    whiten: Literal["reference", "generated", "none"] = "reference"


@dataclass
class TeacherSection:
    """DGPO's selective teacher term."""

    path: str = ""               # teacher model (same tokenizer as the student); required for dgpo
    beta: float = 0.001          # weight of the term
    threshold: float = 0.1       # rollouts scoring below this receive it (failed ones)
    apply_to: Literal["failed", "all"] = "failed"  # failed | all (the "uniform KL" ablation)
    # k1 | k3 (one-sample estimates) | reverse_full | forward_full (full-vocabulary KL)
    estimator: Literal["k1", "k3", "reverse_full", "forward_full"] = "k1"
    # reward (subtracted from token rewards) | loss (added to the actor loss)
    placement: Literal["reward", "loss"] = "reward"
    load_in_8bit: bool = False   # load the teacher in 8 bits (needs bitsandbytes and a GPU)


@dataclass
class RLOptimSection:
    """AdamW for the actor and the critic, each with warmup then a schedule."""

    steps: int = 1000            # RL steps (each: rollouts, then the update), at most MAX_STEPS
    lr: float = 1e-6             # actor
    critic_lr: float = 1e-5
    warmup_ratio: float = 0.285  # actor warmup, share of all steps
    critic_warmup_ratio: float = 0.0
    schedule: Schedule = "constant"  # constant | cosine | linear (after warmup)
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: float = 1.0       # max global grad norm per model; 0 = off


@dataclass
class CriticSection:
    """The value model: a copy of the student's body with a one-output head."""

    path: str | None = None      # defaults to model.path (the paper's critic starts from the student)
    # Positions of the value loss and of GAE (docs/rl.md): reference = every state from the first
    # generated token on, observations and the terminal position included (the attention mask
    # shifted by one), as the reference DGPO code; generated = generated tokens only (older behaviour).
    value_mask: Literal["reference", "generated"] = "reference"


@dataclass
class CollapseSection:
    """Reward collapse detection: the moving average far below its running best."""

    window: int = 10             # steps in the moving average
    drop: float = 0.5            # alarm when the average < (1 - drop) x best
    min_best: float = 0.05       # no alarm before the best average reaches this
    stop: bool = False           # stop the run (after saving) instead of only warning


@dataclass
class RLLogSection(LogSection):
    """Metrics and checkpoints (a metric row every step by default: RL steps are long)."""

    every: int = 1


@dataclass
class RLConfig:
    """`dgpo-edge train ppo|dgpo|grpo`: reinforcement learning of a search agent."""

    algorithm: Literal["ppo", "dgpo", "grpo"] = "dgpo"  # set by the command; a YAML value must agree with it
    run: RunSection = field(default_factory=RunSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: RLDataSection = field(default_factory=RLDataSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)  # episode limits: rollouts and dev EM
    ppo: PPOSection = field(default_factory=PPOSection)
    teacher: TeacherSection = field(default_factory=TeacherSection)
    critic: CriticSection = field(default_factory=CriticSection)
    optim: RLOptimSection = field(default_factory=RLOptimSection)
    eval: EvalSection = field(default_factory=EvalSection)
    log: RLLogSection = field(default_factory=RLLogSection)
    collapse: CollapseSection = field(default_factory=CollapseSection)
    lora: LoRASection = field(default_factory=LoRASection)  # the actor's adapters (the critic trains fully)
    head_rows: int = 2048        # generated positions per LM-head pass: each holds [rows, vocabulary] fp32 logits

    MOVED_KEYS = tuple((f"rollout.{k}", f"protocol.{k}") for k in PROTOCOL_KEYS)

    @property
    def stage(self) -> str:
        return self.algorithm

    @property
    def uses_critic(self) -> bool:
        return self.algorithm in ("ppo", "dgpo")

    @property
    def uses_teacher(self) -> bool:
        return self.algorithm == "dgpo" or (self.algorithm == "grpo" and bool(self.teacher.path))


def _lora_dropout(lora: LoRASection) -> float:
    """The adapters' dropout: lora.dropout, or for lora.init_from the saved adapter's (train/lora.py
    load_adapter applies that one)."""
    if lora.init_from:   # validate_lora has checked that the file exists
        from ..lora import adapter_config

        return float(adapter_config(lora.init_from).get("lora_dropout") or 0)
    return lora.dropout


def validate_rl(config: RLConfig, path) -> None:
    """Presence and range checks, each naming the key (InputError -> exit status 2)."""
    from dgpo_edge.errors import InputError

    from ..config import validate_lora, validate_schedule, validate_seed_and_limits, validate_steps

    def bad(key: str, why: str) -> None:
        raise InputError(f"key {key!r} {why}", path)

    for key, value in (("run.out_dir", config.run.out_dir), ("model.path", config.model.path),
                       ("data.train", config.data.train), ("data.retriever", config.data.retriever)):
        if not value:
            bad(key, "is required")
    validate_seed_and_limits(config, bad)
    if config.model.compile:   # shared with SFT/KD's ModelSection; RL's switch also covers critic and teacher
        bad("model.compile", "is for `train sft` and `train kd`; RL compiles the actor, critic and teacher "
                             "with ppo.compile")
    _validate_ppo(config.ppo, bad)   # first: the rollout checks divide by ppo.mini_batch
    _validate_rollout(config, bad)
    validate_lora(config.lora, bad)
    if _lora_dropout(config.lora):   # scoring and the update both run in training mode (loop.py _train_mode)
        bad("lora.dropout", "must be 0 in RL (for lora.init_from: the adapter's lora_dropout): dropout draws a "
                            "new mask for every pass, so the old and new log-probs of the same tokens would "
                            "differ and the PPO ratio would be noise")
    t = config.teacher
    if config.algorithm == "dgpo" and not t.path:
        bad("teacher.path", "is required for dgpo")
    if t.placement == "loss" and t.estimator not in ("k1", "k3"):
        # The loss form differentiates a per-token estimate at the current policy; the full-vocabulary
        # KLs are computed once, without gradients, at scoring time, so there is nothing to differentiate.
        bad("teacher.placement", f"'loss' needs a one-sample estimator (teacher.estimator k1 or k3), not "
                                 f"{t.estimator!r}; use placement 'reward' for the full-vocabulary KLs")
    if t.beta < 0:
        bad("teacher.beta", "must be >= 0")
    # Scores are exact match, 0 or 1: at <= 0 no rollout would ever get the term (DGPO silently
    # becomes PPO), above 1 every one would (use apply_to: all for that).
    if not 0 < t.threshold <= 1:
        bad("teacher.threshold", f"must be in (0, 1] (rollouts scoring below it get the term), got {t.threshold}")
    o = config.optim
    if o.steps < 1:
        bad("optim.steps", "must be >= 1")
    validate_steps("optim.steps", o.steps, bad)
    for key, value in (("optim.lr", o.lr), ("optim.critic_lr", o.critic_lr)):
        if not value > 0:
            bad(key, "must be > 0")
    for key, value in (("optim.warmup_ratio", o.warmup_ratio), ("optim.critic_warmup_ratio", o.critic_warmup_ratio)):
        if not 0 <= value < 1:
            bad(key, "must be in [0, 1)")
    validate_schedule(config.eval, config.log, bad)
    if config.head_rows < 1:
        bad("head_rows", "must be >= 1")
    c = config.collapse
    if c.window < 1 or not 0 < c.drop < 1:
        bad("collapse.window" if c.window < 1 else "collapse.drop", "is out of range (window >= 1, 0 < drop < 1)")
    if not 0 <= c.min_best <= 1:   # a best average reward above 1 never comes: no alarm at all
        bad("collapse.min_best", f"must be in [0, 1] (an average exact match), got {c.min_best}")


def _validate_rollout(config: RLConfig, bad) -> None:
    r = config.rollout
    for key in ("prompts_per_step", "samples_per_prompt", "batch_size"):
        if getattr(r, key) < 1:
            bad(f"rollout.{key}", "must be >= 1")
    if not r.temperature > 0 or not 0 < r.top_p <= 1:
        bad("rollout.temperature" if not r.temperature > 0 else "rollout.top_p", "is out of range")
    if config.algorithm == "grpo" and r.samples_per_prompt < 2:
        bad("rollout.samples_per_prompt", "must be >= 2 for grpo (advantages are relative to the group)")
    rollouts = r.prompts_per_step * r.samples_per_prompt
    if config.ppo.mini_batch > rollouts or rollouts % config.ppo.mini_batch:
        bad("ppo.mini_batch", f"must divide the {rollouts} rollouts of a step "
                              "(rollout.prompts_per_step x rollout.samples_per_prompt)")
    # A micro-batch is cut from a mini-batch: a larger one was silently the mini-batch (the loop
    # cuts it to each process's share, once it knows the processes, and says so).
    if config.ppo.micro_batch > config.ppo.mini_batch:
        bad("ppo.micro_batch", f"({config.ppo.micro_batch}) must be at most ppo.mini_batch "
                               f"({config.ppo.mini_batch}): a micro-batch is a part of a mini-batch")


def _validate_ppo(p: PPOSection, bad) -> None:
    for key in ("epochs", "mini_batch", "micro_batch", "pad_to_multiple"):
        if getattr(p, key) < 1:
            bad(f"ppo.{key}", "must be >= 1")
    if p.forward_batch < 0:
        bad("ppo.forward_batch", "must be >= 0 (0: ppo.micro_batch)")
    for key in ("clip", "value_clip"):
        if not getattr(p, key) > 0:
            bad(f"ppo.{key}", "must be > 0")
    for key in ("gamma", "lam"):
        if not 0 <= getattr(p, key) <= 1:
            bad(f"ppo.{key}", "must be in [0, 1]")
    if p.entropy < 0 or p.kl_ref < 0:
        bad("ppo.entropy" if p.entropy < 0 else "ppo.kl_ref", "must be >= 0")


def load_rl_config(algorithm: str, path, overrides: list[str] = ()) -> RLConfig:
    """Read YAML + overrides for `train <algorithm>`; a YAML `algorithm` must match the command."""
    import yaml

    from dgpo_edge.errors import InputError

    from ..config import load_config

    # The command has the last word; validation waits until the YAML's own value is compared.
    for override in overrides:   # appended after them below, the command's own would win without a word
        key, _, text = override.partition("=")
        try:   # as apply_override reads it: 'ppo' and "ppo" are ppo
            value = str(yaml.safe_load(text)) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        if key.strip() == "algorithm" and value != algorithm:
            raise InputError(f"override algorithm={value}: this is `train {algorithm}`; the command "
                             f"names the algorithm (run `train {value}` instead)")
    # Read once, for the config and its own `algorithm` both: a second read could see an edited file.
    raw = read_config_yaml(Path(path))
    raw_algorithm = None if raw.get("algorithm") is None else str(raw["algorithm"])   # load_config changes raw
    config = load_config(RLConfig, path, [*overrides, f"algorithm={algorithm}"], validator=lambda c, p: None,
                         raw=raw)
    if raw_algorithm is not None and raw_algorithm != algorithm:
        raise InputError(f"the config is for `train {raw_algorithm}`, not `train {algorithm}`", path)
    validate_rl(config, path)
    return config
