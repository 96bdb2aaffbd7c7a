"""`dgpo-edge train sft`: cross-entropy on the generated tokens of trajectories.

On FactbookQA's oracle trajectories this makes a teacher; on a teacher's own
trajectories (`train tgo`) it is SeqKD. Information and feedback tokens carry
no loss (see data.py). A command module: it puts together the model loader
(models.py), the trajectories (data.py), the dev-EM hook (evaluation.py) and
the trainer (trainer.py), and nothing imports it but the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import SFTConfig


def run_sft(config: SFTConfig, on_step: Callable | None = None) -> dict:
    """Train per `config`; returns the trainer's summary (also written to out_dir/summary.json)."""
    import torch

    from .compiled_layers import compile_models
    from .data import load_trajectories, report_data
    from .evaluation import make_eval_fn
    from .lora import apply_lora
    from .losses import MaskedLMLoss
    from .models import load_lm
    from .plumbing import check_before_loading, make_accelerator, whole_weights, zero_stage
    from .trainer import Trainer, check_zero3

    check_before_loading(config)
    accelerator = make_accelerator(config)
    check_zero3(config, zero_stage(accelerator), accelerator.num_processes)
    torch.manual_seed(config.run.seed)
    with whole_weights(accelerator):
        model, tokenizer = load_lm(config.model.path, config.model.tokenizer, config.model.random_init,
                                   config.run.seed)
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    apply_lora(model, config.lora)
    if config.model.compile:
        compile_models([model], "model.compile")
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
