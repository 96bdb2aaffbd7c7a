"""The shared decoding loop (base.Engine) and the transformers / onnxruntime-genai engines.

The loop is checked on byte-level fakes (stop strings, a token that runs past
the stop string, EOS, budgets, streaming, sampling seeds, cache reuse). KV
reuse is checked on a tiny random transformers model with the real Qwen2
tokenizer: a continuation after reuse equals a fresh run token for token.
llama.cpp with the real SmolLM2 GGUF is in test_engines_llama.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dgpo_edge import protocol
from dgpo_edge.engines import Sampling, model_kind, open_engine
from dgpo_edge.engines.base import Engine
from dgpo_edge.errors import InputError

# --- a byte engine whose script may contain multi-byte "tokens" ---------------------------------------

MERGED = {300: ">\n\n", 301: "é"}   # 300 runs past a stop string like Qwen2's ">\n\n"; 301 is 2 bytes
EOS = 299


class FakeEngine(Engine):
    """Vocabulary: bytes 0..255, EOS 299, multi-byte tokens in MERGED. Plays `script` (ids), then EOS."""

    name = "fake"

    def __init__(self, script=(), n_ctx=4096):
        super().__init__()
        self.n_ctx = n_ctx
        self.eos_ids = frozenset({EOS})
        self.script = list(script)
        self.evaluated: list[list[int]] = []
        self.truncated: list[int] = []
        self.pos = 0

    def play(self, script):
        self.script, self.pos = list(script), 0

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids):
        out = b"".join(MERGED[i].encode() if i in MERGED else bytes([i]) for i in ids if i != EOS)
        return out.decode("utf-8", errors="replace")

    def _truncate(self, keep):
        self.truncated.append(keep)

    def _evaluate(self, ids):
        self.evaluated.append(list(ids))

    def _logits(self):
        x = np.zeros(302, dtype=np.float32)
        x[self.script[self.pos] if self.pos < len(self.script) else EOS] = 1
        return x

    def _pick(self, logits, sampling):
        tok = super()._pick(logits, sampling)
        self.pos += 1
        return tok


def ids_of(text: str) -> list[int]:
    return list(text.encode())


def test_stop_string_cuts_a_merged_token_and_the_ids_decode_to_the_text():
    e = FakeEngine(ids_of("<search> Peru </search") + [300] + ids_of("junk"))
    prompt = ids_of("Q:")
    g = e.generate(prompt, 100)
    deltas = list(g)
    r = g.result
    assert r.finish == "stop" and r.stop == "</search>"
    assert r.text == "<search> Peru </search>" == "".join(deltas)
    assert r.token_ids == ids_of("<search> Peru </search>")        # 300 replaced by the encoded ">"
    assert e.decode(r.token_ids) == r.text
    assert r.new_tokens == len(ids_of("<search> Peru </search")) + 1
    # the next call shares the prefix up to the replaced token only: it re-evaluates from there
    info = ids_of("\n\n<information>x</information>\n\n")
    e.play(ids_of("<answer>x</answer>"))
    r2 = e.generate(prompt + r.token_ids + info, 100).result
    assert r2.cached_tokens == len(prompt) + len(r.token_ids) - 1
    assert r2.prompt_tokens == 1 + len(info)
    assert e.evaluated[-len(ids_of("<answer>x</answer>"))] == [ids_of(">")[0]] + info


def test_prompt_reuse_evaluates_only_the_new_suffix():
    e = FakeEngine(ids_of("abc</answer>"))
    p = ids_of("hello world")
    r = e.generate(p, 50).result
    assert (r.prompt_tokens, r.cached_tokens) == (len(p), 0)
    assert e.cached_ids == p + ids_of("abc</answer")   # the stop-completing token is never evaluated
    e.play(ids_of("</answer>"))
    more = p + r.token_ids + ids_of(" next")
    r2 = e.generate(more, 50).result
    assert r2.cached_tokens == len(p) + len(r.token_ids) - 1
    assert r2.prompt_tokens == len(more) - r2.cached_tokens
    # the same prompt again: nothing new to evaluate but the last id (its logits are needed)
    e.play(ids_of("</answer>"))
    r3 = e.generate(more, 50).result
    assert r3.prompt_tokens == 1
    # a different prompt: truncated to the common prefix
    e.play(ids_of("</answer>"))
    r4 = e.generate(ids_of("help"), 50).result
    assert r4.cached_tokens == 3 and e.truncated[-1] == 3


def test_eos_is_dropped_and_ends_the_turn():
    e = FakeEngine(ids_of("no action") + [EOS] + ids_of("more"))
    r = e.generate([1], 50).result
    assert r.finish == "eos" and r.text == "no action" and EOS not in r.token_ids


def test_length_budget_and_context_limit():
    e = FakeEngine(ids_of("x" * 100))
    r = e.generate([1], 7).result
    assert r.finish == "length" and r.new_tokens == 7 and r.text == "x" * 7
    e = FakeEngine(ids_of("x" * 100), n_ctx=10)
    e.play(ids_of("x" * 100))
    r = e.generate([1, 2, 3], 50).result
    assert r.finish == "length" and len(r.token_ids) == 7          # 3 + 7 = n_ctx
    with pytest.raises(ValueError):
        e.generate(list(range(11)), 5)
    with pytest.raises(ValueError):
        e.generate([], 5)


def test_multibyte_characters_are_streamed_whole():
    e = FakeEngine(ids_of("caf") + list("é".encode()) + [301] + ids_of("</answer>"))
    g = e.generate([1], 50)
    deltas = list(g)
    assert "".join(deltas) == "caféé</answer>" and all("\ufffd" not in d for d in deltas)


def test_close_stops_early_and_keeps_what_was_generated():
    e = FakeEngine(ids_of("a" * 50))
    g = e.generate([1], 100)
    got = [next(g) for _ in range(5)]
    g.close()
    r = g.result
    assert r.finish == "stopped" and r.text.startswith("".join(got)) and 5 <= len(r.token_ids) < 50
    g = FakeEngine(ids_of("abc")).generate([1], 10)
    g.close()
    assert g.result.finish == "stopped" and g.result.token_ids == []


def test_earliest_stop_string_wins_and_custom_stops():
    e = FakeEngine(ids_of("<answer>a</answer><search>b</search>"))
    assert e.generate([1], 100).result.stop == "</answer>"
    e.play(ids_of("one. two."))
    r = e.generate([1], 100, stop=(".",)).result
    assert r.text == "one." and r.stop == "."


class LogitEngine(FakeEngine):
    """Fixed logits: a softmax over 5 tokens, for the sampler."""

    def _logits(self):
        x = np.full(302, -1e9, dtype=np.float32)
        x[[97, 98, 99, 100, 101]] = [2.0, 1.5, 1.0, 0.5, 0.0]
        return x


def test_greedy_and_seeded_sampling():
    e = LogitEngine()
    assert e.generate([1], 10).result.text == "a" * 10
    s = Sampling(temperature=1.0, seed=7)
    a = e.generate([1], 30, s).result.text
    b = LogitEngine().generate([1], 30, s).result.text
    assert a == b and len(set(a)) > 1
    assert set(e.generate([1], 40, Sampling(temperature=1.0, top_k_tokens=2, seed=1)).result.text) <= {"a", "b"}
    assert set(e.generate([1], 40, Sampling(temperature=1.0, top_p=0.4, seed=1)).result.text) <= {"a", "b"}
    with pytest.raises(ValueError):
        Sampling(temperature=-1)
    with pytest.raises(ValueError):
        Sampling(top_p=0)
    with pytest.raises(ValueError, match="top_k_tokens"):
        Sampling(top_k_tokens=-1)


def test_model_kind(tmp_path: Path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + b"\0" * 8)
    assert model_kind(tmp_path / "m.gguf") == "gguf"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"nope")
    with pytest.raises(InputError, match="not a GGUF"):
        model_kind(bad)
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "genai_config.json").write_text("{}")
    assert model_kind(tmp_path / "onnx") == "onnx"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert model_kind(tmp_path / "hf") == "transformers"
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a model folder"):
        model_kind(tmp_path / "empty")
    with pytest.raises(InputError, match="no such model"):
        model_kind(tmp_path / "missing")


# --- transformers: a tiny random model with the real Qwen2 tokenizer --------------------------------------

@pytest.fixture(scope="module")
def tiny_qwen(qwen_dir: Path, tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=4096, tie_word_embeddings=True,
                                   initializer_range=0.2,
                                   eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    model = transformers.Qwen2ForCausalLM(cfg)
    d = tmp_path_factory.mktemp("tiny-qwen")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _episode(engine, turns=3, n=24):
    """Generate `turns` greedy turns, appending a forced block after each; the per-turn results."""
    ids = engine.encode(engine.render_prompt("What is the capital of Peru?"))
    out = []
    for t in range(turns):
        r = engine.generate(ids, n).result
        out.append((list(ids), r))
        ids = ids + r.token_ids + engine.encode(protocol.information_block(
            [protocol.Passage(str(t), f'"Peru {t}"\nLima is the capital of Peru. Fact {t}.')]))
    return out


@pytest.fixture(scope="module")
def hf_engine(tiny_qwen: Path):
    return open_engine(tiny_qwen, n_ctx=2048, threads=1)


def _fresh(engine, ids, n=24):
    """A run with an empty cache: every id evaluated."""
    engine.reset()
    r = engine.generate(ids, n).result
    assert r.prompt_tokens == len(ids) and r.cached_tokens == 0
    return r


def test_transformers_kv_reuse_equals_a_fresh_run(hf_engine, tiny_qwen: Path):
    engine = open_engine(tiny_qwen, n_ctx=2048, threads=1)
    assert engine.name == "transformers" and engine.chat_template is not None
    runs = _episode(engine)
    for i, (ids, r) in enumerate(runs):
        if i:   # turn t+1 evaluated only what was appended after turn t
            prev_ids, prev = runs[i - 1]
            assert r.prompt_tokens == len(ids) - len(prev_ids) - len(prev.token_ids) + 1
        assert _fresh(hf_engine, ids).token_ids == r.token_ids, f"turn {i} differs after KV reuse"
    assert len({t for _, r in runs for t in r.token_ids}) > 3   # not a degenerate repeat


def test_transformers_cache_truncated_to_a_shared_prefix_equals_a_fresh_run(hf_engine, tiny_qwen: Path):
    # A second question shares the chat-template prefix with the first and then differs: the
    # cache is cut back to that prefix (a positive-length crop, refused by transformers 5.24).
    engine = open_engine(tiny_qwen, n_ctx=2048, threads=1)
    first = engine.encode(engine.render_prompt("What is the capital of Peru?"))
    second = engine.encode(engine.render_prompt("Who wrote the anthem of Chile?"))
    engine.generate(first, 16).result
    r = engine.generate(second, 16).result
    shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
    assert 0 < r.cached_tokens == shared
    assert engine.cached_ids[:len(second)] == second
    assert _fresh(hf_engine, second, 16).token_ids == r.token_ids


def test_transformers_prompt_matches_the_tokenizer(hf_engine, qwen_dir: Path):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(qwen_dir))
    engine = hf_engine
    want = tok.apply_chat_template([{"role": "user", "content": protocol.user_message("q")}], tokenize=False,
                                   add_generation_prompt=True)
    assert engine.render_prompt("q") == want
    assert engine.encode(want) == tok.encode(want, add_special_tokens=False)
    assert engine.eos_ids >= {tok.convert_tokens_to_ids("<|im_end|>")}


def test_transformers_bad_folder(tmp_path: Path):
    pytest.importorskip("torch")
    from dgpo_edge.engines.transformers_engine import TransformersEngine

    with pytest.raises(InputError, match="config.json"):
        TransformersEngine(tmp_path)


# --- onnxruntime-genai: the same tiny model through its model builder ----------------------------------------

@pytest.fixture(scope="module")
def tiny_onnx(tiny_qwen: Path, tmp_path_factory) -> Path:
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("onnx_ir")
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("tiny-onnx")
    proc = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", "tiny",
                           "-i", str(tiny_qwen), "-o", str(out), "-p", "fp32", "-e", "cpu"],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not (out / "genai_config.json").is_file():
        pytest.skip(f"onnxruntime-genai's builder failed here: {proc.stderr[-500:]}")
    return out


@pytest.mark.slow
def test_onnx_genai_matches_transformers_and_reuses_its_cache(tiny_onnx: Path, hf_engine):
    onnx = open_engine(tiny_onnx, n_ctx=2048, threads=1)
    assert onnx.name == "onnxruntime-genai" and model_kind(tiny_onnx) == "onnx"
    assert onnx.render_prompt("q") == hf_engine.render_prompt("q")
    fresh = open_engine(tiny_onnx, n_ctx=2048, threads=1)
    runs = _episode(onnx)
    for i, (ids, r) in enumerate(runs):
        assert _fresh(fresh, ids).token_ids == r.token_ids, f"turn {i} differs after KV reuse"
        if i:
            assert r.prompt_tokens < len(ids) // 2
        assert _fresh(hf_engine, ids).token_ids == r.token_ids   # same greedy rule, fp32 both


@pytest.mark.slow
def test_onnx_genai_encode_text_reads_special_tokens_as_text(tiny_onnx: Path, hf_engine):
    onnx = open_engine(tiny_onnx, n_ctx=256, threads=1)
    added = set(onnx.added_tokens())
    assert {"<|im_start|>", "<|endoftext|>", "<tool_call>", "<|file_sep|>"} <= added
    ids = {onnx.encode(t)[0] for t in added}   # each token's own id, as the prompt encoder reads it
    text = 'Doc 1(Title: "x") ' + " and ".join(sorted(added))
    assert set(onnx.encode(text)) & ids and not set(onnx.encode_text(text)) & ids
    assert onnx.decode(onnx.encode_text(text)) == text
    assert onnx.encode_text(text) == hf_engine.encode_text(text)   # the same ids as the transformers engine
