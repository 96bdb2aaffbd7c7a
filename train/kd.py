"""`dgpo-edge train kd`: cold-start distillation from a frozen teacher.

The student reads a trajectory teacher-forced and matches the teacher's full
next-token distribution at every generated position (information and feedback
tokens are masked). `kd.loss` picks the divergence (see losses.py):
forward KL is the DGPO cold start; reverse KL and generalized JSD are the
alternatives; seqkd is plain cross-entropy on teacher-written trajectories
(no teacher forward needed).

GKD's on-policy mixing (`kd.on_policy` = lambda): for that share of
micro-batches the student first samples its own continuation of each prompt
(one turn, up to `kd.max_new_tokens`, stopped at `</search>`/`</answer>`), and
the divergence is taken on those tokens instead. The choice is a pure function
of (seed, micro-batch), so a resumed run makes the same choices.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from dgpo_edge.errors import InputError
from dgpo_edge.protocol import STOP_STRINGS

from .config import KDConfig
from .data import Example, collate, load_trajectories, report_data
from .evaluation import make_eval_fn
from .models import load_frozen, load_lm


def load_teacher(config: KDConfig, student: Any, device: Any, bf16: bool) -> Any:
    """The frozen teacher, on the student's device; refuses a different vocabulary."""
    teacher, _ = load_frozen(config.kd.teacher, device, bf16)
    v_s = student.get_output_embeddings().weight.shape[0]
    v_t = teacher.get_output_embeddings().weight.shape[0]
    if v_s != v_t:
        raise InputError(f"kd.teacher has a vocabulary of {v_t:,} rows but the student has {v_s:,}; "
                         "distillation needs the same tokenizer", config.kd.teacher)
    return teacher


def on_policy_turn(lm: Any, tokenizer: Any, examples: list[Example], max_new_tokens: int) -> list[Example]:
    """Each example's prompt followed by one turn the student samples (mask 1 on it)."""
    import torch

    prompts = [e.ids[:e.prompt_len] for e in examples]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, p in enumerate(prompts):  # left padding for generation
        ids[b, width - len(p):] = torch.tensor(p)
        attn[b, width - len(p):] = 1
    was_training = lm.training
    lm.eval()
    with torch.no_grad():
        out = lm.generate(input_ids=ids.to(lm.device), attention_mask=attn.to(lm.device), do_sample=True,
                          temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                          stop_strings=list(STOP_STRINGS), tokenizer=tokenizer, pad_token_id=pad)
    lm.train(was_training)
    stops = {tokenizer.eos_token_id, pad}
    result = []
    for e, p, row in zip(examples, prompts, out[:, width:].tolist()):
        gen = []
        for tok in row:
            if tok in stops:
                break
            gen.append(tok)
        gen = gen or row[:1]
        result.append(Example(e.id, p + gen, [0] * len(p) + [1] * len(gen), len(p), e.answers))
    return result


def run_kd(config: KDConfig, on_step: Callable | None = None) -> dict:
    """Distil per `config`; returns the trainer's summary."""
    import torch

    from .compiled_layers import compile_models
    from .lora import apply_lora
    from .losses import MaskedLMLoss, teacher_targets
    from .plumbing import check_before_loading, make_accelerator, whole_weights, zero_stage
    from .trainer import Trainer, check_zero3

    check_before_loading(config)
    accelerator = make_accelerator(config)
    check_zero3(config, zero_stage(accelerator), accelerator.num_processes)
    torch.manual_seed(config.run.seed)
    kd = config.kd
    bf16 = accelerator.mixed_precision == "bf16"
    with whole_weights(accelerator):  # the frozen teacher is never prepared: it must load whole
        student, tokenizer = load_lm(config.model.path, config.model.tokenizer, config.model.random_init,
                                     config.run.seed)
        teacher = None if kd.loss == "seqkd" else load_teacher(config, student, accelerator.device, bf16)
    if config.model.gradient_checkpointing:
        student.gradient_checkpointing_enable()
    apply_lora(student, config.lora)
    if config.model.compile:   # the teacher's no-grad passes too
        compile_models([student, teacher], "model.compile")
    examples, stats = load_trajectories(config.data.train, tokenizer, max_length=config.data.max_length,
                                        only_correct=config.data.only_correct,
                                        chat_template=config.data.chat_template, limit=config.data.limit)
    report_data(accelerator, config.data.train, stats)
    chunked = config.chunk_size > 0

    def loss_fn(module: Any, batch: dict) -> tuple[Any, dict]:
        on_policy = kd.on_policy > 0 and random.Random(config.run.seed * 7919 + batch["micro"]).random() < kd.on_policy
        if on_policy:
            lm = accelerator.unwrap_model(module).lm
            sampled = on_policy_turn(lm, tokenizer, batch["examples"], kd.max_new_tokens)
            batch = {k: v.to(accelerator.device) for k, v in collate(sampled, tokenizer.pad_token_id).items()}
        if kd.loss == "seqkd":
            return module(batch["input_ids"], batch["attention_mask"], batch["target_mask"], kind="seqkd"), {}
        with torch.autocast(accelerator.device.type, dtype=torch.bfloat16, enabled=bf16):
            target = teacher_targets(teacher, batch["input_ids"], batch["attention_mask"], batch["target_mask"],
                                     chunked)
        loss = module(batch["input_ids"], batch["attention_mask"], batch["target_mask"], kind=kd.loss,
                      teacher=target, beta=kd.jsd_beta, temperature=kd.temperature)
        return loss, {"on_policy": int(on_policy)}

    trainer = Trainer(config, MaskedLMLoss(student, config.chunk_size), tokenizer, examples, loss_fn,
                      accelerator, eval_fn=make_eval_fn(config, tokenizer), on_step=on_step)
    return trainer.train()
