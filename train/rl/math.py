"""The pure tensor math of PPO, DGPO and GRPO, kept apart from models and loops.

Every tensor is [B, L], aligned with the token positions of right-padded
episodes. `mask` (float or bool, [B, L]) is 1 on tokens the policy sampled and 0
on the prompt, on `<information>` blocks, on environment feedback and on
padding. `logp*` holds the log-probability of the token AT that position. All
results are float32, and positions where the mask is 0 are never read for
their value: inputs there may hold anything (even NaN) and come out as exact 0.

Map of the module:

    masked_mean, masked_whiten, last_token_index     masking helpers
    response_mask, shifted_response_mask,             the reference's masks, and the
    whiten_advantages, value_mask                     ppo.whiten / critic.value_mask choices
    selective_rows, teacher_kl, full_vocab_kl,        the DGPO teacher term
    teacher_penalty, kl_penalty_loss
    token_rewards, gae                                PPO rewards and advantages
    grpo_advantages                                   the critic-free baseline
    policy_loss, value_loss, entropy_from_logits      PPO losses
    CollapseWatch                                     reward-collapse alarm

The DGPO recipe (docs/architecture.md#dgpo-as-implemented-here), step by step:

    s          = exact match of the last answer, 0 or 1 per rollout
    rows       = selective_rows(s)                      # s < 0.1: only failed rollouts
    k_t        = teacher_kl(logp_old, logp_teacher)     # log pi_old(y_t) - log pi_teacher(y_t)
    penalty    = teacher_penalty(k_t, mask, rows, beta=0.001)
    r_t        = token_rewards(s, mask, penalty)        # s on the last generated token, minus beta*k_t
    steps      = value_mask(attention, mask, "reference")   # every state, observations and terminal too
    A, R       = gae(r_t, values, steps)                # gamma = lambda = 1
    A          = whiten_advantages(A, mask, attention, "reference", all_reduce_sum)
    loss       = policy_loss(..., mask) + value_loss(..., steps) - 0.001 * entropy

k_t is a one-sample (k1) estimate of the reverse KL KL(pi_student || pi_teacher)
on the student's own sampled tokens; GAE's return-to-go adds it up along the
rollout, so a failed rollout pays beta times its sequence-level KL to the
teacher, while a correct rollout pays nothing and is left free to keep what
worked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

KL_ESTIMATORS = ("k1", "k3")


# --- masking helpers --------------------------------------------------------------------

def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    """The mask as booleans, whether it came as 0/1 floats or as bools."""
    return mask if mask.dtype == torch.bool else mask != 0


def _zero_outside(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x as float32 with exact zeros where the mask is 0.

    Cleaning the inputs first (rather than only multiplying results by the mask)
    keeps NaN or inf at masked positions out of both the values and the
    gradients: 0 * NaN would still be NaN.
    """
    return torch.where(_as_bool(mask), x.float(), torch.zeros((), dtype=torch.float32, device=x.device))


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """sum(x * mask) / max(sum(mask), 1), over everything or over `dim` (as torch.sum).

    A float mask acts as weights. The floor of 1 makes an empty selection give
    0 instead of NaN, so a batch without any selected token still backpropagates.
    """
    w = mask.float()
    total = _zero_outside(x, mask) * w
    if dim is None:
        return total.sum() / w.sum().clamp(min=1.0)
    return total.sum(dim) / w.sum(dim).clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
                  unbiased: bool = False, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
                  ) -> torch.Tensor:
    """(x - mu) / sqrt(var + eps) with mu and var taken over the masked entries only.

    unbiased=False divides the sum of squares by the count n, True by n - 1
    (Bessel; with n <= 1 the variance is 0). `reduce` sums a tensor over all
    processes (an all-reduce); with it, mu and var are those of the global
    batch, so every process whitens with the same statistics - exactly as if
    the concatenated batch were whitened in one place. Two passes (mean, then
    centred squares) keep the variance accurate where a one-pass sum of
    squares would cancel. With shift_mean=False the mean is added back after
    scaling (only the spread is normalised), as verl does. Positions where the
    mask is 0 come out 0. Which mask, which variance and which batch: see
    `whiten_advantages`.
    """
    reduce = reduce or (lambda v: v)
    clean = _zero_outside(x, mask)
    sums = reduce(torch.stack([clean.sum(), mask.float().sum()]))
    count = sums[1]
    mu = sums[0] / count.clamp(min=1.0)
    centred = torch.where(_as_bool(mask), clean - mu, 0.0)
    squares = reduce(centred.square().sum().reshape(1))[0]
    var = squares / ((count - 1.0) if unbiased else count).clamp(min=1.0)
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mu
    return _zero_outside(out, mask)


