"""`dgpo-edge serve`: the official `openai` client against a live server on 127.0.0.1.

The model is the real SmolLM2-135M GGUF through llama.cpp (two engines, so two
requests run at once), the index a real BM25 index of the tiny corpus. The base
SmolLM2 does not search, so the searches and sources in the `dgpo_edge` field are
checked with the byte-level scripted engine, which runs the real generate loop.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from bundle_helpers import build_tiny_index, smollm2_gguf, write_corpus
from engine_fakes import ListRetriever, ScriptedEngine

from dgpo_edge.agent import Agent
from dgpo_edge.protocol import ProtocolConfig

openai = pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from dgpo_edge.agent.http_app import ServeLimits, listen, make_app, make_server  # noqa: E402
from dgpo_edge.agent.pool import AgentPool, Busy  # noqa: E402
from dgpo_edge.bundle import load_pool  # noqa: E402

QUICK = ProtocolConfig(top_k=2, max_searches=1, max_turn_tokens=48)  # short turns: the base model rambles


class LiveServer:
    """uvicorn in a thread on a socket bound by the test (port 0: a free one)."""

    def __init__(self, pool: AgentPool, **app_kwargs):
        self.sock = listen("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = make_server(make_app(pool, **app_kwargs), "127.0.0.1", self.port)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self):
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def raw(self, method, path, body=b"", headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def stop(self):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    return build_tiny_index(write_corpus(d / "corpus.jsonl"), d / "idx", kind="bm25")


@pytest.fixture(scope="module")
def live(index):
    pool = load_pool(2, 1, model=smollm2_gguf(), index=index, threads=1, progress=False, timeout_s=120)
    for agent in pool.agents:
        agent.config = QUICK
    server = LiveServer(pool, model_name="tiny-agent")
    yield server, pool
    server.stop()
    pool.close()


def test_models_lists_the_served_model(live):
    server, _ = live
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny-agent"] and models.data[0].owned_by == "dgpo-edge"


def test_chat_completion_with_the_official_client(live):
    server, _ = live
    r = server.client().chat.completions.create(
        model="tiny-agent", messages=[{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "What is the capital of Peru?"}])
    assert r.object == "chat.completion" and r.model == "tiny-agent" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    extra = r.model_extra["dgpo_edge"]
    assert extra["stop_reason"] in ("answer", "max_turns", "token_budget")
    assert (choice.finish_reason == "stop") == (extra["stop_reason"] == "answer")
    assert extra["timings"]["new_tokens"] == r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_sends_reasoning_then_the_final_chunk_and_done(live):
    server, _ = live
    stream = server.client().chat.completions.create(
        model="tiny-agent", messages=[{"role": "user", "content": "What is the capital of Kenya?"}],
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                        for c in chunks if c.choices)
    assert reasoning.strip()  # the model's own text, as it was generated
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and "dgpo_edge" in finals[0].model_extra
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    status, headers, body = server.raw("POST", "/v1/chat/completions", json.dumps(
        {"model": "x", "stream": True, "messages": [{"role": "user", "content": "capital of Japan"}]}).encode(),
        {"Content-Type": "application/json"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert body.decode().rstrip().endswith("data: [DONE]")


def test_two_concurrent_requests_get_their_own_engines(live):
    server, pool = live
    questions = ["What is the capital of Norway?", "What is the capital of Egypt?"]

    def ask(q):
        chunks = server.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": q}], stream=True)
        return "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)

    def fresh_caches():  # so both runs evaluate the same prompts from scratch (same floating point)
        for agent in pool.agents:
            agent.engine.reset()

    fresh_caches()
    busy, done = [], threading.Event()

    def watch():  # /health answers while both engines work: the event loop is never blocked
        while not done.is_set():
            busy.append(json.loads(server.raw("GET", "/health")[2])["busy"])
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(2) as ex:
        together = list(ex.map(ask, questions))
    done.set()
    watcher.join()
    assert max(busy) == 2  # both questions ran at the same time, one per engine
    # each run's text is what the question gets alone: no KV cache was shared between them
    for q, text in zip(questions, together):
        fresh_caches()
        assert text == ask(q) and text.strip()
    assert together[0] != together[1]
    assert pool.stats() == {"engines": 2, "busy": 0, "waiting": 0, "max_waiting": 1}


def test_a_full_queue_answers_503_and_the_retrieve_route_works(live):
    server, pool = live
    held = [pool.acquire(0), pool.acquire(0)]
    try:
        with pytest.raises(Busy):
            pool.acquire(0.2)  # a waiter with no engine freed in time
        waiter = threading.Thread(target=lambda: held.append(pool.acquire(5)))
        waiter.start()  # takes the one queue place
        time.sleep(0.3)
        with pytest.raises(openai.APIStatusError) as e:
            server.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert e.value.status_code == 503 and "busy" in e.value.message
        pool.release(held.pop(0))
        waiter.join(5)
    finally:
        for agent in held:
            pool.release(agent)
    status, _, body = server.raw("POST", "/retrieve", json.dumps(
        {"queries": ["capital of Peru"], "topk": 2, "return_scores": True}).encode(),
        {"Content-Type": "application/json"})
    hits = json.loads(body)["result"][0]
    assert status == 200 and hits[0]["document"]["id"] == "0" and len(hits) == 2
    from dgpo_edge.retrieval.http import HttpRetriever

    with HttpRetriever(server.url + "/retrieve") as remote:  # the project's own Search-R1 client
        assert [p.id for p in remote.search(["capital of Kenya"], k=1)[0]] == ["4"]


@pytest.mark.parametrize("method, path, body, headers, status, needle", [
    ("POST", "/v1/chat/completions", b"{}", {"Content-Type": "text/plain"}, 415, "application/json"),
    ("POST", "/v1/chat/completions", b"{", {"Content-Type": "application/json"}, 400, "malformed JSON"),
    ("POST", "/v1/chat/completions", b'{"messages": []}', {"Content-Type": "application/json"}, 400, "messages"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "assistant", "content": "x"}]}',
     {"Content-Type": "application/json"}, 400, "role 'user'"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": 0.7, '
     b'"seed": -1}', {"Content-Type": "application/json"}, 400, "'seed' must be 0 or more"),
    # a lone surrogate escape reached the engine's encoder: a 500 "'utf-8' codec can't encode" after the queue
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "Peru \\ud800?"}]}',
     {"Content-Type": "application/json"}, 400, "the question is not valid Unicode text: a lone surrogate"),
    ("POST", "/v1/chat/completions", b"x" * 2_000_001, {"Content-Type": "application/json"}, 413, "larger"),
    ("POST", "/retrieve", b'{"queries": "q"}', {"Content-Type": "application/json"}, 400, "list of strings"),
    ("GET", "/v1/chat/completions", b"", {}, 405, "Method Not Allowed"),
    ("GET", "/nope", b"", {}, 404, "Not Found"),
    ("GET", "/v1/models", b"", {"Host": "evil.example:8080"}, 403, "localhost"),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}',
     {"Content-Type": "application/json", "Origin": "https://evil.example"}, 403, "web pages"),
    ("POST", "/v1/chat/completions", b"{}", {}, 415, "no Content-Type"),
])
def test_bad_requests_get_json_errors_never_tracebacks(live, method, path, body, headers, status, needle):
    server, _ = live
    got, hdrs, raw = server.raw(method, path, body, headers)
    assert got == status and hdrs["content-type"] == "application/json"
    err = json.loads(raw)["error"]
    assert needle in err["message"] and "Traceback" not in raw.decode()


def test_a_request_waits_for_an_engine_under_a_timeout_past_threadings_limit():
    """`serve --timeout 1e10` (for "no limit"): a request that had to wait for the engine got
    OverflowError ("timeout value is too large") from the condition's wait, answered 500."""
    pool = AgentPool([Agent(ScriptedEngine([]), ListRetriever([]), QUICK)], max_waiting=1)
    held = pool.acquire()
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(timeout=1e10)))
    waiter.start()
    time.sleep(0.2)
    pool.release(held)
    waiter.join(5)
    assert got == [held]


