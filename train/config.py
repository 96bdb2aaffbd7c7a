"""Training configs: one dataclass per stage, read from YAML plus `key=value` overrides.

A config is a tree of small section dataclasses (`run`, `model`, `data`, `optim`,
`eval`, `log`, and `kd` for distillation). YAML mirrors that tree; an override
names a leaf with a dotted key (`optim.lr=2e-5`). Every problem - an unknown key,
a wrong type, a value out of range, a nan or infinite number anywhere - raises InputError naming the YAML file and
the key, which the CLI prints as one `error:` line with exit status 2.

The resolved config (after overrides) is written into the run directory, so a
run records exactly what produced it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dgpo_edge.errors import InputError
from dgpo_edge.protocol import ProtocolConfig

from .decoding import DecoderChoice

# Choices shared by several stages: a field typed with one of these is checked by the loader.
Precision = Literal["auto", "bf16", "fp32"]
Schedule = Literal["cosine", "linear", "constant"]

# --- sections -------------------------------------------------------------------

@dataclass
class RunSection:
    """Where the run lives and how it starts."""

    out_dir: str = ""            # run directory: config, checkpoints/{last,best}, metrics.csv, tb/
    seed: int = 0                # seeds model init (random_init), data order and sampling
    resume: bool = True          # continue from out_dir/checkpoints/last when it exists
    precision: Precision = "auto"  # auto (bf16 on a GPU that has it, else fp32) | bf16 | fp32


@dataclass
class ModelSection:
    """The model being trained."""

    path: str = ""               # transformers dir, a .gguf file, or pkg://package/file.gguf
    tokenizer: str | None = None  # defaults to `path`
    random_init: dict | None = None  # build a random model from path's config with these overrides
    gradient_checkpointing: bool = False
    # torch.compile the decoder layers of the trained model (and of KD's teacher) for the training
    # passes (train/compiled_layers.py: dynamic shapes, decoding stays eager); the same math up to
    # rounding, the first steps pay the compilation. RL has its own switch, ppo.compile.
    compile: bool = False


@dataclass
class DataSection:
    """Trajectories to train on and questions to evaluate on."""

    train: str = ""              # trajectories jsonl (FactbookQA oracle.jsonl or `train tgo` output)
    dev: str | None = None       # QA file for dev EM (any format dgpo_edge.datasets reads)
    retriever: str | None = None  # for dev EM: an index dir (open_index) or a corpus .jsonl (BM25 in memory)
    max_length: int = 2048       # longer trajectories are dropped (never cut mid-turn)
    only_correct: bool = True    # keep trajectories whose final answer matches a gold answer
    chat_template: bool = True   # wrap the Search-R1 prompt in the tokenizer's chat template
    limit: int | None = None     # use only the first N trajectories
    dev_limit: int | None = 200  # evaluate on the first N dev questions
    # QA file evaluated beside dev at every evaluation, for the record only (report.jsonl: EM per
    # type, per-question scores); nothing chooses by it, so it may be the test split
    report: str | None = None
    report_limit: int | None = None  # the first N report questions (None: all)


@dataclass
class OptimSection:
    """AdamW with warmup and a decay schedule."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    schedule: Schedule = "cosine"  # cosine | linear | constant (after warmup)
    warmup_ratio: float = 0.1    # share of all steps spent warming up linearly from 0
    epochs: float = 1.0          # used when max_steps is 0
    max_steps: int = 0           # optimizer steps, at most MAX_STEPS; 0 = derived from epochs
    batch_size: int = 8          # trajectories per micro-batch per process
    grad_accum: int = 1          # micro-batches per optimizer step
    grad_clip: float = 1.0       # max global grad norm; 0 = off


