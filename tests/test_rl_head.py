"""The RL models' speed paths compute what the plain ones do: the LM head whose backward recomputes
its logits (`HeadLogps`) against autograd through kept logits, and right-padded batches run without
an attention mask (`model_mask`) against the same batch with its mask."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_rollout_support as support  # noqa: E402
import torch  # noqa: E402

from dgpo_edge.train.rl import math as rl_math  # noqa: E402
from dgpo_edge.train.attention import model_mask  # noqa: E402
from dgpo_edge.train.rl.models import HeadLogps, PolicyHead, ValueModel, head_logps  # noqa: E402


def plain(hidden, weight, targets, temperature):
    """The reference: full logits, autograd through log_softmax and the entropy."""
    logits = (hidden @ weight.t()).float() / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    return logp, rl_math.entropy_from_logits(logits)


def leaves(n=37, h=16, v=53, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=dtype).mul(0.5).requires_grad_(True)
    weight = torch.randn(v, h, generator=g, dtype=dtype).mul(0.5).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("rows", [1, 5, 37, 4096])
@pytest.mark.parametrize("entropy_weight", [0.0, 0.3])
def test_recomputed_head_matches_autograd(rows, entropy_weight):
    """Values and both gradients equal autograd's through kept logits (float64 leaves, the softmax in
    float32 on both paths; any chunking), for a loss that mixes the log-probs and the entropies with
    per-position weights."""
    g = torch.Generator().manual_seed(1)
    w_logp, w_ent = torch.randn(37, generator=g, dtype=torch.float64), torch.randn(37, generator=g, dtype=torch.float64)
    results = []
    for fused in (False, True):
        hidden, weight, targets = leaves()
        if fused:
            logp, ent = HeadLogps.apply(hidden, weight, targets, 0.7, rows, True, torch.float64)
        else:
            logp, ent = plain(hidden, weight, targets, 0.7)
        ((logp * w_logp).sum() + entropy_weight * (ent * w_ent).sum()).backward()
        results.append((logp.detach(), ent.detach(), hidden.grad, weight.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert float(results[1][3].abs().sum()) > 0


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_forward_gives_the_plain_chunk_formula_bit_for_bit(temperature, entropy, dtype, bench_script):
    """The forward skips the division at T = 1, divides in place otherwise, and without entropies
    subtracts the log-sum-exp at the targets only: the same float operations on the same numbers
    as log_softmax-then-gather (bench/head_logps.py keeps the first version), so the same bits (old
    log-probs, and so the PPO ratio, unchanged)."""
    hidden, weight, targets = leaves(dtype=torch.float32)
    hidden, weight = hidden.detach().to(dtype), weight.detach().to(dtype)
    with torch.no_grad():
        logp, ent = HeadLogps.apply(hidden, weight, targets, temperature, 5, entropy, dtype)
        want_logp, want_ent = bench_script("head_logps").before_forward(hidden, weight, targets, temperature, 5,
                                                                        dtype, entropy)
    assert torch.equal(logp, want_logp) and (not entropy or torch.equal(ent, want_ent))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_backward_gives_the_plain_expressions_bit_for_bit(temperature, entropy, dtype, bench_script):
    """The backward works in place (two [rows, V] tensors instead of eight): the same gradients, bit
    for bit, as the first version's expression-per-tensor backward (bench/head_logps.py keeps it)."""
    hidden, weight, targets = leaves(dtype=torch.float32)
    hidden = hidden.detach().to(dtype).requires_grad_(True)
    weight = weight.detach().to(dtype).requires_grad_(True)
    g = torch.Generator().manual_seed(2)
    g_logp, g_ent = torch.randn(37, generator=g), torch.randn(37, generator=g)
    logp, ent = HeadLogps.apply(hidden, weight, targets, temperature, 5, entropy, dtype)
    ((logp * g_logp).sum() + ((ent * g_ent).sum() if entropy else 0)).backward()
    first = bench_script("head_logps")
    with torch.no_grad():
        _, want_ent = first.before_forward(hidden, weight, targets, temperature, 5, dtype, entropy)
        want_h, want_w = first.before_backward(hidden.detach(), weight.detach(), targets, g_logp,
                                               g_ent if entropy else None, want_ent, temperature, 5, dtype)
    assert torch.equal(hidden.grad, want_h) and torch.equal(weight.grad, want_w)