class ClosingEngine(ScriptedEngine):
    def close(self) -> None:
        self.closed = True


def test_a_pool_grows_around_one_agent_and_closes_it_when_the_next_engine_fails():
    """`AgentPool.around` is how `load_pool` (bundle) builds serve's pool: the agent room loads nothing."""
    retriever, first = ListRetriever([]), ClosingEngine([])
    agent = Agent(first, retriever, QUICK, timeout_s=5)
    agent.info = {"model": "m"}
    pool = AgentPool.around(agent, lambda: ClosingEngine([]), engines=3, max_waiting=2)
    assert len(pool.agents) == 3 and pool.agents[0] is agent and pool.max_waiting == 2
    assert len({id(a.engine) for a in pool.agents}) == 3 and {a.retriever for a in pool.agents} == {retriever}
    assert all(a.config == QUICK and a.timeout_s == 5 and a.info == {"model": "m"} for a in pool.agents)

    opened = []

    def second_fails() -> ClosingEngine:
        if opened:
            raise RuntimeError("out of memory")
        opened.append(ClosingEngine([]))
        return opened[0]

    first = ClosingEngine([])
    with pytest.raises(RuntimeError, match="out of memory"):
        AgentPool.around(Agent(first, retriever, QUICK), second_fails, engines=3)
    assert getattr(first, "closed", False) and getattr(opened[0], "closed", False)   # nothing left open


def test_a_requests_top_k_is_ignored_and_temperature_and_seed_are_read():
    """OpenAI-style bodies may carry `top_k` (sampling top-k elsewhere); it must not reach the agent."""
    from dgpo_edge.agent.openai_format import ChatRequest, parse_chat_request

    body = {"messages": [{"role": "user", "content": "capital of Peru?"}], "top_k": 1, "top_p": 0.5,
            "temperature": 0.7, "seed": 3}
    assert parse_chat_request(body) == ChatRequest("capital of Peru?", temperature=0.7, seed=3)


