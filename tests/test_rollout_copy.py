"""The rollout copy (train/rollout_copy.py): the actor's weights in bf16, LoRA merged, refreshed in place."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import test_rollout_support as support  # noqa: E402
import torch  # noqa: E402
from dgpo_edge import protocol  # noqa: E402
from dgpo_edge.train.config import LoRASection  # noqa: E402
from dgpo_edge.train.decoding import PlainDecoder, RolloutSampling  # noqa: E402
from dgpo_edge.train.fast_decode import FastDecoder  # noqa: E402
from dgpo_edge.train.lora import apply_lora, merged_state_dict  # noqa: E402
from dgpo_edge.train.rollout_copy import RolloutCopy  # noqa: E402
from test_rollout_support import tiny_model  # noqa: E402

VOCAB = 300


def _train_step(model) -> None:
    """One real optimizer step on a next-token loss, so the actor's weights move."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


def _expected(model) -> dict:
    state = merged_state_dict(model) if any("lora_" in n for n, _ in model.named_parameters()) else model.state_dict()
    return {k: v.detach().to(torch.bfloat16) for k, v in state.items()}


@pytest.mark.parametrize("lora", [False, True])
def test_copy_equals_the_training_weights_after_each_sync(lora):
    actor = tiny_model("llama", VOCAB, seed=1)
    if lora:
        # B starts at zero in peft; a step makes the merged delta non-zero.
        actor = apply_lora(actor, LoRASection(r=4, train_norms=True))
    actor.train()
    copy = RolloutCopy(actor)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in copy.model.parameters())
    assert not any("lora_" in n for n, _ in copy.model.named_parameters())  # a plain model
    pointers = {n: p.data_ptr() for n, p in copy.model.named_parameters()}

    _train_step(actor)
    want = _expected(actor)
    got = copy.model.state_dict()
    assert any(not torch.equal(got[k], want[k]) for k in want)  # stale until synced
    copy.sync(actor)
    got = copy.model.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    # Refreshed in place: a captured CUDA graph reading these tensors sees the new weights.
    assert pointers == {n: p.data_ptr() for n, p in copy.model.named_parameters()}


def test_copy_keeps_the_rotary_frequencies_in_fp32_and_its_logits_close_to_the_actor():
    actor = tiny_model("qwen2", VOCAB, seed=2)
    copy = RolloutCopy(actor)
    buffers = [b for n, b in copy.model.named_buffers() if "inv_freq" in n]
    assert buffers and all(b.dtype == torch.float32 for b in buffers)
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = torch.log_softmax(actor(input_ids=ids).logits.float(), -1)
        b = torch.log_softmax(copy.model(input_ids=ids).logits.float(), -1)
    assert (a - b).abs().max() < 0.05   # bf16 rounding, not another model


@pytest.fixture(scope="module")
def smol_tok(request, tmp_path_factory):
    return support.smol_tok_fixture(request, tmp_path_factory)


def test_fast_engine_on_the_copy_follows_each_sync(smol_tok):
    # The engine is built once over the copy; after the actor trains and the copy syncs, the
    # engine decodes what a fresh plain decoder over the copy decodes.
    actor = tiny_model("llama", len(smol_tok), seed=4)
    copy = RolloutCopy(actor, dtype=torch.float32)   # fp32 on CPU: an exact comparison
    tok = smol_tok
    engine = FastDecoder(copy.model, tok, protocol.STOP_STRINGS, (), check_every=4, length_bucket=16)
    prefixes = [[5, 6, 7], [8, 9]]
    before = engine.decode(prefixes, [10, 10], RolloutSampling(greedy=True), None)
    _train_step(actor.train())
    copy.sync(actor.eval())
    after = engine.decode(prefixes, [10, 10], RolloutSampling(greedy=True), None)
    want = PlainDecoder(copy.model, tok, protocol.STOP_STRINGS, ()).decode(prefixes, [10, 10],
                                                                            RolloutSampling(greedy=True), None)
    assert [o.ids for o in after] == [o.ids for o in want]
    assert [o.ids for o in before] != [o.ids for o in after]


def test_sync_refuses_an_actor_of_another_shape():
    copy = RolloutCopy(tiny_model("llama", VOCAB, seed=1))
    with pytest.raises(ValueError, match="no weights for"):
        copy.sync(tiny_model("llama", VOCAB, seed=1, layers=1))