@dataclass
class EvalSection:
    """Dev EM through greedy multi-turn rollouts."""

    every: int = 0               # optimizer steps between evaluations; 0 = only at the end
    at_start: bool = False       # also evaluate before the first step (the "before" number)
    batch_size: int = 32         # rollouts generated together
    engine: DecoderChoice = "auto"  # rollout decoder: auto | fast (static cache, CUDA graphs) | plain
    # What the evaluations decode: a bf16 copy of the weights (LoRA merged) refreshed at each
    # evaluation, through one engine kept for the run, or the training weights themselves (an engine
    # per evaluation); auto = the copy for bf16 runs on a GPU. The copy and the engine's cache stay
    # on the GPU for the whole run (training frees them after each evaluation). An RL run's
    # evaluations use its rollouts' decoder (rollout.weights decides whether that is a copy) unless
    # this is training or eval.engine names a decoder other than auto and rollout.engine (then the training
    # weights, an engine per evaluation). In SFT/KD, eval.engine picks the copy's engine.
    weights: Literal["auto", "bf16_copy", "training"] = "auto"
    best_metric: str = "dev_em"  # checkpoints/best keeps the highest value of this metric


@dataclass
class LogSection:
    """Metrics and checkpoints."""

    every: int = 10              # optimizer steps between metric rows
    save_every: int = 0          # optimizer steps between checkpoints/last; 0 = at evals and the end
    save_minutes: float = 10.0   # also save checkpoints/last once this long has passed since the last save (0: never)
    tensorboard: bool = True     # out_dir/tb
    wandb: bool = False          # Weights & Biases, only when asked (and installed)
    wandb_project: str = "dgpo-edge"
    progress: bool = True        # the main process's rich progress bar on a terminal; false, or off one: plain lines


@dataclass
class KDSection:
    """Distillation from a frozen teacher on teacher-forced trajectories."""

    teacher: str = ""            # teacher model (same vocabulary as the student)
    loss: Literal["forward_kl", "reverse_kl", "jsd", "seqkd"] = "forward_kl"  # forward_kl | reverse_kl | jsd | seqkd
    temperature: float = 1.0     # softens both distributions (losses are scaled by T^2)
    jsd_beta: float = 0.5        # generalized JSD interpolation, 0 < beta < 1
    on_policy: float = 0.0       # GKD: share of batches whose first turn the student samples itself
    max_new_tokens: int = 128    # length of an on-policy sample


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoRASection:
    """Low-rank adapters instead of full fine-tuning (train/lora.py); r = 0 trains every weight."""

    r: int = 0                   # rank; 0 = off
    alpha: float | None = None   # the update is B @ A * alpha / r; default alpha = r (scale 1)
    dropout: float = 0.0         # dropout on the adapters' input
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # every linear layer
    train_norms: bool = False    # also train the RMSNorm weights
    save_dtype: Literal["bf16", "f16", "f32"] = "bf16"  # of the compact adapter in checkpoints/*/adapter
    # Start from a saved adapter (a folder like checkpoints/best/adapter or the shipped student's)
    # instead of fresh ones: its rank, alpha, targets and norms are used, so r stays 0 here.
    # model.path is then the base that adapter was trained on.
    init_from: str | None = None

    @property
    def on(self) -> bool:
        return self.r > 0 or bool(self.init_from)


@dataclass
class SFTConfig:
    """`dgpo-edge train sft`: cross-entropy on the generated tokens of trajectories."""

    run: RunSection = field(default_factory=RunSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    eval: EvalSection = field(default_factory=EvalSection)
    log: LogSection = field(default_factory=LogSection)
    lora: LoRASection = field(default_factory=LoRASection)
    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)  # episode limits of dev EM
    chunk_size: int = 8192       # vocabulary columns per loss chunk; 0 = whole vocabulary

    stage = "sft"
    # Keys that moved, read under their new name with a warning (the protocol limits are one section).
    MOVED_KEYS = (("eval.max_turn_tokens", "protocol.max_turn_tokens"),)


@dataclass
class KDConfig(SFTConfig):
    """`dgpo-edge train kd`: cold-start distillation (forward KL by default)."""

    kd: KDSection = field(default_factory=KDSection)

    stage = "kd"


# --- loading --------------------------------------------------------------------