def test_searches_and_sources_in_the_extra_field_and_the_stream(index):
    from dgpo_edge.retrieval.retrievers import open_index

    script = ["<search>capital of Peru</search>", "<answer>Lima</answer>"]
    retriever = open_index(index)
    agents = [Agent(ScriptedEngine(script * 4), retriever, QUICK)]
    pool = AgentPool(agents, max_waiting=0)
    server = LiveServer(pool, limits=ServeLimits(timeout=30))
    try:
        client = server.client()
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Capital of Peru?"}])
        assert r.choices[0].message.content == "Lima" and r.choices[0].finish_reason == "stop"
        extra = r.model_extra["dgpo_edge"]
        assert [s["query"] for s in extra["searches"]] == ["capital of Peru"]
        top = extra["searches"][0]["passages"][0]
        assert (top["id"], top["title"]) == ("0", "Peru") and top["score"] > 0
        assert extra["sources"][0]["id"] == "0" and "Lima" in extra["sources"][0]["text"]
        assert extra["cited"] == ["0"]
        chunks = list(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Capital of Peru?"}], stream=True))
        reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
        assert "<search>capital of Peru</search>" in reasoning
        assert "searched: capital of Peru\n  [1] Peru (0)" in reasoning
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert content == "Lima" and chunks[-1].model_extra["dgpo_edge"]["cited"] == ["0"]
    finally:
        server.stop()
        pool.close()


def test_the_serve_command_prints_its_url_serves_and_stops_on_ctrl_c(index):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "dgpo_edge", "serve", "--model", str(smollm2_gguf()),
                             "--index", str(index), "--port", "0", "--threads", "1", "--model-name", "notes"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "COLUMNS": "40"})   # narrow: the line is still one
    try:
        line = proc.stdout.readline()
        assert "serving" in line and "(1 engine(s), queue 8)" in line, line + proc.stderr.read()
        url = line.split(" on ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["notes"]
        # a long question in flight (the base model writes 5 turns of 500 tokens) must not hold up Ctrl-C
        answers = []
        asking = threading.Thread(target=lambda: answers.append(client.chat.completions.create(
            model="notes", messages=[{"role": "user", "content": "hi"}])))
        asking.start()
        time.sleep(1.0)
    finally:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 20, "Ctrl-C waited for the answer"
    assert proc.returncode in (0, 130) and "Traceback" not in err, err  # 130: stopped by SIGINT
    asking.join(30)
    assert answers[0].choices[0].finish_reason == "length"  # the question was stopped, and said so
    assert answers[0].model_extra["dgpo_edge"]["stop_reason"] == "stopped"


def test_a_taken_port_is_one_error_line(index):
    from cli_helpers import assert_one_line_error, invoke

    taken = listen("127.0.0.1", 0)
    try:
        r = invoke("serve", "--index", index, "--port", taken.getsockname()[1])
    finally:
        taken.close()
    assert_one_line_error(r, "cannot listen on 127.0.0.1:")


def test_a_failing_retriever_is_a_json_500_and_a_stream_error_event(index):
    from dgpo_edge.retrieval.retrievers import open_index

    broken = open_index(index)
    broken.close()  # searching a closed store fails inside the agent, as a real fault would
    pool = AgentPool([Agent(ScriptedEngine(["<search>capital of Peru</search>"] * 4), broken, QUICK)], 0)
    server = LiveServer(pool)
    try:
        client = server.client()
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Peru?"}])
        assert "500 - error: " in e.value.message and "closed database" in e.value.message
        assert "Traceback" not in e.value.message
        with pytest.raises(openai.APIError, match="error: "):
            list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Peru?"}],
                                                stream=True))
        assert pool.stats()["busy"] == 0
    finally:
        server.stop()
        pool.agents[0].engine.close()


def test_without_the_serve_extra_it_says_what_to_install(index, monkeypatch):
    import sys

    from cli_helpers import assert_one_line_error, invoke

    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert_one_line_error(invoke("serve", "--index", index, "--port", 0), "pip install 'dgpo-edge[serve]'")


@pytest.mark.parametrize("args, needle", [(["-k", "0"], "--top-k must be in 1..20, got 0"),
                                          (["--max-searches", "-1"], "--max-searches must be in 0..16, got -1"),
                                          (["--timeout", "nan"], "--timeout must be a number of seconds > 0, got nan")])
def test_bad_search_options_are_named_as_typed(index, args, needle):
    # one line with the option's own name, before anything loads (it said "top_k", the config's name)
    from cli_helpers import assert_one_line_error, invoke

    assert_one_line_error(invoke("serve", "--index", index, "--port", 0, *args), needle)