def response_mask(attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Float [B, L]: 1 from each row's first generated token to its last real token, observations included.

    This is the reference's "response" attention mask: everything after the
    initial prompt that is not padding. A row without a generated token has none.
    """
    gen = _as_bool(mask)
    started = gen.long().cummax(dim=-1).values.bool()
    return (started & _as_bool(attention_mask)).float()


def shifted_response_mask(attention_mask: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`response_mask` shifted one position right: the first generated token up to one past the last real one.

    Position t holds the state before token t (rl/models.py), so this covers
    every state the episode passes through: before each generated or
    observation token, plus the terminal state after the last token (value
    target 0). The reference trains its critic on exactly these positions
    (the attention mask shifted by one). A row that fills the batch's width
    has no room for its terminal position; `batch.pack` leaves one padding
    column so none does.
    """
    resp = response_mask(attention_mask, mask)
    shifted = torch.nn.functional.pad(resp[:, :-1], (1, 0))
    return torch.maximum(resp, shifted)


WHITEN_MODES = ("reference", "generated", "none")
VALUE_MASKS = ("reference", "generated")


def whiten_advantages(adv: torch.Tensor, mask: torch.Tensor, attention_mask: torch.Tensor, mode: str,
                      reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Advantages whitened the `ppo.whiten` way.

    reference: over the response mask (observation tokens included), unbiased
               variance, statistics of the global batch (`reduce` all-reduces);
               as the reference DGPO code (verl's masked_whiten on the response
               attention mask of the whole batch);
    generated: over the generated tokens only, biased variance, this process's
               rollouts only (the older behaviour here);
    none:      unchanged.
    """
    if mode == "reference":
        return masked_whiten(adv, response_mask(attention_mask, mask), unbiased=True, reduce=reduce)
    if mode == "generated":
        return masked_whiten(adv, mask)
    if mode == "none":
        return adv
    raise ValueError(f"whiten must be one of {WHITEN_MODES}, not {mode!r}")


def value_mask(attention_mask: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Float [B, L]: the positions the critic is trained on and GAE steps through (`critic.value_mask`).

    reference: `shifted_response_mask` - every state of the episode, before
               generated and observation tokens alike, plus the terminal one;
    generated: the generated tokens only (observations skipped).
    """
    if mode == "reference":
        return shifted_response_mask(attention_mask, mask)
    if mode == "generated":
        return mask.float()
    raise ValueError(f"value_mask must be one of {VALUE_MASKS}, not {mode!r}")


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """For each row, the index of the last position where the mask is 1; -1 for an all-zero row."""
    m = _as_bool(mask)
    positions = torch.arange(m.shape[-1], device=m.device).expand_as(m)
    return torch.where(m, positions, torch.full_like(positions, -1)).max(dim=-1).values


# --- the DGPO teacher term ---------------------------------------------------------------

def selective_rows(scores: torch.Tensor, threshold: float = 0.1, apply_to: str = "failed") -> torch.Tensor:
    """Which rollouts receive the teacher term: score < threshold ("failed") or every row ("all").

    DGPO's point: only a wrong, missing or malformed answer (reward 0) is pulled
    toward the teacher; a correct rollout already did the right thing and gets
    no KL term at all. "all" is the uniform-KL ablation, which scored lower.
    """
    if apply_to == "failed":
        return scores.float() < threshold
    if apply_to == "all":
        return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    raise ValueError(f"apply_to must be 'failed' or 'all', not {apply_to!r}")


def _kl_estimate(logp: torch.Tensor, logp_teacher: torch.Tensor, estimator: str) -> torch.Tensor:
    """k1 = logp - logp_teacher, or k3 = exp(-d) + d - 1 with d = logp - logp_teacher."""
    d = logp.float() - logp_teacher.float()
    if estimator == "k1":
        return d
    if estimator == "k3":
        return torch.exp(-d) + d - 1.0
    raise ValueError(f"estimator must be one of {KL_ESTIMATORS}, not {estimator!r}")


def teacher_kl(logp_old: torch.Tensor, logp_teacher: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi_old || pi_teacher) on the tokens the student sampled.

    k1 = log pi_old - log pi_teacher (unbiased, can be negative; what DGPO uses);
    k3 = exp(log pi_teacher - log pi_old) - (log pi_teacher - log pi_old) - 1
    (Schulman's estimator: unbiased too, never negative, lower variance).
    Every position is computed; `teacher_penalty` applies the mask.
    """
    return _kl_estimate(logp_old, logp_teacher, estimator)


def full_vocab_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                  direction: str = "reverse") -> torch.Tensor:
    """Exact per-position KL from logits [..., V]: reverse = KL(pi_s || pi_t), forward = KL(pi_t || pi_s).

    reverse = sum_v p_s (log p_s - log p_t); forward = sum_v p_t (log p_t - log p_s).
    An alternative to the one-sample estimate when both sets of logits are at hand.
    """
    s = F.log_softmax(student_logits.float(), dim=-1)
    t = F.log_softmax(teacher_logits.float(), dim=-1)
    if direction == "reverse":
        p, a, b = s, s, t
    elif direction == "forward":
        p, a, b = t, t, s
    else:
        raise ValueError(f"direction must be 'reverse' or 'forward', not {direction!r}")
    return (p.exp() * (a - b)).sum(-1)


def _selected_tokens(mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Bool [B, L]: generated tokens of the selected rows."""
    return _as_bool(mask) & rows.to(torch.bool).unsqueeze(-1)


def teacher_penalty(kl: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, beta: float = 0.001) -> torch.Tensor:
    """beta * kl on the generated tokens of the selected rows, 0 elsewhere.

    This is the amount DGPO subtracts from each token's reward: correct rows
    (not selected) and observation tokens (mask 0) get exactly nothing.
    """
    return beta * _zero_outside(kl, _selected_tokens(mask, rows))


def kl_penalty_loss(logp: torch.Tensor, logp_teacher: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
                    estimator: str = "k3") -> torch.Tensor:
    """Mean over the selected rows' generated tokens of the KL estimate at the CURRENT logp (a scalar).

    The ablation that puts the teacher term into the loss instead of the
    reward, so it is differentiated directly rather than through the policy
    gradient. With no selected token the result is a 0 that still
    backpropagates (zero gradients), so the step needs no special case.
    """
    selected = _selected_tokens(mask, rows)
    logp = _zero_outside(logp, selected)
    logp_teacher = _zero_outside(logp_teacher, selected)
    return masked_mean(_kl_estimate(logp, logp_teacher, estimator), selected)


# --- rewards and advantages -------------------------------------------------------------

def token_rewards(scores: torch.Tensor, mask: torch.Tensor, penalty: torch.Tensor | None = None) -> torch.Tensor:
    """r[b, t] = scores[b] * [t = last generated token of b] - penalty[b, t] * mask[b, t].

    The outcome score goes on the last token the policy generated, even when
    observations or padding follow it; `penalty` is already composed (teacher
    term plus any reference-KL term) and only counts on generated tokens. A row
    with no generated token gets nothing.
    """
    last = last_token_index(mask)
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    has_token = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has_token]
    rewards[rows, last[has_token]] = scores.float().to(mask.device)[has_token]
    if penalty is not None:
        rewards = rewards - _zero_outside(penalty, mask)
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
        gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over the positions of `mask`; returns (advantages, returns).

    delta_t = r_t + gamma * V(next) - V_t,  A_t = delta_t + gamma * lam * A(next),  R_t = A_t + V_t,
    where "next" is the next position of the same row where the mask is 1;
    positions where it is 0 are skipped. After a row's last masked position the
    value is 0 (the episode ends). `value_mask` gives the two choices: the
    generated tokens only (observations skipped: the policy did not act there),
    or the reference's every state including observations and the terminal
    position after the last token (whose return is then 0, and whose value is
    bootstrapped by the last token).
    Rewards and values at masked positions are ignored, and advantages and
    returns are 0 there. Inputs are detached: these are regression targets.
    With gamma = lam = 1 this is A_t = (sum of rewards from t on) - V_t.
    """
    m = _as_bool(mask)
    r = _zero_outside(rewards.detach(), m)
    v = _zero_outside(values.detach(), m)
    next_value = torch.zeros(m.shape[0], dtype=torch.float32, device=m.device)
    next_adv = torch.zeros_like(next_value)
    advantages = torch.zeros_like(r)
    for t in reversed(range(m.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv = delta + gamma * lam * next_adv
        here = m[:, t]
        advantages[:, t] = torch.where(here, adv, 0.0)
        next_value = torch.where(here, v[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    return advantages, _zero_outside(advantages + v, m)


def grpo_advantages(scores: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6,
                    normalize_std: bool = True) -> torch.Tensor:
    """(score - group mean) / (group std + eps) per row; groups holds any integer id per row.

    The std is the unbiased one (divide by n - 1), as torch.std and the GRPO
    reference implementation use. A group of one row gets 0 (no baseline to
    compare against); a group whose scores are all equal gets 0 too.
    With normalize_std=False the advantage is just score - group mean (Dr. GRPO).
    """
    x = scores.float()
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    n = counts.float()
    mean = torch.zeros_like(n).index_add_(0, inverse, x) / n
    centred = x - mean[inverse]
    sq = torch.zeros_like(n).index_add_(0, inverse, centred.square())
    std = (sq / (n - 1).clamp(min=1.0)).sqrt()
    adv = centred / (std[inverse] + eps) if normalize_std else centred
    return torch.where(n[inverse] > 1, adv, torch.zeros_like(adv))


# --- PPO losses ---------------------------------------------------------------------------

def policy_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip: float = 0.2) -> tuple[torch.Tensor, dict]:
    """PPO's clipped surrogate, averaged over every generated token of the batch.

    ratio = exp(logp - logp_old);
    loss = mean_t max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - clip, 1 + clip)).
    Stats (python floats): clip_frac, the share of generated tokens where the
    clipped branch was strictly larger (so it set the loss and cut the gradient);
    approx_kl, the mean of logp_old - logp.
    """
    m = _as_bool(mask)
    log_ratio = _zero_outside(logp, m) - _zero_outside(logp_old, m)
    ratio = torch.exp(log_ratio)
    adv = _zero_outside(advantages, m)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(unclipped, clipped), m)
    stats = {
        "clip_frac": masked_mean((clipped > unclipped).float(), m).item(),
        "approx_kl": masked_mean(-log_ratio.detach(), m).item(),
    }
    return loss, stats


def value_loss(values: torch.Tensor, values_old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float = 0.5) -> tuple[torch.Tensor, dict]:
    """0.5 * mean_t max((v - R)^2, (v_old + clip(v - v_old, -clip, clip) - R)^2) over generated tokens.

    The clipped branch keeps the critic from moving further than `clip` from
    its rollout-time value in one update. Stat vf_clip_frac: the share of
    tokens where the clipped error was strictly larger.
    """
    m = _as_bool(mask)
    v = _zero_outside(values, m)
    v_old = _zero_outside(values_old, m)
    ret = _zero_outside(returns, m)
    v_clipped = v_old + (v - v_old).clamp(-clip, clip)
    err = (v - ret).square()
    err_clipped = (v_clipped - ret).square()
    loss = 0.5 * masked_mean(torch.maximum(err, err_clipped), m)
    return loss, {"vf_clip_frac": masked_mean((err_clipped > err).float(), m).item()}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum_v p_v log p_v of softmax(logits) over the last axis, in float32.

    Terms with p_v = 0 (logit -inf) count 0, in the value and in the gradient.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    logp = torch.where(p > 0, logp, torch.zeros_like(logp))
    return -(p * logp).sum(-1)


# --- collapse watch -----------------------------------------------------------------------

@dataclass
class CollapseWatch:
    """Warns when the reward's moving average falls far below its running best.

    Small students under PPO can collapse late in training (GRPO collapses on
    0.5B, and DGPO without a cold start collapses late:
    docs/architecture.md#dgpo-as-implemented-here); this
    catches it from the logged reward alone. The best is the highest moving
    average over full windows, so one lucky early batch cannot set it, and no
    alarm fires before the first window is full.
    """

    window: int = 10          # steps in the moving average
    drop: float = 0.5         # collapse when avg < (1 - drop) * best ...
    min_best: float = 0.05    # ... and best >= min_best (no alarms while nothing has been learned)
    recent: list[float] = field(default_factory=list, repr=False)
    best: float | None = field(default=None, repr=False)

    def update(self, reward: float) -> bool:
        """Add one step's reward; True when this step's moving average signals collapse."""
        self.recent = (self.recent + [float(reward)])[-self.window:]
        if len(self.recent) < self.window:
            return False
        avg = sum(self.recent) / len(self.recent)
        self.best = avg if self.best is None else max(self.best, avg)
        return self.best >= self.min_best and avg < (1.0 - self.drop) * self.best

    def state_dict(self) -> dict:
        """The mutable state as plain JSON types, for resume."""
        return {"recent": list(self.recent), "best": self.best}

    def load_state_dict(self, d: dict) -> None:
        """Restore what `state_dict` returned (the settings stay the constructor's)."""
        self.recent = [float(x) for x in d["recent"]][-self.window:]
        self.best = None if d["best"] is None else float(d["best"])
