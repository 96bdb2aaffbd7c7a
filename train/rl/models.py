"""The models of an RL run: the policy's log-prob head, the critic, the teacher's log-probs.

Token alignment (shared with train/rl/math.py): for a sequence of ids, the
value at position t belongs to token t - the log-prob of token t given the
tokens before it, the entropy of that next-token distribution, and the
critic's value of the state in which token t is chosen. Position 0 has none.

Only generated positions matter, so the LM head runs on the hidden states of
those positions alone (a trajectory is mostly prompt and retrieved passages),
in row chunks, which keeps full [tokens, vocabulary] logits out of memory
except for the rows in flight. With gradients, the chunks' logits are not kept
for the backward either: it recomputes them (`HeadLogps`), so a micro-batch
holds its hidden states and two numbers per position instead of several
[positions, vocabulary] float32 tensors (at Qwen's 151,936 words, 1.2 GB each
per 2,048 positions).

Rows are padded on the right, so the models get no attention mask
(train/attention.py `last_hidden`): PyTorch's fused causal attention instead of
a masked kernel, the same values at real tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from dgpo_edge.errors import InputError

from ..attention import last_hidden
from . import math as rl_math


def select_hidden(hidden: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden states that predict the masked tokens [N, H], those tokens [N]), row-major order."""
    where = mask[:, 1:].bool()
    return hidden[:, :-1][where], input_ids[:, 1:][where]


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a matmul of `t` runs in here: autocast's when it is on, else t's own."""
    device = t.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else t.dtype


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """z = h W^T / T of one chunk, in float32 from `dtype` logits. The [rows, vocabulary] tensors are
    the head's whole cost, so z is divided in place, and not at all at T = 1 (x / 1 is x)."""
    z = torch.nn.functional.linear(h.to(dtype), w).float()
    return z if temperature == 1 else z.div_(temperature)


class HeadLogps(torch.autograd.Function):
    """(log softmax(h W^T / T) at the targets [N], entropies [N] or empty), `rows` positions at a
    time, in float32 from `dtype` logits. The backward recomputes each chunk's logits rather than
    keeping them: the only per-position state kept is the log-sum-exp and the entropy.

    With z = logits / T, p = softmax(z), lse = logsumexp(z) and H = -sum p log p:
    d logp_t / dz = onehot(t) - p, and dH / dz = -p (log p + H), log p = z - lse.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, rows, entropy, dtype):
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        ent = hidden.new_empty(n if entropy else 0, dtype=torch.float32)
        w = weight.to(dtype)
        for i in range(0, n, rows):
            z = _chunk_logits(hidden[i:i + rows], w, temperature, dtype)
            lse[i:i + rows] = chunk_lse = torch.logsumexp(z, dim=-1)
            if entropy:   # log p over the whole vocabulary, in z's place
                log_p = z.sub_(chunk_lse[:, None])
                logp[i:i + rows] = log_p.gather(-1, targets[i:i + rows, None])[:, 0]
                ent[i:i + rows] = -torch.exp(log_p).mul_(log_p).sum(-1)
            else:         # only at the targets: the same numbers, without another [rows, V] tensor
                logp[i:i + rows] = z.gather(-1, targets[i:i + rows, None])[:, 0] - chunk_lse
        ctx.save_for_backward(hidden, weight, targets, lse, ent)
        ctx.temperature, ctx.rows, ctx.entropy, ctx.dtype = temperature, rows, entropy, dtype
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable   # no double backward: say so rather than be wrong
    def backward(ctx, g_logp, g_ent):
        hidden, weight, targets, lse, ent = ctx.saved_tensors
        t, rows, dtype = ctx.temperature, ctx.rows, ctx.dtype
        w = weight.to(dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for i in range(0, hidden.shape[0], rows):
            h = hidden[i:i + rows].to(dtype)
            # log p from the forward's log-sum-exp, so it is the forward's log p exactly
            shifted = _chunk_logits(h, w, t, dtype).sub_(lse[i:i + rows, None])
            # gz = -p g_logp - p (log p + H) g_ent (+ g_logp at the target), then / T. Worked in place
            # (shifted, then p, become the terms): the same products in the same order as the plain
            # expression, so the same bits, with two [rows, V] float32 tensors instead of eight.
            p = torch.exp(shifted)
            g1 = g_logp[i:i + rows, None]
            entropy_term = None
            if ctx.entropy and g_ent is not None:
                entropy_term = shifted.add_(ent[i:i + rows, None]).mul_(p).mul_(g_ent[i:i + rows, None])
            gz = p.mul_(-g1)
            if entropy_term is not None:
                gz.sub_(entropy_term)
            gz.scatter_add_(-1, targets[i:i + rows, None], g1)
            gz = (gz if t == 1 else gz.div_(t)).to(dtype)
            if grad_h is not None:
                grad_h[i:i + rows] = (gz @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w += (gz.t() @ h).float()
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None


def head_logps(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
               entropy: bool = False, rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(head(h) / T) at `targets` [N] (and the entropies [N]), `rows` at a time.

    A plain bias-free linear head (Qwen's, Llama's, tied or not) goes through `HeadLogps`; any other
    head (an adapter on the head, a bias) through autograd over each chunk's kept logits."""
    if type(head) is torch.nn.Linear and head.bias is None:
        logp, ent = HeadLogps.apply(hidden, head.weight, targets, temperature, rows, entropy,
                                    _compute_dtype(hidden))
        return logp, ent if entropy else None
    return kept_logits_logps(head, hidden, targets, temperature, entropy, rows)


