"""`dgpo-edge train sft`: cross-entropy on the generated tokens of trajectories.

On FactbookQA's oracle trajectories this makes a teacher; on a teacher's own
trajectories (`train tgo`) it is SeqKD. Information and feedback tokens carry
no loss (see data.py). This module also holds what `kd` shares: loading a
model and tokenizer from a config, the dev-EM hook, the retriever it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dgpo_edge.errors import InputError
from dgpo_edge.protocol import Passage
from dgpo_edge.retrieval.base import Retriever

from .config import SFTConfig, resolve_path

# --- models -----------------------------------------------------------------------------

def load_lm(path: str, tokenizer_path: str | None = None, random_init: dict | None = None,
            seed: int = 0) -> tuple[Any, Any]:
    """(causal LM, tokenizer) from a transformers dir or a .gguf file (pkg:// allowed).

    `random_init` builds a randomly initialised model of that architecture with
    the given config overrides (e.g. 2 layers of width 64) - the tiny smoke
    models - seeded by `seed`; only the config and tokenizer are read.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from .models import load_checkpoint, load_gguf

    src = Path(resolve_path(path))
    if not src.exists() and _is_hub_id(path):  # for users with a model hub
        tokenizer = load_tokenizer(tokenizer_path or path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return model, tokenizer
    if not src.exists():
        raise InputError("no such model file or directory", src)
    tokenizer = load_tokenizer(tokenizer_path or str(src))
    if random_init is not None:
        kwargs = {"gguf_file": src.name} if src.suffix == ".gguf" else {}
        config = AutoConfig.from_pretrained(src.parent if kwargs else src, **kwargs)
        for key, value in random_init.items():
            setattr(config, key, value)
        for attr in ("quantization_config",):
            config.__dict__.pop(attr, None)
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


def _is_hub_id(spec: str) -> bool:
    """`org/name`: not a path that exists here, and shaped like a model hub id."""
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and "://" not in spec


def load_tokenizer(spec: str) -> Any:
    from transformers import AutoTokenizer

    src = Path(resolve_path(spec))
    if not src.exists() and _is_hub_id(spec):
        return AutoTokenizer.from_pretrained(spec)
    if src.suffix == ".gguf":
        from .models import load_gguf_tokenizer

        return load_gguf_tokenizer(src)
    if not src.is_dir():
        raise InputError("no such tokenizer directory", src)
    return AutoTokenizer.from_pretrained(src)


# --- retrieval and dev EM ------------------------------------------------------------------

class CorpusBM25(Retriever):
    """BM25 over a Search-R1 corpus .jsonl held in memory (SQLite FTS5; no index build needed)."""

    def __init__(self, corpus: str | Path):
        from dgpo_edge.fts import BM25Index
        from dgpo_edge.jsonio import read_jsonl

        passages = []
        for line, row in read_jsonl(corpus):
            if "id" not in row or not isinstance(row.get("contents"), str):
                raise InputError("expected {\"id\", \"contents\"}", corpus, line)
            passages.append(Passage(str(row["id"]), row["contents"]))
        self.index = BM25Index(passages)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        return [self.index.search(q, k=k) for q in queries]


def open_retriever(spec: str) -> Retriever:
    """An index directory (open_index) or a corpus .jsonl (in-memory BM25)."""
    path = Path(spec)
    if path.is_file() and path.suffix == ".jsonl":
        return CorpusBM25(path)
    if path.is_dir():
        from dgpo_edge.retrieval.retrievers import open_index
        return open_index(path)
    raise InputError("expected an index directory or a corpus .jsonl", path)


def make_eval_fn(config: SFTConfig, tokenizer: Any, protocol: Any = None) -> Callable[[Any, int], dict] | None:
    """Dev EM through greedy multi-turn rollouts (train/rollout.py), or None without data.dev.

    `protocol` (a ProtocolConfig) sets the episode limits; by default the protocol's own with
    `eval.max_turn_tokens` per turn. An RL run passes its rollout limits, so that it is
    evaluated on the episodes it trains on. The returned function's `rollout` attribute is the
    RolloutConfig it uses.
    """
    if not config.data.dev:
        return None
    try:
        from .rollout import evaluate_em
    except ImportError as e:
        raise InputError(f"data.dev is set but dev EM needs dgpo_edge.train.rollout ({e})") from None
    from dgpo_edge.datasets import read_qa

    examples = read_qa(config.data.dev, limit=config.data.dev_limit)
    retriever = open_retriever(config.data.retriever)

    from dgpo_edge.protocol import ProtocolConfig

    from .rollout import RolloutConfig

    e = config.eval
    rollout = RolloutConfig(protocol=protocol or ProtocolConfig(max_turn_tokens=e.max_turn_tokens), greedy=True,
                            batch_size=e.batch_size, engine=e.engine, chat_template=config.data.chat_template)

    def evaluate(model: Any, step: int) -> dict:
        result = evaluate_em(model, tokenizer, examples, retriever, rollout)
        return {f"dev_{k}": v for k, v in result.items() if isinstance(v, (int, float))}

    evaluate.rollout = rollout
    return evaluate


# --- the command ----------------------------------------------------------------------------

def run_sft(config: SFTConfig, on_step: Callable | None = None) -> dict:
    """Train per `config`; returns the trainer's summary (also written to out_dir/summary.json)."""
    import torch

    from .data import load_trajectories
    from .lora import apply_lora
    from .losses import MaskedLMLoss
    from .trainer import (
        Trainer,
        check_zero3,
        make_accelerator,
        whole_weights,
        zero_stage,
    )

    accelerator = make_accelerator(config)
    check_zero3(config, zero_stage(accelerator), accelerator.num_processes)
    torch.manual_seed(config.run.seed)
    with whole_weights(accelerator):
        model, tokenizer = load_lm(config.model.path, config.model.tokenizer, config.model.random_init,
                                   config.run.seed)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    apply_lora(model, config.lora)
    examples, stats = load_trajectories(config.data.train, tokenizer, max_length=config.data.max_length,
                                        only_correct=config.data.only_correct,
                                        chat_template=config.data.chat_template, limit=config.data.limit)
    report_data(accelerator, config.data.train, stats)
    eval_fn = make_eval_fn(config, tokenizer)

    def loss_fn(module: Any, batch: dict) -> tuple[Any, dict]:
        loss = module(batch["input_ids"], batch["attention_mask"], batch["target_mask"], kind="ce")
        return loss, {}

    trainer = Trainer(config, MaskedLMLoss(model, config.chunk_size), tokenizer, examples, loss_fn,
                      accelerator, eval_fn=eval_fn, on_step=on_step)
    return trainer.train()


def report_data(accelerator: Any, path: str, stats: Any) -> None:
    if accelerator.is_main_process:
        print(f"{path}: {stats.kept:,} of {stats.rows:,} trajectories ({stats.wrong_answer} wrong answer, "
              f"{stats.too_long} too long); {stats.tokens:,} tokens, {stats.loss_tokens:,} with loss")