def load_config(cls: type, path: str | Path, overrides: list[str] = (), validator: Any = None,
                raw: dict | None = None) -> Any:
    """Read `path` (YAML), apply `key=value` overrides, validate; InputError on any problem.

    `validator(config, path)` replaces the SFT/KD checks (`validate`) for other stages. `raw`: the
    file's mapping (`read_config_yaml`) when the caller has read it already, for it needs a key of
    its own: reading the file again could see other text (an edit in between), and report its
    errors twice. It is changed (moved keys, `MOVED_KEYS`); `path` then only names the file in errors.
    """
    path = Path(path)
    if raw is None:
        raw = read_config_yaml(path)
    moved = dict(getattr(cls, "MOVED_KEYS", ()))
    config = _build(cls, _move_keys(raw, moved, path), path, prefix="")
    for item in overrides:
        apply_override(config, _move_override(item, moved, path), path)
    refuse_non_finite(config, path)
    check_sections(config, path)
    (validator or validate)(config, path)
    return config


def read_config_yaml(path: Path) -> dict:
    """The config file's mapping of sections; InputError for a missing file, bad YAML or text that
    is not UTF-8, and for a key given twice in one mapping (plain YAML keeps the last silently, so
    a second `lr:` further down would quietly override the first), naming the line."""
    import yaml

    if not path.is_file():
        raise InputError("no such config file", path)
    loader = _unique_key_loader()
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 ({e.reason})", path) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        what = "" if isinstance(e, loader.Twice) else "malformed YAML: "
        raise InputError(f"{what}{getattr(e, 'problem', e)}", path, line) from None
    if not isinstance(raw, dict):
        raise InputError(f"expected a mapping of sections, got {type(raw).__name__}", path)
    return raw


@functools.cache
def _unique_key_loader() -> type:
    """A SafeLoader that refuses a key given twice in one mapping (made on first use: importing yaml
    costs the CLI's start). Each mapping's own keys are checked once, before YAML merges `<<: *base`
    into it: merged keys, and keys that override them, are not given twice."""
    import yaml

    merge = "tag:yaml.org,2002:merge"

    class Twice(yaml.constructor.ConstructorError):
        pass

    class Loader(yaml.SafeLoader):
        def flatten_mapping(self, node):
            if not hasattr(self, "_checked"):
                self._checked = set()
            if id(node) not in self._checked:
                self._checked.add(id(node))
                seen: set = set()
                for key_node, _ in node.value:
                    if key_node.tag == merge or not isinstance(key_node, yaml.ScalarNode):
                        continue   # `<<`, or a complex key (SafeLoader's own errors follow)
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        raise Twice(None, None, f"key {key_node.value!r} is given twice in one mapping",
                                    key_node.start_mark)
                    seen.add(key)
            super().flatten_mapping(node)

    Loader.Twice = Twice
    return Loader


