"""`dgpo-edge train tgo`: teacher-generated trajectories for SeqKD / SFT (train/tgo.py).

Registered on the `train` sub-app by `cli/train.py`. torch and transformers are
imported only when the command runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from ..protocol import MAX_SEARCHES, MAX_TOP_K
from .common import (MAX_SEARCHES_HELP, TOP_K_HELP, check_search_options, console, err_console, max_searches_of,
                     needs_extra, old_max_turns_option, stopped_by_ctrl_c, user_errors)


@needs_extra("train", "torch", "transformers")
@user_errors
def tgo_command(
    teacher: Path = typer.Option(..., "--teacher", help="Teacher model folder (transformers format)."),
    data: Path = typer.Option(..., "--data", help="Questions with gold answers (any read_qa format)."),
    index: Path = typer.Option(..., "--index", help="Index folder (dgpo-edge index build / compact), or a "
                               "corpus .jsonl searched by BM25 in memory, as the training configs' data.retriever."),
    out: Path = typer.Option(..., "--out", help="Output .jsonl (appended to; resumes where it stopped)."),
    n: int = typer.Option(4, "--n", min=1, help="Samples per question."),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Use the first N questions only."),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Episodes decoded together."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="Sampling temperature (> 0)."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0, help="Nucleus sampling mass."),
    seed: int = typer.Option(0, "--seed", help="Random seed (per chunk of questions)."),
    max_searches: int = typer.Option(4, "--max-searches", help=f"{MAX_SEARCHES_HELP}, 0 to {MAX_SEARCHES}."),
    old_max_turns: Optional[int] = old_max_turns_option(),
    top_k: int = typer.Option(3, "--top-k", "-k", help=f"{TOP_K_HELP}, 1 to {MAX_TOP_K} (the agent's range)."),
    max_turn_tokens: int = typer.Option(500, "--max-turn-tokens", min=1, help="New tokens per turn."),
    engine: str = typer.Option("auto", "--engine", help="Decoder: auto, fast or plain."),
    device: str | None = typer.Option(None, "--device", help="cuda, cpu, ... (default: cuda if available)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp16, fp32."),
    chat_template: bool = typer.Option(True, "--chat-template/--no-chat-template",
                                       help="Wrap the prompt in the tokenizer's chat template."),
) -> None:
    """Sample N teacher trajectories per question; keep the correct ones (oracle.jsonl shape)."""
    from ..datasets import read_qa
    from ..progress import add_stage, stage_progress
    from ..protocol import ProtocolConfig
    from ..train.rollout import ENGINES, RolloutConfig
    from ..train.evaluation import open_retriever
    from ..train.tgo import TgoConfig, done_ids, generate_teacher_trajectories, out_holds

    # the agent commands' ranges: trajectories a student learns from use settings it can run with
    max_searches = max_searches_of(max_searches, old_max_turns)
    check_search_options(top_k, max_searches)
    if engine not in ENGINES:
        raise InputError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if not 0 < temperature < math.inf or not top_p > 0:   # inf samples uniform noise
        raise InputError(f"--temperature must be a finite number > 0 and --top-p > 0 (tgo samples), "
                         f"got {temperature} and {top_p}")
    examples = read_qa(data, limit=limit)
    if not examples:
        raise InputError("no questions", data)
    if not all(ex.answers for ex in examples):
        raise InputError("every question needs gold answers (only correct trajectories are kept)", data)
    _check_distinct_ids(examples, data)
    config = TgoConfig(n=n, rollout=RolloutConfig(
        protocol=ProtocolConfig(top_k=top_k, max_searches=max_searches,
                                max_turn_tokens=max_turn_tokens), temperature=temperature,
        top_p=top_p, seed=seed, batch_size=batch_size, engine=engine, chat_template=chat_template))
    _check_not_an_input(out, data, index)
    done = done_ids(out)   # an --out that is no `train tgo` file fails before anything loads
    # Ctrl-C: in the loop the line is generate_teacher_trajectories' (the chunks it wrote); before it, this
    with stopped_by_ctrl_c(lambda: out_holds(out, examples, done)), \
            open_retriever(str(index)) as retriever:  # before the teacher loads: a bad --index fails fast
        model, tokenizer = load_teacher(teacher, device, dtype)
        with stage_progress(err_console, transient=True) as bar:
            task = add_stage(bar, "tgo", "tgo", 0, len(examples))
            stats = generate_teacher_trajectories(model, tokenizer, examples, retriever, out, config,
                                                  teacher=str(teacher), on_chunk=lambda k: bar.advance(task, k))
    console.print(f"{stats.processed} questions sampled ({stats.skipped} already done), "
                  f"{stats.solved} solved, {stats.correct}/{stats.samples} samples correct, "
                  f"{stats.written} trajectories written to {out}", highlight=False)


def _check_distinct_ids(examples: list, data: Path) -> None:
    """A resumed run skips every question whose id it has done: a second question with the same id
    would be skipped without a word (and the trajectories of the two mixed under one id)."""
    seen: set[str] = set()
    for ex in examples:
        if ex.id in seen:
            raise InputError(f"two questions have the id {ex.id!r}; a run resumes by id, so each needs its own",
                             data)
        seen.add(ex.id)


def _check_not_an_input(out: Path, *inputs: Path) -> None:
    """--out must not be the questions or the corpus: trajectories would be appended to them (an
    oracle.jsonl given as both would pass for a finished run, every question "already done")."""
    from ..jsonio import same_path

    for source in inputs:
        if same_path(out, source):
            raise InputError("is also this command's input, which the trajectories would be appended to; "
                             "give --out another file", out)


def load_teacher(path: Path, device: str | None, dtype: str):
    """(model, tokenizer) from a transformers folder; InputError when it is not one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_dir() or not (path / "config.json").is_file():
        raise InputError("not a transformers model folder (no config.json)", path)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    types = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             "auto": torch.bfloat16 if dev.type == "cuda" else torch.float32}
    if dtype not in types:
        raise InputError(f"--dtype must be one of {', '.join(types)}, got {dtype!r}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=types[dtype])
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load the teacher ({type(e).__name__}: {e})", path) from None
    return model.to(dev).eval(), tokenizer
