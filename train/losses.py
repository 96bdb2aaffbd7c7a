"""Distillation and SFT losses on generated tokens, in two forms.

* `token_losses` works on full logits with plain autograd. It is the reference:
  short, obviously right, checked against hand computations in the tests.
* `chunked_head_loss` never materialises the [tokens, vocab] logits. It takes
  the final hidden states and the LM-head weights of student and teacher and
  walks the vocabulary in column chunks, twice or three times: first for the two
  log-normalisers, then for the loss and its gradient with respect to the
  student logits, which it folds straight into gradients for the hidden states
  and the head weights. Peak extra memory is O(tokens x chunk) instead of
  O(tokens x vocab) - Qwen's 151,936-column vocabulary fits.

Losses (s = student log-probs, t = teacher log-probs, p = e^s, q = e^t, all at
temperature T and scaled by T^2 as in Hinton et al.):

    forward_kl  KL(q || p) = sum q (t - s)           the DGPO cold start
    reverse_kl  KL(p || q) = sum p (s - t)
    jsd         beta KL(q || m) + (1 - beta) KL(p || m),  m = beta q + (1 - beta) p   (GKD)
    seqkd / ce  -log p(y)  on the sampled token y (SeqKD on teacher text, SFT on gold text)

Gradients with respect to the student logits z (used by the chunked form):
forward KL and CE give p - q (q one-hot for CE); for reverse KL and JSD, with
g = dL/dp, dL/dz = p (g - sum p g), where g = s - t (reverse KL) or
(1 - beta)(s - log m) (JSD).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import attention   # last_hidden / lm_logits: one place decides the mask and cache of every pass

SOFT_LOSSES = ("forward_kl", "reverse_kl", "jsd")


# --- reference: full logits, plain autograd --------------------------------------------

def token_losses(student_logits: torch.Tensor, teacher_logits: torch.Tensor | None = None,
                 targets: torch.Tensor | None = None, kind: str = "forward_kl",
                 beta: float = 0.5, temperature: float = 1.0) -> torch.Tensor:
    """Per-token loss [N] from logits [N, V] (teacher logits for soft losses, targets for CE)."""
    if kind in ("ce", "seqkd"):
        return F.cross_entropy(student_logits.float(), targets, reduction="none")
    T = temperature
    s = F.log_softmax(student_logits.float() / T, dim=-1)
    t = F.log_softmax(teacher_logits.float() / T, dim=-1)
    if kind == "forward_kl":
        per = (t.exp() * (t - s)).sum(-1)
    elif kind == "reverse_kl":
        per = (s.exp() * (s - t)).sum(-1)
    elif kind == "jsd":
        log_m = torch.logaddexp(t + math.log(beta), s + math.log(1 - beta))
        per = beta * (t.exp() * (t - log_m)).sum(-1) + (1 - beta) * (s.exp() * (s - log_m)).sum(-1)
    else:
        raise ValueError(f"unknown loss {kind!r}")
    return per * T * T


# --- chunked: hidden states and head weights, vocabulary in chunks ------------------------

def chunked_head_loss(h_s: torch.Tensor, w_s: torch.Tensor, weights: torch.Tensor, *,
                      h_t: torch.Tensor | None = None, w_t: torch.Tensor | None = None,
                      targets: torch.Tensor | None = None, kind: str = "forward_kl",
                      beta: float = 0.5, temperature: float = 1.0, chunk: int = 8192) -> torch.Tensor:
    """sum_n weights[n] * loss_n, differentiable in h_s [N, D] and w_s [V, D].

    Soft losses need the teacher's hidden states h_t [N, Dt] and head w_t [V, Dt];
    CE/SeqKD needs targets [N]. `chunk` columns are processed at a time (0: all).
    """
    if kind not in SOFT_LOSSES + ("ce", "seqkd"):
        raise ValueError(f"unknown loss {kind!r}")
    if kind in SOFT_LOSSES and (h_t is None or w_t is None):
        raise ValueError(f"{kind} needs the teacher's hidden states and head")
    if kind in SOFT_LOSSES and w_t.shape[0] != w_s.shape[0]:
        raise ValueError(f"vocabularies differ: student {w_s.shape[0]}, teacher {w_t.shape[0]}")
    if kind not in SOFT_LOSSES and targets is None:
        raise ValueError(f"{kind} needs targets")
    T = 1.0 if kind in ("ce", "seqkd") else float(temperature)  # hard targets: plain CE
    spec = (kind, float(beta), T, int(chunk) or w_s.shape[0])
    return _ChunkedHeadLoss.apply(h_s, w_s, weights, h_t, w_t, targets, spec)


class _ChunkedHeadLoss(torch.autograd.Function):
    """Computes the loss and its gradients in forward (the logits are gone by backward)."""

    @staticmethod
    def forward(ctx, h_s, w_s, weights, h_t, w_t, targets, spec):
        kind, beta, T, chunk = spec
        with torch.no_grad():
            loss, grad_h, grad_w = _loss_and_grads(h_s, w_s, weights.float(), h_t, w_t, targets,
                                                   kind, beta, T, chunk)
        ctx.save_for_backward(grad_h.to(h_s.dtype), grad_w.to(w_s.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None, None, None, None


def _slices(vocab: int, chunk: int):
    for start in range(0, vocab, chunk):
        yield slice(start, min(start + chunk, vocab))


def _logits(h: torch.Tensor, w: torch.Tensor, cols: slice, T: float) -> torch.Tensor:
    return (h @ w[cols].T).float() / T


def _lse(h: torch.Tensor, w: torch.Tensor, T: float, chunk: int) -> torch.Tensor:
    """log-sum-exp over the whole vocabulary, one chunk at a time."""
    out = torch.full((h.shape[0],), -math.inf, device=h.device)
    for cols in _slices(w.shape[0], chunk):
        out = torch.logaddexp(out, torch.logsumexp(_logits(h, w, cols, T), dim=-1))
    return out


def _loss_and_grads(h_s, w_s, weights, h_t, w_t, targets, kind, beta, T, chunk):
    V = w_s.shape[0]
    lse_s = _lse(h_s, w_s, T, chunk)
    soft = kind in SOFT_LOSSES
    lse_t = _lse(h_t, w_t, T, chunk) if soft else None

    def chunk_terms(cols):
        """Student log-probs s, probs p, and teacher log-probs t for one chunk."""
        s = _logits(h_s, w_s, cols, T) - lse_s[:, None]
        t = _logits(h_t, w_t, cols, T) - lse_t[:, None] if soft else None
        return s, s.exp(), t

    # Pass for the per-token loss and, for reverse KL / JSD, A = sum_i p_i g_i.
    per = torch.zeros_like(lse_s)
    if kind in ("reverse_kl", "jsd"):
        a = torch.zeros_like(lse_s)
        for cols in _slices(V, chunk):
            s, p, t = chunk_terms(cols)
            if kind == "reverse_kl":
                g = s - t
                per += (p * g).sum(-1)
            else:
                log_m = torch.logaddexp(t + math.log(beta), s + math.log(1 - beta))
                per += beta * (t.exp() * (t - log_m)).sum(-1) + (1 - beta) * (p * (s - log_m)).sum(-1)
                g = (1 - beta) * (s - log_m)
            a += (p * g).sum(-1)

    # Gradient pass: dL/dz per chunk, folded into dL/dh and dL/dW at once.
    scale = (weights * T)[:, None]  # d(T^2 * loss)/d(logits) = T * dL/dz, times the token weight
    grad_h = torch.zeros(h_s.shape, dtype=torch.float32, device=h_s.device)
    grad_w = torch.zeros(w_s.shape, dtype=torch.float32, device=w_s.device)
    for cols in _slices(V, chunk):
        s, p, t = chunk_terms(cols)
        if kind == "forward_kl":
            q = t.exp()
            per += (q * (t - s)).sum(-1)
            gz = p - q
        elif kind == "reverse_kl":
            gz = p * (s - t - a[:, None])
        elif kind == "jsd":
            log_m = torch.logaddexp(t + math.log(beta), s + math.log(1 - beta))
            gz = p * ((1 - beta) * (s - log_m) - a[:, None])
        else:  # ce / seqkd: p - onehot(y)
            gz = p
            inside = (targets >= cols.start) & (targets < cols.stop)
            rows = inside.nonzero(as_tuple=True)[0]
            gz[rows, targets[rows] - cols.start] -= 1.0
            per[rows] -= s[rows, targets[rows] - cols.start]
        gz = (gz * scale).to(h_s.dtype)
        grad_h += (gz @ w_s[cols]).float()
        grad_w[cols] += (gz.T @ h_s).float()
    return (per * weights).sum() * T * T, grad_h, grad_w


# --- the module the trainer prepares ------------------------------------------------------

class MaskedLMLoss(torch.nn.Module):
    """A causal LM plus the loss on its generated tokens (mean over those tokens).

    Wrapping the loss in the module that `accelerate` prepares puts it inside
    DDP's forward and bf16 autocast. With `chunk_size` > 0 it reads the decoder's
    final hidden states and the head weight and calls `chunked_head_loss`;
    with 0 it uses the model's full logits (the form DeepSpeed ZeRO-3 needs,
    where the head weight is sharded outside the head's own forward).
    """

    def __init__(self, lm: torch.nn.Module, chunk_size: int = 8192):
        super().__init__()
        self.lm = lm
        # accelerate sizes DeepSpeed's "auto" ZeRO-3 buckets from the prepared model's config.
        self.config = lm.config
        self.chunk_size = chunk_size
        head = lm.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("LM heads with a bias are not supported")

    def forward(self, input_ids, attention_mask, target_mask, kind: str = "ce",
                teacher: dict | None = None, beta: float = 0.5, temperature: float = 1.0):
        sel = target_mask > 0
        n = sel.sum().clamp(min=1)
        targets = torch.roll(input_ids, shifts=-1, dims=1)[sel]
        if self.chunk_size:
            hidden = attention.last_hidden(self.lm.get_decoder(), input_ids, attention_mask)
            weights = torch.full((int(sel.sum()),), 1.0, device=hidden.device) / n
            t = teacher or {}
            return chunked_head_loss(hidden[sel], self.lm.get_output_embeddings().weight, weights,
                                     h_t=t.get("hidden"), w_t=t.get("head"), targets=targets, kind=kind,
                                     beta=beta, temperature=temperature, chunk=self.chunk_size)
        logits = attention.lm_logits(self.lm, input_ids, attention_mask)[sel]
        t_logits = teacher.get("logits") if teacher else None
        return token_losses(logits, t_logits, targets, kind, beta, temperature).sum() / n


@torch.no_grad()
def teacher_targets(teacher: torch.nn.Module, input_ids, attention_mask, target_mask,
                    chunked: bool) -> dict:
    """What a soft loss needs from the frozen teacher at the generated positions."""
    sel = target_mask > 0
    if chunked:
        hidden = attention.last_hidden(teacher.get_decoder(), input_ids, attention_mask)
        return {"hidden": hidden[sel], "head": teacher.get_output_embeddings().weight}
    return {"logits": attention.lm_logits(teacher, input_ids, attention_mask)[sel]}