def kept_logits_logps(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                      entropy: bool = False, rows: int = 2048) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`head_logps` by autograd through each chunk's logits, kept for the backward (any head)."""
    logps, ents = [], []
    for i in range(0, hidden.shape[0], rows):
        logits = head(hidden[i:i + rows]).float() / temperature
        logp = torch.log_softmax(logits, dim=-1)
        logps.append(logp.gather(-1, targets[i:i + rows, None])[:, 0])
        if entropy:
            ents.append(rl_math.entropy_from_logits(logits))
    empty = hidden.new_zeros(0, dtype=torch.float32)
    flat = torch.cat(logps) if logps else empty
    return flat, (torch.cat(ents) if ents else empty) if entropy else None


def scatter(flat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Put per-generated-token values [N] back into a [B, L] tensor (0 elsewhere); differentiable."""
    out = torch.zeros(mask.shape, dtype=flat.dtype, device=flat.device)
    return out.masked_scatter(mask.bool(), flat)


class PolicyHead(torch.nn.Module):
    """Wraps the causal LM so that `accelerate.prepare` (DDP, autocast) sees one forward.

    forward -> (log-probs [B, L], entropies [B, L] or None), zero off the mask.
    """

    def __init__(self, lm: Any, rows: int = 2048):
        super().__init__()
        self.lm, self.rows = lm, rows

    def forward(self, input_ids, attention_mask, mask, temperature: float = 1.0, entropy: bool = False):
        hidden = last_hidden(self.lm.base_model, input_ids, attention_mask)
        h, targets = select_hidden(hidden, input_ids, mask)
        logp, ent = head_logps(self.lm.get_output_embeddings(), h, targets, temperature, entropy, self.rows)
        return scatter(logp, mask), None if ent is None else scatter(ent, mask)


class ValueModel(torch.nn.Module):
    """The critic: the student's transformer body with a linear head to one value per position.

    The head starts at zero, so the first values are 0 and the first advantages
    are the plain returns. forward -> values [B, L] (fp32), aligned as above.
    """

    def __init__(self, body: Any, hidden_size: int):
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask):
        hidden = last_hidden(self.body, input_ids, attention_mask)
        v = self.head(hidden).squeeze(-1).float()
        return torch.nn.functional.pad(v[:, :-1], (1, 0))


def check_no_dropout(model: Any, where: Any) -> None:
    """Refuse a model that drops out anything in training mode. RL scores and updates in training
    mode (loop.py `_train_mode`), and each pass would draw a new mask: the old and new log-probs of the
    same tokens would differ and the PPO ratio would be noise. Llama and Qwen2 drop attention weights
    by `config.attention_dropout`; other dropout (LoRA's too) lives in nn.Dropout modules."""
    rates = {}
    for name, m in model.named_modules():   # configs sit on the model and, in the critic, on its body
        rate = getattr(getattr(m, "config", None), "attention_dropout", 0)
        if isinstance(rate, (int, float)) and rate > 0:
            rates[f"{name or 'model'}.config.attention_dropout"] = rate
        if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0:   # Dropout, Dropout1d-3d, AlphaDropout...
            rates[name] = m.p
    if rates:
        name, p = next(iter(rates.items()))
        raise InputError(f"the model drops out in training mode ({name} = {p}{' and more' if len(rates) > 1 else ''}); "
                         "RL needs a model without dropout, or the PPO ratio would be noise", where)


def make_critic(lm: Any) -> ValueModel:
    """A critic from a (freshly loaded) copy of the student; its LM head is dropped."""
    return ValueModel(lm.base_model, lm.config.hidden_size)


# --- teacher and reference ----------------------------------------------------------------

def check_same_tokenizer(student_tok: Any, teacher_tok: Any, where: str) -> None:
    """DGPO compares log-probs token by token: the vocabularies must be identical."""
    if student_tok.get_vocab() != teacher_tok.get_vocab():
        raise InputError(f"the teacher's tokenizer differs from the student's ({len(teacher_tok):,} vs "
                         f"{len(student_tok):,} tokens); DGPO needs the same tokenizer", where)


@torch.no_grad()
def frozen_logps(lm: Any, input_ids, attention_mask, mask, temperature: float = 1.0,
                 rows: int = 2048) -> torch.Tensor:
    """Log-probs [B, L] of the masked tokens under a frozen model (teacher or reference)."""
    return PolicyHead(lm, rows)(input_ids, attention_mask, mask, temperature)[0]


@torch.no_grad()
def lm_full_vocab_kl(student: Any, teacher: Any, input_ids, attention_mask, mask, direction: str,
                  temperature: float = 1.0, rows: int = 2048) -> torch.Tensor:
    """Full-vocabulary KL per generated token [B, L] between the student's and the teacher's
    next-token distributions (`direction` reverse = KL(student || teacher))."""
    hs, targets = select_hidden(last_hidden(student.base_model, input_ids, attention_mask), input_ids, mask)
    ht, _ = select_hidden(last_hidden(teacher.base_model, input_ids, attention_mask), input_ids, mask)
    head_s, head_t = student.get_output_embeddings(), teacher.get_output_embeddings()
    parts = []
    for i in range(0, hs.shape[0], rows):
        ls = head_s(hs[i:i + rows]).float() / temperature
        lt = head_t(ht[i:i + rows]).float() / temperature
        parts.append(rl_math.full_vocab_kl(ls, lt, direction=direction))
    flat = torch.cat(parts) if parts else hs.new_zeros(0, dtype=torch.float32)
    return scatter(flat, mask)
