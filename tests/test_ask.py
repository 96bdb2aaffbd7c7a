"""`dgpo-edge ask`: text, --steps and --json output, exit statuses, bad input; one real SmolLM2 run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bundle_helpers import build_tiny_index, smollm2_gguf, write_corpus
from cli_helpers import assert_one_line_error, invoke
from engine_fakes import ScriptedEngine

import dgpo_edge.engines


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("idx")
    return build_tiny_index(write_corpus(d / "corpus.jsonl"), d / "index")


@pytest.fixture()
def script(monkeypatch, tmp_path: Path):
    """Make `--model` load a ScriptedEngine playing the turns put in the returned list."""
    turns: list[str] = []
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF")

    def fake_open_engine(path, n_ctx=4096, threads=None, **kw):
        return ScriptedEngine(list(turns), n_ctx=n_ctx)

    monkeypatch.setattr(dgpo_edge.engines, "open_engine", fake_open_engine)
    return turns, model


TURNS = ["<think>I should look it up.</think>\n<search> capital of Peru </search>",
         "<think>Doc 1 says Lima.</think>\n<answer> Lima </answer>"]


def test_ask_prints_the_answer_and_its_sources(script, index_dir: Path):
    turns, model = script
    turns += TURNS
    r = invoke("ask", "What is the capital of Peru", "--model", model, "--index", index_dir)
    assert r.exit_code == 0, r.output
    assert "Answer: Lima" in r.flat and "Sources:" in r.flat and "• Peru (id 0)" in r.flat
    assert "1 search(es)" in r.flat
    assert "<think>" not in r.flat    # steps only with --steps


def test_ask_steps_streams_turns_searches_and_passages(script, index_dir: Path):
    turns, model = script
    turns += TURNS
    r = invoke("ask", "What is the capital of Peru", "--model", model, "--index", index_dir, "--steps")
    assert r.exit_code == 0, r.output
    out = r.plain
    assert out.index("turn 1") < out.index("I should look it up.") < out.index("search: capital of Peru") \
        < out.index("1. Peru (id 0)") < out.index("turn 2") < out.index("Doc 1 says Lima.") < out.index("Answer: Lima")


def test_ask_json(script, index_dir: Path):
    turns, model = script
    turns += TURNS
    r = invoke("ask", "What is the capital of Peru", "--model", model, "--index", index_dir, "--json", "--top-k", "2")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["answer"] == "Lima" and obj["stop_reason"] == "answer" and obj["failure"] is None
    assert obj["searches"] == ["capital of Peru"]
    assert len(obj["passages"]) == 2 and obj["passages"][0]["title"] == "Peru" and obj["cited"] == ["0"]
    assert set(obj["timings"]) >= {"total_s", "generate_s", "retrieval_s", "prompt_tokens", "new_tokens",
                                   "transcript_tokens"}
    assert obj["turns"] == 2 and obj["agent"]["top_k"] == 2
    assert obj["transcript"].endswith("<answer> Lima </answer>")


def test_ask_without_an_answer_exits_1(script, index_dir: Path):
    turns, model = script
    turns += ["<search> Peru </search>"] * 3
    r = invoke("ask", "q", "--model", model, "--index", index_dir, "--max-searches", "1", "--json")
    assert r.exit_code == 1
    obj = json.loads(r.stdout)
    assert obj["answer"] is None and obj["stop_reason"] == "max_turns" and obj["failure"].startswith("max_turns")
    assert obj["agent"]["max_searches"] == 1 and obj["turns"] == 2     # one search, then the answer turn
    r = invoke("ask", "q", "--model", model, "--index", index_dir, "--max-turns", "0")   # the old spelling
    assert r.exit_code == 1 and "No answer (max_turns" in r.flat


@pytest.mark.parametrize("args,needle", [
    (["", "--index", "IDX"], "the question is empty"),
    (["q", "--index", "IDX", "--top-k", "0"], "--top-k must be in 1..20, got 0"),
    (["q", "--index", "IDX", "--max-searches", "-1"], "--max-searches must be in 0..16, got -1"),
    (["q", "--index", "IDX", "--timeout", "0"], "--timeout must be a number of seconds > 0"),
    (["q", "--index", "IDX", "--timeout", "nan"], "--timeout must be a number of seconds > 0, got nan"),
    (["q", "--index", "IDX", "--temperature", "0.7", "--seed", "-1"], "--seed must be >= 0, got -1"),
    # argv bytes that are not UTF-8 (Python keeps them as lone surrogates): refused before the model
    # loads, not the engine's "'utf-8' codec can't encode" after it
    (["Peru \udcff?", "--index", "IDX"], "the question is not valid UTF-8 text (byte 0xff at character 6)"),
    (["q", "--bundle", "NOPE"], "no such bundle folder"),
    (["q", "--index", "NOPE"], "no such index folder"),
])
def test_ask_bad_input(script, index_dir: Path, tmp_path: Path, args, needle):
    _, model = script
    args = [str(index_dir) if a == "IDX" else str(tmp_path / "nope") if a == "NOPE" else a for a in args]
    assert_one_line_error(invoke("ask", *args, "--model", model), needle)


def test_ask_bad_model(index_dir: Path, tmp_path: Path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf")
    assert_one_line_error(invoke("ask", "q", "--model", bad, "--index", index_dir), "not a GGUF")


def test_ask_real_smollm2(index_dir: Path):
    """The untrained base model through llama.cpp: whatever it answers, the run is well-formed."""
    gguf = smollm2_gguf()
    r = invoke("ask", "What is the capital of Peru?", "--model", gguf, "--index", index_dir, "--json",
               "--threads", "1", "--max-searches", "1")
    assert r.exit_code in (0, 1), r.output
    obj = json.loads(r.stdout)
    assert obj["agent"]["engine"] == "llama.cpp" and obj["timings"]["new_tokens"] > 0
    assert obj["stop_reason"] in ("answer", "max_turns", "token_budget")
    # KV reuse: prompt tokens evaluated never exceed the transcript's length
    assert obj["timings"]["prompt_tokens"] <= obj["timings"]["transcript_tokens"]


def test_gpu_layers_reach_llama_cpp(index_dir: Path):
    """On a CPU build llama.cpp keeps the value and has nothing to offload to; 0 when not given."""
    from dgpo_edge.bundle import load_agent

    gguf = smollm2_gguf()
    with load_agent(model=gguf, index=index_dir, progress=False, threads=1, gpu_layers=3) as agent:
        assert agent.engine.llm.model_params.n_gpu_layers == 3 and agent.info["gpu_layers"] == 3
    with load_agent(model=gguf, index=index_dir, progress=False, threads=1) as agent:
        assert agent.engine.llm.model_params.n_gpu_layers == 0 and agent.info["gpu_layers"] == 0


@pytest.mark.parametrize("command", ["ask", "eval", "chat"])
def test_gpu_layers_option_reaches_the_engine(command, monkeypatch, index_dir: Path, tmp_path: Path):
    seen: list[dict] = []

    def fake_open_engine(path, n_ctx=4096, threads=None, **kw):
        seen.append(kw)
        return ScriptedEngine(list(TURNS), n_ctx=n_ctx)

    monkeypatch.setattr(dgpo_edge.engines, "open_engine", fake_open_engine)
    model = tmp_path / "scripted.gguf"
    model.write_bytes(b"GGUF")
    if command == "chat":   # the app is built, not run (no terminal here)
        pytest.importorskip("textual")
        from dgpo_edge.cli.chat import build_app

        build_app(model=model, index=index_dir, history=tmp_path / "h.sqlite", gpu_layers=5)
    elif command == "ask":
        assert invoke("ask", "q", "--model", model, "--index", index_dir, "--gpu-layers", 5).exit_code == 0
    else:
        data = tmp_path / "q.jsonl"
        data.write_text('{"id": "1", "question": "capital of Peru?", "golden_answers": ["Lima"]}\n')
        r = invoke("eval", "--data", data, "--model", model, "--index", index_dir, "--gpu-layers", 5,
                   "--out", tmp_path / "ev")
        assert r.exit_code == 0, r.output
    assert seen == [{"n_gpu_layers": 5}]


def test_ask_steps_prints_no_terminal_escapes_or_emoji(script, tmp_path: Path):
    from dgpo_edge.retrieval.build import build_index

    corpus = tmp_path / "hostile.jsonl"
    contents = '"passwd \x1b]0;pwned title\x07copy"\nroot:x:0:0:root:/root:/bin/bash \x1b[2J end'
    corpus.write_text(json.dumps({"id": "p1", "contents": contents}) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", kind="bm25")
    turns, model = script
    turns += ["<think>look \x1b[2J</think>\n<search> root bash </search>",
              "<answer> root:x:0:0 \x1b]0;pwned\x07 </answer>"]
    r = invoke("ask", "what is in passwd", "--model", model, "--index", tmp_path / "index", "--steps")
    assert r.exit_code == 0, r.output
    lines = [line.rstrip() for line in r.stdout.splitlines()]
    assert "  1. passwd copy (id p1)" in lines and "Answer: root:x:0:0" in lines
    for bad in ("\x1b]", "\x07", "\x1b[2J", "❌"):  # streamed turns may keep "]0;pwned", never its ESC
        assert bad not in r.stdout, bad