def test_recomputed_head_entropy_only_no_rows_and_tied_weights():
    """A loss of the entropies alone; zero positions; a head tied to the input embeddings (both uses
    of the one weight get their gradient), each against autograd through the plain head."""
    hidden, weight, targets = leaves()
    _, ent = HeadLogps.apply(hidden, weight, targets, 1.3, 6, True, torch.float64)
    ent.sum().backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(True), weight.detach().clone().requires_grad_(True)
    plain(ref_h, ref_w, targets, 1.3)[1].sum().backward()
    torch.testing.assert_close(hidden.grad, ref_h.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, ref_w.grad, rtol=1e-5, atol=1e-5)

    empty = torch.zeros(0, 16, dtype=torch.float64, requires_grad=True)
    logp, ent = HeadLogps.apply(empty, weight, targets[:0], 1.0, 4, True, torch.float64)
    assert logp.shape == (0,) and ent.shape == (0,)
    logp.sum().backward()
    assert empty.grad.shape == (0, 16)

    grads = []
    for fused in (True, False):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(53, 16).double()
        ids = torch.randint(0, 53, (9,))
        h = emb(ids) * 2.0                                    # the weight's first use
        if fused:
            logp, _ = HeadLogps.apply(h, emb.weight, targets[:9], 1.0, 4, False, torch.float64)
        else:
            logp = plain(h, emb.weight, targets[:9], 1.0)[0]
        logp.sum().backward()
        grads.append(emb.weight.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-5)


def test_recomputed_head_without_entropy_and_frozen_weight():
    """No entropy asked: none computed; a frozen head (LoRA elsewhere) gets no gradient."""
    hidden, weight, targets = leaves()
    weight.requires_grad_(False)
    logp, ent = HeadLogps.apply(hidden, weight, targets, 1.0, 8, False, torch.float64)
    assert ent.numel() == 0
    logp.sum().backward()
    ref_h = hidden.detach().clone().requires_grad_(True)
    plain(ref_h, weight, targets, 1.0)[0].sum().backward()
    torch.testing.assert_close(hidden.grad, ref_h.grad, rtol=1e-5, atol=1e-5)
    assert weight.grad is None


def test_recomputed_head_under_bf16_autocast_matches_the_plain_head():
    """Under bf16 autocast both paths take bf16 logits to float32: same values, gradients within
    bf16 rounding, and the fused path is the one a plain Linear head takes."""
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 211, bias=False)
    hidden0 = torch.randn(50, 32)
    targets = torch.randint(0, 211, (50,))
    out = {}
    for name in ("plain", "fused"):
        hidden = hidden0.clone().requires_grad_(True)
        head.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if name == "fused":
                logp, ent = head_logps(head, hidden, targets, 0.9, entropy=True, rows=16)
            else:
                logits = head(hidden).float() / 0.9
                logp = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
                ent = rl_math.entropy_from_logits(logits)
        (logp.sum() - 0.01 * ent.sum()).backward()
        out[name] = (logp.detach(), ent.detach(), hidden.grad, head.weight.grad.clone())
    for a, b in zip(out["plain"], out["fused"]):   # bf16 rounding flips a few elements: a relative norm
        assert float((a - b).norm() / b.norm()) < 1e-2