def refuse_non_finite(value: Any, path: Path | str, key: str = "") -> None:
    """InputError for a nan or infinite number anywhere in the config, nested mappings included.

    One walk over the whole tree rather than a check per field: range checks written as
    `x < 0` let nan through, and a field added later is covered without remembering to.
    """
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            refuse_non_finite(getattr(value, f.name), path, f"{key}.{f.name}" if key else f.name)
    elif isinstance(value, dict):
        for k, v in value.items():
            refuse_non_finite(v, path, f"{key}.{k}" if key else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            refuse_non_finite(v, path, f"{key}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"key {key!r} must be a finite number, got {value}", path)


def apply_override(config: Any, item: str, where: Path | str) -> None:
    """Set one dotted `key=value`; the value is parsed as YAML (`true`, `3`, `[1, 2]`)."""
    import yaml

    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise InputError(f"override {item!r} is not key=value", where)
    key = key.strip()
    *parents, leaf = key.split(".")
    target = config
    for i, name in enumerate(parents):
        target = _child(target, name, ".".join(parents[:i + 1]), where)
    hints = _hints(type(target))
    if leaf not in hints or not dataclasses.is_dataclass(target):
        raise InputError(f"override {key!r}: unknown key{_known(target)}", where)
    section = getattr(target, leaf)
    if dataclasses.is_dataclass(section):   # else _coerce would name the class: "must be <class '...'>"
        raise InputError(f"override {key!r} names a section: set one of its keys, {key}.KEY=VALUE"
                         f"{_known(section)}", where)
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = text
    # object.__setattr__: a frozen section (ProtocolConfig) is checked again by check_sections
    object.__setattr__(target, leaf, _coerce(value, hints[leaf], key, where, f"override {key!r}"))


def check_sections(config: Any, path: Path | str, key: str = "") -> None:
    """Run every section's own checks (`__post_init__`, as ProtocolConfig's) again after the
    overrides, turning its ValueError into InputError."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            name = f"{key}.{f.name}" if key else f.name
            _checked(lambda v=value: dataclasses.replace(v), name, path)
            check_sections(value, path, name)


def _checked(make: Any, section: str, path: Path | str) -> Any:
    try:
        return make()
    except ValueError as e:
        raise InputError(f"section {section!r}: {e}", path) from None


def _move_keys(raw: dict, moved: dict[str, str], path: Path | str) -> dict:
    """YAML written for an older config: each key of `moved` (old dotted key -> new) is read under
    its new name, with a warning; setting both is an error."""
    for old, new in moved.items():
        section, key = old.split(".")
        if not isinstance(raw.get(section), dict) or key not in raw[section]:
            continue
        value = raw[section].pop(key)
        new_section, new_key = new.split(".")
        target = raw.setdefault(new_section, {})
        if isinstance(target, dict):
            if new_key in target:
                raise InputError(f"key {old!r} is the old name of {new!r}; set only {new!r}", path)
            target[new_key] = value
        _warn_moved(old, new, path)
    return raw


def _move_override(item: str, moved: dict[str, str], path: Path | str) -> str:
    key, sep, text = item.partition("=")
    if key.strip() not in moved:
        return item
    _warn_moved(key.strip(), moved[key.strip()], path)
    return moved[key.strip()] + sep + text


def _warn_moved(old: str, new: str, path: Path | str) -> None:
    import sys

    print(f"warning: {path}: key {old!r} is deprecated, use {new!r}", file=sys.stderr)


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


_RESOLVED = "# resolved {stage} config (written by dgpo-edge train {stage})"


def write_resolved(config: Any, out_dir: Path) -> Path:
    """Write the resolved config to out_dir/config.yaml (atomically), its first line naming the stage."""
    import yaml

    from dgpo_edge.jsonio import write_text

    path = Path(out_dir) / "config.yaml"
    header = _RESOLVED.format(stage=config.stage) + "\n"
    write_text(path, header + yaml.safe_dump(to_dict(config), sort_keys=False))
    return path


def resolved_stage(path: Path) -> str | None:
    """The stage (`sft`, `kd`, `dgpo`, ...) whose run wrote the config.yaml at `path`, from the first
    line write_resolved puts there; None for a file without it."""
    head = path.read_text(encoding="utf-8", errors="replace").partition("\n")[0]
    prefix, _, _ = _RESOLVED.partition("{stage}")
    return head.removeprefix(prefix).split(" ", 1)[0] if head.startswith(prefix) else None


# --- building and checking -------------------------------------------------------------

def _build(cls: type, raw: dict, path: Path, prefix: str) -> Any:
    hints = _hints(cls)
    unknown = sorted(set(raw) - set(hints))
    if unknown:
        key = prefix + str(unknown[0])
        raise InputError(f"unknown key {key!r} (known: {', '.join(sorted(hints))})", path)
    values = {}
    for name, value in raw.items():
        key = prefix + name
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise InputError(f"{key!r} must be a mapping of settings", path)
            values[name] = _build(hint, value, path, key + ".")
        else:
            values[name] = _coerce(value, hint, key, path, f"key {key!r}")
    return _checked(lambda: cls(**values), prefix[:-1] or "config", path)


def _coerce(value: Any, hint: Any, key: str, path: Path | str, label: str) -> Any:
    """Check `value` against a field's type, converting only where it is lossless."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise InputError(f"{label} needs a value", path)
    for opt in options:
        if opt is bool and isinstance(value, bool):
            return value
        if opt is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if opt is float and not isinstance(value, bool):
            if isinstance(value, (int, float)):
                return float(value)
            if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
                try:
                    return float(value)
                except ValueError:
                    pass
        if opt is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if (opt is dict or typing.get_origin(opt) is dict) and isinstance(value, dict):
            return value
        if typing.get_origin(opt) is list and isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        if typing.get_origin(opt) is typing.Literal and value in typing.get_args(opt) and not isinstance(value, bool):
            return value
    want = " or ".join(_type_name(o) for o in options)
    return _raise(f"{label} must be {want}, got {value!r}", path)


def _raise(message: str, path: Path | str) -> Any:
    raise InputError(message, path)


def validate(config: Any, path: Path | str) -> None:
    """Range and presence checks, each naming the offending key."""
    def bad(key: str, why: str) -> None:
        raise InputError(f"key {key!r} {why}", path)

    if not config.run.out_dir:
        bad("run.out_dir", "is required")
    validate_seed_and_limits(config, bad)
    if not config.model.path:
        bad("model.path", "is required")
    if not config.data.train:
        bad("data.train", "is required")
    if config.data.max_length < 8:
        bad("data.max_length", "must be >= 8")
    o = config.optim
    if not o.lr > 0:
        bad("optim.lr", "must be > 0")
    if not 0 <= o.warmup_ratio < 1:
        bad("optim.warmup_ratio", "must be in [0, 1)")
    for key, value in (("optim.batch_size", o.batch_size), ("optim.grad_accum", o.grad_accum)):
        if value < 1:
            bad(key, "must be >= 1")
    if o.max_steps < 0 or (o.max_steps == 0 and not o.epochs > 0):
        bad("optim.max_steps", "must be > 0, or optim.epochs > 0")
    validate_steps("optim.max_steps", o.max_steps, bad)
    if o.max_steps == 0 and o.epochs > MAX_STEPS:   # each epoch is at least one step (the trainer checks the product)
        bad("optim.epochs", f"must be at most {MAX_STEPS:,}, got {o.epochs:g}")
    if o.grad_clip < 0:
        bad("optim.grad_clip", "must be >= 0")
    if config.chunk_size < 0:
        bad("chunk_size", "must be >= 0")
    validate_schedule(config.eval, config.log, bad)
    if config.eval.batch_size < 1:
        bad("eval.batch_size", "must be >= 1")
    if (config.data.dev or config.data.report) and not config.data.retriever:
        bad("data.retriever", "is required when data.dev or data.report is set (their EM searches)")
    validate_lora(config.lora, bad)
    if isinstance(config, KDConfig):
        _validate_kd(config.kd, bad)


# torch seeds a generator with (seed x 1,000,003 + epoch) as a signed 64-bit number (data.batch_order):
# a larger seed stopped the run with a traceback once the model had loaded. NumPy's range, as usual.
MAX_SEED = 2**32 - 1


def validate_seed_and_limits(config: Any, bad) -> None:
    """run.seed in [0, MAX_SEED], and the data section's row limits >= 1 or null (shared with the RL
    config): a negative limit stopped an RL run with islice's traceback, and 0 was refused only after
    loading, as "no usable trajectories" or "no training questions", which named no key."""
    if not 0 <= config.run.seed <= MAX_SEED:
        bad("run.seed", f"must be in [0, {MAX_SEED}], got {config.run.seed}")
    for key in ("limit", "dev_limit", "report_limit"):
        value = getattr(config.data, key)
        if value is not None and value < 1:
            bad(f"data.{key}", f"must be >= 1 (or null: every row), got {value}")


# Steps a run may take. Far more than any run takes (a million steps of one second are 12 days), and
# far below where numbers stop being exact: 10**20 steps was accepted, then overflowed later (int64
# in torch, floats in the schedule and the progress ETA).
MAX_STEPS = 10**9


def validate_steps(key: str, steps: int, bad) -> None:
    """A run's optimizer steps at most MAX_STEPS (shared with the RL config's optim.steps)."""
    if steps > MAX_STEPS:
        bad(key, f"must be at most {MAX_STEPS:,}, got {steps:,}")


def validate_schedule(eval: EvalSection, log: LogSection, bad) -> None:
    """How often a run evaluates, logs and saves (shared with the RL config)."""
    for key, value in (("eval.every", eval.every), ("log.save_every", log.save_every),
                       ("log.save_minutes", log.save_minutes)):
        if value < 0:
            bad(key, "must be >= 0")
    if log.every < 1:
        bad("log.every", "must be >= 1")


def validate_lora(lora: LoRASection, bad) -> None:
    """Range checks of the `lora` section (shared with the RL config)."""
    if lora.r < 0:
        bad("lora.r", "must be >= 0 (0 = full fine-tuning)")
    if lora.alpha is not None and not lora.alpha > 0:
        bad("lora.alpha", "must be > 0")
    if not 0 <= lora.dropout < 1:
        bad("lora.dropout", "must be in [0, 1)")
    if lora.r and not lora.target_modules:
        bad("lora.target_modules", "must name at least one module")
    if lora.init_from:
        if lora.r:
            bad("lora.init_from", "takes the rank, alpha and targets from the adapter: leave lora.r at 0")
        elif not (Path(lora.init_from) / "adapter_config.json").is_file():
            bad("lora.init_from", f"is not an adapter folder (no adapter_config.json in {lora.init_from})")
    unknown = sorted(set(lora.target_modules) - set(LORA_TARGETS))
    if unknown:  # the linear layers of the Llama / Qwen2 models trained here (lm_head is tied)
        bad("lora.target_modules", f"has no module named {', '.join(unknown)} (choose from {', '.join(LORA_TARGETS)})")


def _validate_kd(kd: KDSection, bad) -> None:
    if not kd.teacher:
        bad("kd.teacher", "is required")
    if not kd.temperature > 0:
        bad("kd.temperature", "must be > 0")
    if not 0 < kd.jsd_beta < 1:
        bad("kd.jsd_beta", "must be in (0, 1)")
    if not 0 <= kd.on_policy <= 1:
        bad("kd.on_policy", "must be in [0, 1]")
    if kd.on_policy > 0 and kd.loss == "seqkd":
        bad("kd.on_policy", "needs a soft-target loss (forward_kl, reverse_kl or jsd), not seqkd")
    if kd.max_new_tokens < 1:
        bad("kd.max_new_tokens", "must be >= 1")


# --- small helpers -----------------------------------------------------------------

def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _child(obj: Any, name: str, key: str, where: Path | str) -> Any:
    if not dataclasses.is_dataclass(obj) or name not in _hints(type(obj)):
        raise InputError(f"override {key!r}: unknown section{_known(obj)}", where)
    child = getattr(obj, name)
    if not dataclasses.is_dataclass(child):
        whole = f"; set it whole, as {key}={{KEY: VALUE, ...}}" if _accepts_mapping(_hints(type(obj))[name]) else ""
        raise InputError(f"override {key!r}: not a section{whole}", where)
    return child


def _accepts_mapping(hint: Any) -> bool:
    """A field that holds a mapping (model.random_init): its keys are not dotted keys of the config."""
    options = typing.get_args(hint) if _is_union(hint) else (hint,)
    return any(opt is dict or typing.get_origin(opt) is dict for opt in options)


def _known(obj: Any) -> str:
    return f" (known: {', '.join(sorted(_hints(type(obj))))})" if dataclasses.is_dataclass(obj) else ""


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _type_name(t: Any) -> str:
    if typing.get_origin(t) is typing.Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(t))
    if typing.get_origin(t) is list:
        return "a list of strings"
    return {type(None): "null", bool: "true/false", int: "an integer", float: "a number",
            str: "a string", dict: "a mapping"}.get(t, "a mapping" if typing.get_origin(t) is dict else str(t))
