"""train/compiled_layers.py: compiled decoder layers compute what the eager ones do, and calls with a
KV cache (decoding) stay eager, so they cannot push a layer past torch._dynamo's recompile limit."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dgpo_edge.train.compiled_layers import compile_decoder_layers, decoder_layers  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch):
    """No graphs from other tests (they would be reused, not counted), and the recompile limit that
    compile_decoder_layers raises put back afterwards."""
    import torch._dynamo

    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", torch._dynamo.config.recompile_limit)
    yield
    torch._dynamo.reset()


def tiny_qwen2(layers: int = 2):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.Qwen2ForCausalLM(config).eval()


def graphs() -> int:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def test_decoder_layers_are_found_under_any_wrapping():
    model = tiny_qwen2(3)
    assert len(decoder_layers(model)) == 3
    assert len(decoder_layers(torch.nn.ModuleList([model]))) == 3
    assert decoder_layers(None) == []


def test_compiled_layers_give_the_eager_logits_and_gradients():
    eager, compiled = tiny_qwen2(), tiny_qwen2()
    assert compile_decoder_layers(compiled) == 2
    assert compile_decoder_layers(compiled) == 2          # a second call does not wrap twice
    ids = torch.randint(0, 64, (2, 11))
    start = graphs()
    for model in (eager, compiled):
        model.train()
        model(ids, use_cache=False).logits.float().pow(2).mean().backward()   # as RL's passes call it
    before = graphs()
    assert before > start                                 # the compiled path did run
    for width in (7, 13):                                 # other lengths: dynamic shapes, no new graph
        compiled(torch.randint(0, 64, (3, width)), use_cache=False)
    assert graphs() == before
    got, want = compiled(ids, use_cache=False).logits, eager(ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)


def test_calls_with_a_kv_cache_run_eagerly():
    model = tiny_qwen2()
    compile_decoder_layers(model)
    ids = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        before = graphs()
        out = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0)
        assert graphs() == before                         # decoding compiled nothing
        want = tiny_qwen2().generate(ids, max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0)
    assert torch.equal(out, want)