def test_a_head_with_a_bias_takes_the_plain_path():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=True)
    hidden = torch.randn(5, 8, requires_grad=True)
    targets = torch.randint(0, 11, (5,))
    logp, ent = head_logps(head, hidden, targets, 1.0, entropy=True, rows=2)
    expect = torch.log_softmax(head(hidden), -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(logp, expect)
    assert logp.grad_fn is not None and "HeadLogps" not in type(logp.grad_fn).__name__


def test_model_mask_drops_only_right_padding():
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert model_mask(right) is None
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    hole = torch.tensor([[1, 0, 1, 0]])
    assert model_mask(left) is left and model_mask(hole) is hole


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_right_padded_batches_need_no_mask(kind):
    """The policy's log-probs, entropies and gradients and the critic's values, at every real
    position, are the same with the mask as without (what PolicyHead and ValueModel now do)."""
    lm = support.tiny_model(kind, 97, seed=3)
    ids = torch.randint(0, 97, (3, 24), generator=torch.Generator().manual_seed(0))
    lengths = [24, 17, 9]
    attention = torch.zeros_like(ids)
    mask = torch.zeros(3, 24)
    for i, n in enumerate(lengths):
        attention[i, :n] = 1
        mask[i, 5:n] = 1
    policy = PolicyHead(lm, rows=7)

    def with_mask(input_ids, attention_mask=None, **kwargs):   # the base model as it ran before: always masked
        return original(input_ids=input_ids, attention_mask=attention, **kwargs)

    logp, ent = policy(ids, attention, mask, 0.8, True)
    (logp.sum() + ent.sum()).backward()
    grads = [p.grad.clone() for p in lm.parameters()]
    lm.zero_grad()
    original = lm.base_model.forward
    lm.base_model.forward = with_mask
    try:
        logp_m, ent_m = policy(ids, attention, mask, 0.8, True)
        (logp_m.sum() + ent_m.sum()).backward()
    finally:
        lm.base_model.forward = original
    torch.testing.assert_close(logp, logp_m, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent_m, rtol=1e-5, atol=1e-5)
    for a, p in zip(grads, lm.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-5)

    critic = ValueModel(lm.base_model, 64)
    torch.nn.init.normal_(critic.head.weight)
    values = critic(ids, attention)
    masked = critic.head(lm.base_model(input_ids=ids, attention_mask=attention).last_hidden_state).squeeze(-1)
    expect = torch.nn.functional.pad(masked[:, :-1], (1, 0))
    real = torch.nn.functional.pad(attention, (1, 0))[:, :-1].bool() | attention.bool()   # incl. the terminal slot
    torch.testing.assert_close(values[real], expect[real], rtol=1e-5, atol=1e-5)


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (bf16 autocast, fused attention kernels)")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU)])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_speed_paths_match_the_plain_passes(kind, device, monkeypatch):
    """As `train dgpo` runs: the unmasked forward (on a GPU, PyTorch's fused causal kernel, under bf16
    autocast) with the recomputing head against the masked forward with kept logits; log-probs,
    entropies and gradients agree (within bf16 rounding on the GPU). On the CPU in fp32 the same switches
    run, so a renamed switch point fails here too, not only on a GPU."""
    from dgpo_edge.train import attention as masks
    from dgpo_edge.train.rl import models

    lm = support.tiny_model(kind, 97, seed=3).to(device).train()
    ids = torch.randint(0, 97, (3, 64), generator=torch.Generator().manual_seed(0)).to(device)
    attention = torch.zeros_like(ids)
    mask = torch.zeros(3, 64, device=device)
    for i, n in enumerate((64, 50, 37)):
        attention[i, :n] = 1
        mask[i, 9:n] = 1
    out, switched = [], []
    for plain_paths in (False, True):
        if plain_paths:
            monkeypatch.setattr(masks, "model_mask", lambda m: switched.append("mask") or m)
            monkeypatch.setattr(models, "head_logps", lambda *a, **k: switched.append("head")
                                or models.kept_logits_logps(*a, **k))
        lm.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logp, ent = models.PolicyHead(lm, rows=16)(ids, attention, mask, 0.9, True)
        (logp.sum() - 0.01 * ent.sum()).backward()
        out.append((logp.detach(), ent.detach(), [p.grad.clone() for p in lm.parameters()]))
    (logp, ent, grads), (logp_p, ent_p, grads_p) = out
    assert {"mask", "head"} <= set(switched)   # the policy's passes read both switch points
    real = mask.bool()
    tol = 2e-2 if device == "cuda" else 1e-4
    torch.testing.assert_close(logp[real], logp_p[real], rtol=tol, atol=tol)
    torch.testing.assert_close(ent[real], ent_p[real], rtol=tol, atol=tol)
    for a, b in zip(grads, grads_p):
        assert float((a - b).norm() / b.norm().clamp(min=1e-12)) < (3e-2 if device == "cuda" else 1e-4)


def test_check_no_dropout_finds_dropout_modules_and_the_attention_rate():
    from dgpo_edge.errors import InputError
    from dgpo_edge.train.rl.models import check_no_dropout

    from dgpo_edge.train.rl.models import make_critic

    lm = support.tiny_model("qwen2", 97, seed=3)
    check_no_dropout(lm, "model")                        # the supported models drop nothing by default
    check_no_dropout(make_critic(support.tiny_model("qwen2", 97, seed=3)), "critic")   # a module without a config
    lm.model.layers[0].mlp.extra = torch.nn.Dropout(0.0)
    check_no_dropout(lm, "model")                        # p = 0 is no dropout
    lm.model.layers[0].mlp.extra = torch.nn.Dropout(0.2)
    with pytest.raises(InputError, match=r"model.layers.0.mlp.extra = 0.2"):
        check_no_dropout(lm, "model")
    lm.model.layers[0].mlp.extra = torch.nn.Dropout2d(0.3)   # any of torch's dropout modules
    with pytest.raises(InputError, match=r"model.layers.0.mlp.extra = 0.3"):
        check_no_dropout(lm, "model")
    body = support.tiny_model("qwen2", 97, seed=3)           # a critic from a model that drops attention
    body.config.attention_dropout = 0.1
    with pytest.raises(InputError, match=r"config.attention_dropout = 0.1"):
        check_no_dropout(make_critic(body), "critic")
