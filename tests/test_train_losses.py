"""KD and SFT losses against hand computations; the vocabulary-chunked form against the reference."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from dgpo_edge.train.losses import MaskedLMLoss, chunked_head_loss, token_losses

# One token, vocabulary of 3: student and teacher logits chosen so the softmaxes are easy to write down.
S_LOGITS = [math.log(0.5), math.log(0.25), math.log(0.25)]   # p = (1/2, 1/4, 1/4)
T_LOGITS = [math.log(0.25), math.log(0.5), math.log(0.25)]   # q = (1/4, 1/2, 1/4)
P, Q = (0.5, 0.25, 0.25), (0.25, 0.5, 0.25)


def _kl(a, b):
    return sum(x * math.log(x / y) for x, y in zip(a, b))


def _hand(kind: str, beta: float = 0.5) -> float:
    if kind == "forward_kl":
        return _kl(Q, P)
    if kind == "reverse_kl":
        return _kl(P, Q)
    m = [beta * q + (1 - beta) * p for p, q in zip(P, Q)]
    return beta * _kl(Q, m) + (1 - beta) * _kl(P, m)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
@pytest.mark.parametrize("beta", [0.5, 0.1])
def test_soft_losses_match_hand_computation(kind, beta):
    got = token_losses(torch.tensor([S_LOGITS]), torch.tensor([T_LOGITS]), kind=kind, beta=beta)
    assert got.shape == (1,)
    assert float(got[0]) == pytest.approx(_hand(kind, beta), abs=1e-6)


def test_hand_values_are_what_we_think():
    # KL(q||p) = 1/4 ln(1/2) + 1/2 ln 2 = 1/4 ln 2; KL(p||q) = 1/2 ln 2 - 1/4 ln 2 = 1/4 ln 2
    assert _hand("forward_kl") == pytest.approx(0.25 * math.log(2))
    assert _hand("reverse_kl") == pytest.approx(0.25 * math.log(2))
    assert 0 < _hand("jsd") < math.log(2)


def test_cross_entropy_and_temperature():
    ce = token_losses(torch.tensor([S_LOGITS]), targets=torch.tensor([1]), kind="ce")
    assert float(ce[0]) == pytest.approx(math.log(4), abs=1e-6)
    same = token_losses(torch.tensor([S_LOGITS]), torch.tensor([S_LOGITS]), kind="forward_kl", temperature=3.0)
    assert float(same[0]) == pytest.approx(0.0, abs=1e-6)
    # T = 2 softens both; the loss is scaled by T^2 (Hinton et al.)
    s2 = torch.softmax(torch.tensor(S_LOGITS) / 2, -1).tolist()
    q2 = torch.softmax(torch.tensor(T_LOGITS) / 2, -1).tolist()
    got = token_losses(torch.tensor([S_LOGITS]), torch.tensor([T_LOGITS]), kind="forward_kl", temperature=2.0)
    assert float(got[0]) == pytest.approx(4 * _kl(q2, s2), abs=1e-6)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd", "ce"])
@pytest.mark.parametrize("chunk", [1, 4, 7, 0])
def test_chunked_equals_unchunked_in_value_and_gradient(kind, chunk):
    g = torch.Generator().manual_seed(0)
    N, D, Dt, V = 6, 5, 3, 13
    h_s = torch.randn(N, D, generator=g, dtype=torch.float64, requires_grad=True)
    w_s = torch.randn(V, D, generator=g, dtype=torch.float64, requires_grad=True)
    h_t, w_t = torch.randn(N, Dt, generator=g, dtype=torch.float64), torch.randn(V, Dt, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (N,), generator=g)
    weights = torch.rand(N, generator=g, dtype=torch.float64)
    ref = (token_losses(h_s @ w_s.T, h_t @ w_t.T, y, kind, beta=0.3, temperature=1.5) * weights).sum()
    ref_grads = torch.autograd.grad(ref, [h_s, w_s])
    out = chunked_head_loss(h_s, w_s, weights, h_t=h_t, w_t=w_t, targets=y, kind=kind, beta=0.3,
                            temperature=1.5, chunk=chunk)
    grads = torch.autograd.grad(out * 2.0, [h_s, w_s])  # a non-unit upstream gradient
    assert float(out.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    for a, b in zip(ref_grads, grads):
        torch.testing.assert_close(2.0 * a.float(), b.float(), rtol=1e-4, atol=1e-5)


def test_chunked_loss_refuses_mismatched_vocabularies_and_missing_inputs():
    h, w = torch.randn(2, 4), torch.randn(10, 4)
    with pytest.raises(ValueError, match="vocabularies differ"):
        chunked_head_loss(h, w, torch.ones(2), h_t=h, w_t=torch.randn(11, 4))
    with pytest.raises(ValueError, match="teacher"):
        chunked_head_loss(h, w, torch.ones(2), kind="jsd")
    with pytest.raises(ValueError, match="targets"):
        chunked_head_loss(h, w, torch.ones(2), kind="ce")


def _tiny_lm(vocab=50):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                        tie_word_embeddings=True))


def test_masked_loss_counts_only_masked_positions():
    pytest.importorskip("transformers")
    lm = _tiny_lm()
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    target = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.float32)
    logits = lm(input_ids=ids, attention_mask=attn).logits
    # by hand: position i predicts token i + 1; only (0,2)->6, (0,3)->7, (1,1)->11 count
    lp = torch.log_softmax(logits.float(), -1)
    want = -(lp[0, 2, 6] + lp[0, 3, 7] + lp[1, 1, 11]) / 3
    for chunk in (0, 16):
        got = MaskedLMLoss(lm, chunk)(ids, attn, target, kind="ce")
        assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    # changing a token whose position carries no loss (and is not a predicted target) changes nothing
    ids2 = ids.clone()
    ids2[0, 5] = 20
    same = MaskedLMLoss(lm, 16)(ids2, attn, target, kind="ce")
    assert float(same) == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("chunk", [0, 11])
@pytest.mark.parametrize("kind", ["ce", "forward_kl"])
def test_right_padded_batches_train_the_same_without_a_mask(chunk, kind, monkeypatch):
    """SFT and KD batches are padded on the right, so the models get no attention mask
    (train/attention.py); the losses and gradients equal those of the same batch given its mask."""
    pytest.importorskip("transformers")
    import test_rollout_support as support

    from dgpo_edge.train import attention as masks, losses

    student, teacher = support.tiny_model("llama", 97, seed=1), support.tiny_model("llama", 97, seed=2)
    ids = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(0))
    attention = torch.zeros_like(ids)
    target = torch.zeros(3, 16)
    for i, n in enumerate((16, 11, 7)):
        attention[i, :n] = 1
        target[i, 3:n - 1] = 1
    results = []
    for masked in (False, True):
        if masked:
            monkeypatch.setattr(masks, "model_mask", lambda m: m)
        student.zero_grad()
        soft = losses.teacher_targets(teacher, ids, attention, target, chunked=bool(chunk)) if kind != "ce" else None
        loss = losses.MaskedLMLoss(student, chunk_size=chunk)(ids, attention, target, kind=kind, teacher=soft)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in student.parameters()]))
    (plain, plain_grads), (with_mask, mask_grads) = results
    torch.testing.assert_close(plain, with_mask, rtol=1e-5, atol=1e-6)
    for a, b in zip(plain_grads, mask_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("chunk", [0, 16])
def test_training_passes_build_no_kv_cache(chunk):
    """Nothing decodes from a loss pass, so neither the student's nor the teacher's forward may fill a
    KV cache (transformers does by default: memory and time for nothing)."""
    pytest.importorskip("transformers")
    from dgpo_edge.train import losses

    student, teacher = _tiny_lm(), _tiny_lm()
    seen = []
    for model in (student, teacher):
        model.register_forward_hook(lambda m, args, kwargs, out: seen.append(out.past_key_values), with_kwargs=True)
        model.model.register_forward_hook(lambda m, args, kwargs, out: seen.append(out.past_key_values),
                                          with_kwargs=True)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    attn, target = torch.ones_like(ids), torch.tensor([[0, 0, 1, 1, 1, 0]], dtype=torch.float32)
    soft = losses.teacher_targets(teacher, ids, attn, target, chunked=bool(chunk))
    losses.MaskedLMLoss(student, chunk_size=chunk)(ids, attn, target, kind="forward_kl", teacher=soft)
    assert len(seen) >= 2 and all(cache is None for cache in seen)
