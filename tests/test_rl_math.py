"""PPO / DGPO / GRPO core math against values computed by hand (written out, not recomputed)."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from dgpo_edge.train.rl.math import (
    CollapseWatch,
    entropy_from_logits,
    full_vocab_kl,
    gae,
    grpo_advantages,
    kl_penalty_loss,
    last_token_index,
    masked_mean,
    masked_whiten,
    policy_loss,
    selective_rows,
    teacher_kl,
    teacher_penalty,
    token_rewards,
    value_loss,
)

NAN = float("nan")


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, t(expected) if not isinstance(expected, torch.Tensor) else expected,
                               rtol=0, atol=tol)


# --- masking helpers ------------------------------------------------------------------------

def test_masked_mean_ignores_masked_values_even_nan():
    x = t([[1.0, NAN, 3.0], [4.0, 5.0, 6.0]])
    mask = t([[1, 0, 1], [0, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    close(masked_mean(x, mask, dim=1), [2.0, 0.0])          # empty row: 0, not NaN


def test_masked_whiten_uses_biased_variance_over_masked_entries():
    x = t([[1.0, 2.0, 3.0, 100.0]])
    mask = t([[1, 1, 1, 0]])
    # mean 2, biased variance (1 + 0 + 1) / 3, std 0.816497 -> +-1/0.816497 = 1.224745
    close(masked_whiten(x, mask), [[-1.224745, 0.0, 1.224745, 0.0]])
    close(masked_whiten(x, mask, shift_mean=False), [[0.775255, 2.0, 3.224745, 0.0]])


def test_last_token_index():
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    assert last_token_index(mask).tolist() == [3, -1, 0]


# --- teacher term ------------------------------------------------------------------------------

def test_selective_rows():
    scores = t([1.0, 0.0, 0.05, 0.1])
    assert selective_rows(scores).tolist() == [False, True, True, False]
    assert selective_rows(scores, apply_to="all").tolist() == [True] * 4
    with pytest.raises(ValueError):
        selective_rows(scores, apply_to="correct")


def test_teacher_kl_k1_and_k3_on_concrete_numbers():
    logp_old = t([[math.log(0.5), math.log(0.25)]])
    logp_teacher = t([[math.log(0.25), math.log(0.5)]])
    # k1: log 2 = 0.693147 and -log 2
    close(teacher_kl(logp_old, logp_teacher, "k1"), [[0.693147, -0.693147]])
    # k3: ratio teacher/old = 0.5 -> 0.5 + 0.693147 - 1; ratio 2 -> 2 - 0.693147 - 1
    close(teacher_kl(logp_old, logp_teacher, "k3"), [[0.193147, 0.306853]])
    with pytest.raises(ValueError):
        teacher_kl(logp_old, logp_teacher, "k2")


def test_full_vocab_kl_by_hand_on_two_symbols():
    student = t([[[0.0, 0.0]]])                         # p = (1/2, 1/2)
    teacher = t([[[math.log(3.0), 0.0]]])               # q = (3/4, 1/4)
    # reverse: 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.5 ln(4/3)
    close(full_vocab_kl(student, teacher, "reverse"), [[0.143841]])
    # forward: 0.75 ln(1.5) + 0.25 ln(0.5) = 0.304099 - 0.173287
    close(full_vocab_kl(student, teacher, "forward"), [[0.130812]])
    close(full_vocab_kl(student, student), [[0.0]])


def test_teacher_penalty_leaves_correct_rows_and_masked_tokens_alone():
    kl = t([[5.0, 5.0, 5.0], [2.0, NAN, -1.0]])
    mask = t([[1, 1, 1], [1, 0, 1]])
    rows = selective_rows(t([1.0, 0.0]))                # row 0 correct, row 1 failed
    close(teacher_penalty(kl, mask, rows, beta=0.5), [[0.0, 0.0, 0.0], [1.0, 0.0, -0.5]])


def test_kl_penalty_loss_value_and_gradient_only_on_selected_rows():
    logp = t([[math.log(0.5), math.log(0.5), 0.0], [math.log(0.5), 7.0, 0.0]]).requires_grad_()
    logp_teacher = t([[math.log(0.25), math.log(0.25), NAN], [math.log(0.25), 0.0, 0.0]])
    mask = t([[1, 1, 0], [1, 1, 0]])
    rows = torch.tensor([True, False])
    loss = kl_penalty_loss(logp, logp_teacher, mask, rows)   # k3 at ratio 0.5 on two tokens
    assert loss.item() == pytest.approx(0.193147, abs=1e-5)
    loss.backward()
    # d k3 / d logp = 1 - exp(logp_teacher - logp) = 0.5, averaged over the 2 selected tokens
    close(logp.grad, [[0.25, 0.25, 0.0], [0.0, 0.0, 0.0]])


def test_kl_penalty_loss_with_no_selected_row_is_a_differentiable_zero():
    logp = t([[-1.0, -2.0]]).requires_grad_()
    loss = kl_penalty_loss(logp, t([[-3.0, -3.0]]), t([[1, 1]]), torch.tensor([False]), estimator="k1")
    assert loss.item() == 0.0
    loss.backward()
    close(logp.grad, [[0.0, 0.0]])


# --- rewards and advantages ---------------------------------------------------------------------

def test_token_rewards_score_on_last_generated_token_despite_trailing_observations():
    #             gen gen obs obs gen pad          gen gen obs obs obs pad      empty row
    mask = t([[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    scores = t([1.0, 0.7, 1.0])
    close(token_rewards(scores, mask), [[0, 0, 0, 0, 1.0, 0], [0, 0.7, 0, 0, 0, 0], [0] * 6])
    penalty = t([[0.1, 0.2, 9.0, 9.0, 0.3, 9.0], [0.5, 0.5, NAN, 9.0, 9.0, 9.0], [9.0] * 6])
    close(token_rewards(scores, mask, penalty),
          [[-0.1, -0.2, 0, 0, 0.7, 0], [-0.5, 0.2, 0, 0, 0, 0], [0] * 6])


def test_gae_gamma_lambda_one_telescopes_to_score_minus_value():
    rewards = t([[0, 0, 1.0, 0], [0, 0, 0, 0]])
    values = t([[0.2, 0.5, 0.9, 4.0], [1.0, 1.0, 1.0, 1.0]])
    mask = t([[1, 1, 1, 0], [0, 0, 0, 0]])
    adv, ret = gae(rewards, values, mask)
    close(adv, [[0.8, 0.5, 0.1, 0.0], [0, 0, 0, 0]])
    close(ret, [[1.0, 1.0, 1.0, 0.0], [0, 0, 0, 0]])


def test_gae_by_hand_with_a_skipped_observation_in_the_middle():
    #               gen    gen   obs   gen   pad
    rewards = t([[-0.1, 0.0, 5.0, 1.0, 0.0]])
    values = t([[0.5, 0.4, 9.0, 0.6, 7.0]])
    mask = t([[1, 1, 0, 1, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # last gen:  delta = 1 - 0.6 = 0.4                            A = 0.4
    # middle:    delta = 0 + 0.9*0.6 - 0.4 = 0.14                 A = 0.14 + 0.72*0.4 = 0.428
    # first:     delta = -0.1 + 0.9*0.4 - 0.5 = -0.24             A = -0.24 + 0.72*0.428 = 0.06816
    close(adv, [[0.06816, 0.428, 0.0, 0.4, 0.0]])
    close(ret, [[0.56816, 0.828, 0.0, 1.0, 0.0]])


def test_grpo_advantages_on_two_groups_and_a_singleton():
    scores = t([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 7, 7, 7, 3])
    # group 0: mean 0.75, unbiased var 0.75/3 = 0.25, std 0.5
    # group 7: mean 1/3, unbiased var (2/3)/2 = 1/3, std 0.577350
    # group 3: a single row -> 0
    close(grpo_advantages(scores, groups, eps=0.0),
          [0.5, -1.5, 0.5, 0.5, -0.577350, -0.577350, 1.154701, 0.0])
    close(grpo_advantages(scores, groups, normalize_std=False),
          [0.25, -0.75, 0.25, 0.25, -0.333333, -0.333333, 0.666667, 0.0])
    close(grpo_advantages(t([1.0, 1.0]), torch.tensor([4, 4])), [0.0, 0.0])


# --- PPO losses ----------------------------------------------------------------------------------

def test_policy_loss_clipping_for_both_signs_of_advantage():
    ratios = [1.1, 1.5, 0.5, 1.5, 0.5]
    adv = t([[1.0, 1.0, -1.0, -1.0, 1.0, NAN]])
    logp_old = t([[-1.0] * 5 + [NAN]])
    logp = t([[-1.0 + math.log(r) for r in ratios] + [NAN]]).requires_grad_()
    mask = t([[1, 1, 1, 1, 1, 0]])
    loss, stats = policy_loss(logp, logp_old, adv, mask, clip=0.2)
    # A=+1 r=1.1 inside: -1.1 | A=+1 r=1.5: max(-1.5, -1.2) = -1.2 (clipped)
    # A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped) | A=-1 r=1.5: max(1.5, 1.2) = 1.5
    # A=+1 r=0.5: max(-0.5, -0.8) = -0.5;  mean = -0.5 / 5
    assert loss.item() == pytest.approx(-0.1, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(0.4)
    # approx_kl = -mean(log ratio) = -ln(1.1*1.5*0.5*1.5*0.5)/5 = -ln(0.61875)/5
    assert stats["approx_kl"] == pytest.approx(0.0960112, abs=1e-6)
    assert isinstance(stats["clip_frac"], float) and isinstance(stats["approx_kl"], float)
    loss.backward()
    # d/dlogp of -A*r = -A*r / 5 where unclipped; 0 where clipped and where masked
    close(logp.grad, [[-1.1 / 5, 0.0, 0.0, 1.5 / 5, -0.5 / 5, 0.0]])


def test_value_loss_clipping():
    values = t([[1.0, 2.0, 2.0, -1.0, NAN]])
    values_old = t([[0.8, 0.5, 0.5, 0.0, NAN]])
    returns = t([[0.0, 0.0, 3.0, -0.2, NAN]])
    mask = t([[1, 1, 1, 1, 0]])
    loss, stats = value_loss(values, values_old, returns, mask, clip=0.5)
    # squared errors (unclipped, clipped): (1, 1), (4, 1), (1, 4), (0.64, 0.09)
    # 0.5 * mean(1, 4, 4, 0.64) = 1.205; only the third token takes the clipped branch
    assert loss.item() == pytest.approx(1.205, abs=1e-6)
    assert stats["vf_clip_frac"] == pytest.approx(0.25)


def test_entropy_from_logits():
    close(entropy_from_logits(torch.zeros(2, 3, 5)), torch.full((2, 3), math.log(5)))
    # p = (1/4, 3/4): 0.25 ln 4 + 0.75 ln(4/3) = 0.346574 + 0.215762
    close(entropy_from_logits(t([0.0, math.log(3.0)])), t(0.562335))
    logits = t([0.0, 0.0, float("-inf")]).requires_grad_()
    h = entropy_from_logits(logits)
    assert h.item() == pytest.approx(math.log(2))
    h.backward()
    assert torch.isfinite(logits.grad).all()


# --- collapse watch --------------------------------------------------------------------------------

def test_collapse_watch_quiet_while_rising():
    watch = CollapseWatch(window=3)
    assert not any(watch.update(r / 10) for r in range(1, 10))


def test_collapse_watch_alarms_after_a_drop():
    watch = CollapseWatch(window=3, drop=0.5)
    assert not any(watch.update(0.6) for _ in range(3))      # best 0.6, alarm below 0.3
    assert watch.update(0.0) is False                         # average 0.4
    assert watch.update(0.0) is True                          # average 0.2


def test_collapse_watch_quiet_below_min_best():
    watch = CollapseWatch(window=3, min_best=0.05)
    assert not any(watch.update(r) for r in [0.04, 0.04, 0.04, 0.0, 0.0, 0.0])


def test_collapse_watch_state_round_trip():
    first = CollapseWatch(window=3)
    for r in [0.6, 0.6, 0.6, 0.0]:
        first.update(r)
    second = CollapseWatch(window=3)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert second.state_dict() == first.state_dict()
    assert [second.update(0.0), second.update(0.0)] == [first.update(0.0), first.update(0.0)] == [True, True]
