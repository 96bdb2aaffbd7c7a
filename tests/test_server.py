"""The Search-R1-compatible `/retrieve` server and `HttpRetriever`, over real loopback HTTP.

The server runs in a background thread on an ephemeral port, over a real
PassageStore (the wiki-18 sample when ../shared is present, else 50 small
hand-made passages) searched with `BM25Retriever`.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from dgpo_edge.errors import InputError
from dgpo_edge.protocol import Passage, format_docs
from dgpo_edge.retrieval.base import Retriever
from dgpo_edge.retrieval.bounded import DeadlineReader, HandlerPool
from dgpo_edge.retrieval.corpus import iter_corpus
from dgpo_edge.retrieval.http import HttpRetriever, RetrievalError, _batches, _parse_result
from dgpo_edge.retrieval.retrievers import BM25Retriever
from dgpo_edge.retrieval.server import RetrievalServer, make_server, serve
from dgpo_edge.retrieval.store import PassageStore

QUERIES = [
    "Who was Evan Morris and who did he lobby for?",
    "the history of the city and its river",
    "football club founded in the year",
    "album released by the band",
    "what is the capital of the country",
]

# --- fixtures -------------------------------------------------------------------------------


def fallback_passages() -> list[Passage]:
    """50 small passages in the Search-R1 `"Title"\\ntext` form, covering QUERIES' words."""
    subjects = ["Riverton", "Evan Morris", "Blue Harbor FC", "The Lanterns", "Norland",
                "Old Mill", "Cedar Valley", "Greyport", "Silver Lake", "Marble Hill"]
    facets = [
        "{s} is a city on the river Avon; the history of the city begins in the year 1200.",
        "{s} football club was founded in the year 1901 and plays in the city stadium.",
        "{s} released an album with the band in 1999; the album was a hit in the country.",
        "{s} was a lobbyist for Genentech and Roche in Washington, D.C., for many years.",
        "The capital of the country near {s} is a port city on the river delta.",
    ]
    return [Passage(str(i), f'"{s} ({j})"\n' + f.format(s=s))
            for i, (s, (j, f)) in enumerate((s, jf) for s in subjects for jf in enumerate(facets))]


@pytest.fixture(scope="module")
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PassageStore]:
    """The wiki-18 sample store when ../shared is there, else the 50 fallback passages."""
    try:
        corpus = request.getfixturevalue("shared_dir") / "data" / "corpus" / "wiki18_sample_1000.jsonl"
    except pytest.skip.Exception:
        corpus = None
    passages = iter_corpus(corpus) if corpus is not None and corpus.is_file() else fallback_passages()
    s = PassageStore.build(tmp_path_factory.mktemp("server") / "store.sqlite", passages)
    yield s
    s.close()


@pytest.fixture(scope="module")
def retriever(store: PassageStore) -> Retriever:
    """The real BM25 retriever; not closed here, since closing it closes the shared store."""
    return BM25Retriever(store)


@contextmanager
def running(retriever: Retriever, **options) -> Iterator[RetrievalServer]:
    """A server on an ephemeral loopback port, serving in a daemon thread until the block ends."""
    server = make_server(retriever, port=0, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def server(retriever: Retriever) -> Iterator[RetrievalServer]:
    with running(retriever) as s:
        yield s


# --- client helpers --------------------------------------------------------------------------


def request(server: RetrievalServer, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], object]:
    """One request via http.client; returns (status, headers, decoded JSON body)."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, dict(resp.getheaders()), json.loads(raw)
    finally:
        conn.close()


def post_json(server: RetrievalServer, payload: object) -> tuple[int, object]:
    """POST a body exactly as `requests.post(url, json=payload)` sends it (Search-R1's clients)."""
    body = json.dumps(payload).encode("utf-8")  # requests: complexjson.dumps(json, allow_nan=False)
    status, _, data = request(server, "POST", "/retrieve", body, {
        "User-Agent": "python-requests/2.32.3", "Accept-Encoding": "gzip, deflate",
        "Accept": "*/*", "Connection": "keep-alive", "Content-Type": "application/json"})
    return status, data


def raw_exchange(server: RetrievalServer, head: bytes, body: bytes = b"", half_close: bool = False) -> bytes:
    """Send raw bytes on a socket and read the whole answer (for malformed requests)."""
    with socket.create_connection(server.server_address[:2], timeout=5) as sock:
        sock.sendall(head + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


JSON_POST = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def split_response(raw: bytes) -> tuple[int, object]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def search_r1_passages2string(retrieval_result: list[dict]) -> str:
    """Search-R1's `_passages2string` (generation.py), which reads ['document']['contents']."""
    format_reference = ""
    for idx, doc_item in enumerate(retrieval_result):
        content = doc_item["document"]["contents"]
        title = content.split("\n")[0]
        text = "\n".join(content.split("\n")[1:])
        format_reference += f"Doc {idx+1}(Title: {title}) {text}\n"
    return format_reference


def as_tuples(results: list[list[Passage]]) -> list[list[tuple]]:
    return [[(p.id, p.contents, p.score) for p in hits] for hits in results]


# --- the Search-R1 API -------------------------------------------------------------------------


def test_search_r1_client_request(server: RetrievalServer, retriever: Retriever) -> None:
    status, data = post_json(server, {"queries": QUERIES, "topk": 3, "return_scores": True})
    assert status == 200
    assert list(data) == ["result"] and len(data["result"]) == len(QUERIES)
    expected = retriever.search(QUERIES, 3)
    for hits, want in zip(data["result"], expected):
        assert len(hits) == 3
        for item, p in zip(hits, want):
            assert set(item) == {"document", "score"} and set(item["document"]) == {"id", "contents"}
            assert isinstance(item["score"], float)
            assert (item["document"]["id"], item["document"]["contents"], item["score"]) == (p.id, p.contents, p.score)
        scores = [item["score"] for item in hits]
        assert scores == sorted(scores, reverse=True)
        # What a Search-R1 rollout puts in <information> is what our protocol renders.
        assert search_r1_passages2string(hits) == format_docs(want)


def test_return_scores_false_gives_bare_corpus_rows(server: RetrievalServer, retriever: Retriever) -> None:
    for payload in ({"queries": QUERIES[:2], "topk": 2, "return_scores": False},
                    {"queries": QUERIES[:2], "topk": 2}):
        status, data = post_json(server, payload)
        assert status == 200
        want = retriever.search(QUERIES[:2], 2)
        assert data == {"result": [[{"id": p.id, "contents": p.contents} for p in hits] for hits in want]}


def test_default_and_explicit_topk(server: RetrievalServer, retriever: Retriever) -> None:
    for payload, n in (({"queries": [QUERIES[1]]}, 3), ({"queries": [QUERIES[1]], "topk": None}, 3),
                       ({"queries": [QUERIES[1]], "topk": 7}, 7), ({"queries": [QUERIES[1]], "topk": 30}, 30)):
        status, data = post_json(server, payload)
        assert status == 200 and len(data["result"][0]) == n, payload
    status, data = post_json(server, {"queries": [QUERIES[1]], "topk": 100})  # max_topk is allowed
    assert status == 200 and len(data["result"][0]) == len(retriever.search([QUERIES[1]], 100)[0])


def test_default_topk_option(retriever: Retriever) -> None:
    with running(retriever, default_topk=5) as s:
        assert len(post_json(s, {"queries": [QUERIES[1]]})[1]["result"][0]) == 5


def test_query_without_words_gives_an_empty_list(server: RetrievalServer) -> None:
    status, data = post_json(server, {"queries": ["", "?!", QUERIES[0]], "topk": 3, "return_scores": True})
    assert status == 200 and [len(h) for h in data["result"]] == [0, 0, 3]


def test_keep_alive_works(server: RetrievalServer) -> None:
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        for _ in range(3):  # one connection, several requests (HTTP/1.1 keep-alive)
            conn.request("POST", "/retrieve", body=json.dumps({"queries": [QUERIES[0]]}).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200 and len(json.loads(resp.read())["result"][0]) == 3
    finally:
        conn.close()


def test_health(server: RetrievalServer, store: PassageStore) -> None:
    status, headers, data = request(server, "GET", "/health")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert data["status"] == "ok" and data["passages"] == len(store)


# --- HttpRetriever -------------------------------------------------------------------------------


def test_http_retriever_round_trip(server: RetrievalServer, retriever: Retriever) -> None:
    queries = QUERIES * 3
    want = as_tuples(retriever.search(queries, 4))
    assert as_tuples(HttpRetriever(server.url + "/retrieve").search(queries, 4)) == want
    # A bare base URL gets /retrieve; small batches give the same answer in order.
    assert as_tuples(HttpRetriever(server.url, max_batch=2).search(queries, 4)) == want
    assert HttpRetriever(server.url).search([], 3) == []
    assert HttpRetriever(server.url).health()["status"] == "ok"


def test_http_retriever_batches_past_the_server_limit(retriever: Retriever) -> None:
    with running(retriever, max_queries=4) as s:
        queries = QUERIES * 2
        assert as_tuples(HttpRetriever(s.url, max_batch=4).search(queries, 2)) == \
            as_tuples(retriever.search(queries, 2))
        with pytest.raises(RetrievalError, match=r"HTTP 400.*too many queries"):
            HttpRetriever(s.url, max_batch=8).search(queries, 2)


def test_http_retriever_batches_by_body_size(retriever: Retriever) -> None:
    """Long non-ASCII queries are split so that no request exceeds the server's body limit."""
    queries = [f"{q} {'é' * 200}" for q in QUERIES] * 2
    with running(retriever, max_body_bytes=1500) as s:
        client = HttpRetriever(s.url, max_body_bytes=1500)
        assert as_tuples(client.search(queries, 2)) == as_tuples(retriever.search(queries, 2))
    assert _batches(["a" * 10] * 7, 3, 10_000) == [["a" * 10] * 3, ["a" * 10] * 3, ["a" * 10]]
    assert _batches(["a" * 10] * 3, 100, 30) == [["a" * 10] * 2, ["a" * 10]]
    assert _batches(["a" * 100], 100, 30) == [["a" * 100]]  # too big alone: sent, the server decides


def test_http_retriever_closed_port_names_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        url = f"http://127.0.0.1:{port}/retrieve"
        with pytest.raises(RetrievalError) as info:
            HttpRetriever(url, timeout=5).search(["anything"], 3)
    assert isinstance(info.value, InputError)
    assert url in str(info.value) and "cannot reach" in str(info.value)


def test_http_retriever_parses_search_r1_shapes() -> None:
    """Scored dense rows, unscored rows, and Search-R1's BM25 rows (title/text/contents, no id)."""
    url = "http://x/retrieve"
    scored = {"result": [[{"document": {"id": "7", "contents": '"T"\nbody'}, "score": 0.5}]]}
    assert _parse_result(scored, 1, url) == [[Passage("7", '"T"\nbody', 0.5)]]
    bare = {"result": [[{"id": 7, "contents": '"T"\nbody'}]]}
    assert _parse_result(bare, 1, url) == [[Passage("7", '"T"\nbody', None)]]
    bm25 = {"result": [[{"document": {"title": "T", "text": "body", "contents": '"T"\nbody'}, "score": 3}]]}
    (p,), = _parse_result(bm25, 1, url)
    assert p.contents == '"T"\nbody' and p.score == 3.0 and p.id.startswith("sha1:")
    for bad in ({"detail": "x"}, {"result": []}, {"result": [[{"document": {"id": "1"}}]]},
                {"result": [[{"document": {"id": "1", "contents": "c"}, "score": "high"}]]}):
        with pytest.raises(RetrievalError, match="http://x/retrieve"):
            _parse_result(bad, 1, url)


# --- concurrency and locking ----------------------------------------------------------------------


def test_concurrent_clients(server: RetrievalServer, retriever: Retriever) -> None:
    """20 client threads x 10 requests each, every answer correct, no errors."""
    expected = {q: as_tuples(retriever.search([q], 3)) for q in QUERIES}
    client = HttpRetriever(server.url)

    def worker(i: int) -> int:
        ok = 0
        for j in range(10):
            q = QUERIES[(i + j) % len(QUERIES)]
            assert as_tuples(client.search([q], 3)) == expected[q]
            ok += 1
        return ok

    with ThreadPoolExecutor(20) as pool:
        assert sum(pool.map(worker, range(20))) == 200


class Gauge(Retriever):
    """Records how many searches ran at once; optionally waits for a partner search."""

    def __init__(self, thread_safe: bool, barrier: threading.Barrier | None = None):
        self.thread_safe = thread_safe
        self.barrier = barrier
        self.active = self.peak = 0
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            time.sleep(0.02)
            return [[Passage("0", '"T"\nx', 1.0)] for _ in queries]
        finally:
            with self._lock:
                self.active -= 1


def test_unsafe_retrievers_are_serialised() -> None:
    gauge = Gauge(thread_safe=False)
    with running(gauge) as s, ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: post_json(s, {"queries": ["q"]})[0], range(16)))
    assert statuses == [200] * 16 and gauge.peak == 1


def test_thread_safe_retrievers_run_in_parallel() -> None:
    # Each search waits for a second one to arrive: only concurrent calls get past it.
    gauge = Gauge(thread_safe=True, barrier=threading.Barrier(2, timeout=5))
    with running(gauge) as s, ThreadPoolExecutor(2) as pool:
        statuses = list(pool.map(lambda _: post_json(s, {"queries": ["q"]})[0], range(2)))
    assert statuses == [200, 200] and gauge.peak == 2


# --- client errors --------------------------------------------------------------------------------

BAD_BODIES = [
    (b"{not json", "malformed JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"", "malformed JSON"),
    (b'["q"]', "JSON object"),
    (b'{"topk": 3}', "missing 'queries'"),
    (b'{"queries": "who?"}', "must be a list"),
    (b'{"queries": ["ok", 3]}', r"queries\[1\] must be a string"),
    (b'{"queries": [null]}', r"queries\[0\] must be a string"),
    (b'{"queries": []}', "empty"),
    (json.dumps({"queries": ["q"] * 257}).encode(), "too many queries"),
    (json.dumps({"queries": ["q" * 2001]}).encode(), "too long"),
    (b'{"queries": ["q"], "topk": 0}', "1..100"),
    (b'{"queries": ["q"], "topk": 1000000}', "1..100"),
    (b'{"queries": ["q"], "topk": -1}', "1..100"),
    (b'{"queries": ["q"], "topk": "3"}', "integer"),
    (b'{"queries": ["q"], "topk": 3.0}', "integer"),
    (b'{"queries": ["q"], "topk": true}', "integer"),
    (b'{"queries": ["q"], "return_scores": "yes"}', "true or false"),
    (b'{"queries": ["q"], "return_scores": 1}', "true or false"),
    # Python refuses to parse integers of more than 4,300 digits: still the client's mistake
    (b'{"queries": ["q"], "topk": 1' + b"0" * 5000 + b"}", "more than 4300 digits"),
    (b'{"queries": ["ok", "a\\ud800b"]}', r"queries\[1\] is not valid Unicode.*lone surrogate"),
    (b'{"queries": ["\\udc00"]}', r"queries\[0\] is not valid Unicode"),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES, ids=[m for _, m in BAD_BODIES])
def test_bad_bodies_are_400(server: RetrievalServer, body: bytes, message: str) -> None:
    status, headers, data = request(server, "POST", "/retrieve", body, {"Content-Type": "application/json"})
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    assert list(data) == ["error"]
    assert re.search(message, data["error"]), data["error"]


def test_body_over_the_limit_is_413_without_reading_it(server: RetrievalServer) -> None:
    """Announce 1 GB, send 64 KiB: the answer must come at once, not after a 1 GB read."""
    head = (b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n")
    start = time.monotonic()
    status, data = split_response(raw_exchange(server, head, b"x" * 65536))
    assert status == 413 and "limit is 1000000" in data["error"]
    assert time.monotonic() - start < 3
    assert post_json(server, {"queries": ["q"]})[0] == 200


def test_body_just_over_a_small_limit_is_413(retriever: Retriever) -> None:
    body = json.dumps({"queries": ["q" * 50]}).encode()
    with running(retriever, max_body_bytes=len(body) - 1) as s:
        status, _, data = request(s, "POST", "/retrieve", body, {"Content-Type": "application/json"})
        assert status == 413 and "error" in data
    with running(retriever, max_body_bytes=len(body)) as s:
        assert request(s, "POST", "/retrieve", body, {"Content-Type": "application/json"})[0] == 200


def test_missing_content_length_is_411(server: RetrievalServer) -> None:
    head = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\r\n"
    status, data = split_response(raw_exchange(server, head, b'{"queries": ["q"]}', half_close=True))
    assert status == 411 and "Content-Length" in data["error"]
    chunked = (b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n"
               b"11\r\n{\"queries\": [\"q\"]}\r\n0\r\n\r\n")
    assert split_response(raw_exchange(server, chunked))[0] == 411


def test_bad_and_short_content_length(server: RetrievalServer) -> None:
    for value in (b"-5", b"1" + b"0" * 5000, "\u00b2".encode(), "\u0663".encode(), b"1 2", b"0x10"):
        head = JSON_POST + b"Content-Length: " + value + b"\r\n\r\n"
        status, data = split_response(raw_exchange(server, head))
        assert status == 400 and "Content-Length" in data["error"], value[:20]
    # The client announces 100 bytes, sends 17 and stops sending.
    head = JSON_POST + b"Content-Length: 100\r\n\r\n"
    status, data = split_response(raw_exchange(server, head, b'{"queries": ["q"]', half_close=True))
    assert status == 400 and "ended after 17 of 100" in data["error"]


def test_a_body_that_is_not_declared_json_is_415(server: RetrievalServer) -> None:
    """A web page can send a cross-origin POST without a preflight only with no type or a form/text one."""
    body = json.dumps({"queries": ["q"]}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                  "application/vnd.api+json", "application/jsonp", ""):
        status, _, data = request(server, "POST", "/retrieve", body, {"Content-Type": ctype})
        assert status == 415 and "application/json" in data["error"], ctype
    # No Content-Type at all (fetch() with a Blob body, or http.client's default)
    status, data = split_response(raw_exchange(
        server, b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body), body))
    assert status == 415 and "no Content-Type" in data["error"]
    for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON ; charset=UTF-8"):
        assert request(server, "POST", "/retrieve", body, {"Content-Type": ctype})[0] == 200, ctype


FOREIGN_ORIGINS = ["https://evil.example", "http://evil.example:8000", "null", "http://localhost.evil.example",
                   "http://127.0.0.1.evil.example", "file://", "not a url"]


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
def test_a_foreign_origin_is_403(server: RetrievalServer, origin: str) -> None:
    """A page on another site must not run searches (a POST) or probe the server (a GET)."""
    headers = {"Content-Type": "application/json", "Origin": origin}
    status, _, data = request(server, "POST", "/retrieve", json.dumps({"queries": ["q"]}).encode(), headers)
    assert status == 403 and "Origin" in data["error"]
    assert request(server, "GET", "/health", None, {"Origin": origin})[0] == 403


def test_loopback_origins_are_allowed(server: RetrievalServer) -> None:
    body = json.dumps({"queries": ["q"]}).encode()
    for origin in ("http://localhost:3000", "http://127.0.0.1:8000", "http://[::1]:8000", "https://localhost"):
        headers = {"Content-Type": "application/json", "Origin": origin}
        assert request(server, "POST", "/retrieve", body, headers)[0] == 200, origin


def test_wrong_method_and_unknown_path(server: RetrievalServer) -> None:
    status, headers, data = request(server, "GET", "/retrieve")
    assert status == 405 and headers["Allow"] == "POST" and "error" in data
    for method in ("PUT", "DELETE", "OPTIONS"):
        assert request(server, method, "/retrieve")[0] == 405
    assert request(server, "POST", "/health", b"{}")[0] == 405
    for method, path in (("GET", "/"), ("POST", "/search"), ("GET", "/retrieve/x")):
        status, _, data = request(server, method, path, b"{}" if method == "POST" else None)
        assert status == 404 and "error" in data
    # On a kept-alive connection, the body of a refused request must not be read as the next request.
    answer = raw_exchange(server, b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 33\r\n\r\n",
                          b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in answer
    status, data = split_response(raw_exchange(server, b"BREW /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))
    assert status == 501 and "error" in data  # protocol-level errors are JSON too


def test_foreign_host_header_is_refused_on_loopback(server: RetrievalServer) -> None:
    """A page whose DNS name was rebound to 127.0.0.1 must not read the corpus."""
    body = json.dumps({"queries": ["q"]}).encode()
    json_type = {"Content-Type": "application/json"}
    status, _, data = request(server, "POST", "/retrieve", body, {"Host": "evil.example:8000", **json_type})
    assert status == 403 and "loopback" in data["error"]
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
        assert request(server, "POST", "/retrieve", body, {"Host": host, **json_type})[0] == 200, host


def test_a_lone_surrogate_query_on_a_dense_index_is_400(store: PassageStore) -> None:
    """The real int8 MiniLM tokenizer cannot take a lone surrogate: the request is wrong, not the server."""
    faiss = pytest.importorskip("faiss")
    from dgpo_edge.retrieval.encoders import MiniLMOnnx, minilm_onnx_available
    from dgpo_edge.retrieval.retrievers import DenseRetriever, HybridRetriever

    if not minilm_onnx_available():
        pytest.skip("needs the int8 ONNX MiniLM encoder")
    encoder = MiniLMOnnx(threads=1)
    rows = store.get_rows(list(range(20)))
    index = faiss.IndexFlatIP(encoder.spec.dim)
    index.add(encoder.encode_passages([p.contents for p in rows]))
    small = PassageStore.build(store.path.with_name("dense.sqlite"), rows)
    dense = DenseRetriever(small, index, encoder)
    try:
        for retriever in (dense, HybridRetriever(dense, BM25Retriever(small))):
            with running(retriever) as s:
                for query in ("\ud800", "caf\udce9"):  # the second is how Python decodes b"caf\xe9" in argv
                    status, data = post_json(s, {"queries": [QUERIES[0], query]})
                    assert status == 400 and "queries[1] is not valid Unicode" in data["error"], data
                assert post_json(s, {"queries": [QUERIES[0]]})[0] == 200
    finally:
        small.close()


# --- slow clients and connection bounds -------------------------------------------------------------


def trickle(server: RetrievalServer, head: bytes, drip: bytes, every: float = 0.2,
            give_up: float = 6.0) -> tuple[bytes, float]:
    """Send `head`, then one byte of `drip` every `every` s until the server answers or closes.

    Returns what the server sent and how long after `head` it stopped the exchange.
    """
    with socket.create_connection(server.server_address[:2], timeout=every) as sock:
        sock.sendall(head)
        start, answer = time.monotonic(), b""
        for i in range(int(give_up / every)):
            try:
                sock.sendall(drip[i % len(drip):i % len(drip) + 1])
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # reset: the server closed while we were still sending
                break
            if not chunk:
                break
            answer += chunk
        return answer, time.monotonic() - start


@pytest.mark.parametrize("part", ["request line", "headers", "body"])
def test_a_trickling_client_is_cut_off_at_the_request_deadline(retriever: Retriever, part: str) -> None:
    """Slow-loris: a byte every 0.2 s never trips a per-read timeout, but the whole request has 1 s."""
    head = {"request line": b"POST /retrie",
            "headers": JSON_POST + b"X-Slow: ",
            "body": JSON_POST + b"Content-Length: 1000\r\n\r\n"}[part]
    with running(retriever, request_timeout=1.0) as s:
        answer, elapsed = trickle(s, head, b"a")
        assert elapsed < 3.0, elapsed
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert "within 1 s" in split_response(answer)[1]["error"]
        assert post_json(s, {"queries": ["q"]})[0] == 200


def test_an_idle_connection_is_closed_without_an_answer(retriever: Retriever) -> None:
    with running(retriever, request_timeout=0.5) as s, \
            socket.create_connection(s.server_address[:2], timeout=5) as sock:
        start = time.monotonic()
        assert sock.recv(100) == b""  # closed, with nothing to answer
        assert time.monotonic() - start < 2.5


def test_handler_threads_are_bounded_and_the_rest_get_503(retriever: Retriever) -> None:
    """3 handler threads and 2 waiting places: of 9 silent connections the last 4 are refused at once."""
    with running(retriever, max_threads=3, max_pending=2, request_timeout=30) as s:
        before = threading.active_count()
        socks = [socket.create_connection(s.server_address[:2], timeout=5) for _ in range(9)]
        try:
            start = time.monotonic()
            for sock in socks[5:]:
                status, data = split_response(b"".join(iter(lambda sock=sock: sock.recv(65536), b"")))
                assert status == 503 and "busy" in data["error"]
            assert time.monotonic() - start < 3
            assert threading.active_count() - before <= 3
            # a client refused mid-request still reads its 503 (no reset before it could)
            for _ in range(10):
                status, data = post_json(s, {"queries": ["q"]})
                assert status == 503 and "retry" in data["error"]
        finally:
            for sock in socks:
                sock.close()
        # the held connections end when their clients leave; the server answers again
        deadline = time.monotonic() + 5
        while (status := post_json(s, {"queries": ["q"]})[0]) == 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 200
        assert threading.active_count() - before <= 3


def test_pipelined_requests_on_one_connection_are_all_answered(server: RetrievalServer) -> None:
    """Bytes read past one request stay buffered for the next (the reader is not per request)."""
    body = json.dumps({"queries": [QUERIES[0]]}).encode()
    one = JSON_POST + b"Content-Length: %d\r\n\r\n" % len(body) + body
    last = JSON_POST + b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    answer = raw_exchange(server, one * 2 + last)
    assert answer.count(b"HTTP/1.1 200 OK") == 3


def test_deadline_reader_lines_reads_and_deadline() -> None:
    a, b = socket.socketpair()
    with a, b:
        reader = DeadlineReader(a, write_timeout=None)
        reader.start(5)
        b.sendall(b"GET / HTTP/1.1\r\nlong header line\r\nbody-bytes")
        assert reader.readline(65537) == b"GET / HTTP/1.1\r\n" and reader.started
        assert reader.readline(4) == b"long"  # the limit cuts a line, as BufferedReader does
        assert reader.readline() == b" header line\r\n"
        assert reader.read(4) == b"body"
        reader.start(0.3)
        assert reader.started  # "-bytes" is already here: part of the next request
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            reader.read(100)
        assert reader.expired and 0.2 < time.monotonic() - start < 2
        b.shutdown(socket.SHUT_WR)
        reader.start(5)
        assert reader.read(100) == b"-bytes" and reader.readline() == b""  # EOF


def test_handler_pool_bounds_threads_and_waiting_items() -> None:
    release = threading.Event()
    done: list[int] = []
    pool = HandlerPool(lambda i: (release.wait(5), done.append(i)), max_threads=2, max_pending=1)
    before = threading.active_count()
    assert [pool.submit(i) for i in range(5)] == [True, True, True, False, False]
    assert threading.active_count() - before == 2
    release.set()
    deadline = time.monotonic() + 5
    while len(done) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(done) == [0, 1, 2] and pool.submit(3)
    assert pool.close() in ([], [3]) and not pool.submit(4)


def test_waiting_connections_are_served_when_a_thread_frees(retriever: Retriever) -> None:
    with running(retriever, max_threads=1, max_pending=4) as s, ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: post_json(s, {"queries": ["q"]})[0], range(4)))
    assert statuses == [200] * 4


# --- server errors ----------------------------------------------------------------------------------


class Flaky(Retriever):
    """Fails on the query 'boom', like an index that hits a bad row."""

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        if "boom" in queries:
            raise RuntimeError("index row 17 is corrupt\nsecond line not sent")
        return [[Passage("1", '"T"\nx', 0.5)] for _ in queries]


def test_retriever_exception_is_500_json_and_server_survives(caplog: pytest.LogCaptureFixture) -> None:
    with running(Flaky()) as s:
        for _ in range(3):
            status, data = post_json(s, {"queries": ["ok", "boom"]})
            assert status == 500 and data == {"error": "retrieval failed: RuntimeError: index row 17 is corrupt"}
            assert post_json(s, {"queries": ["ok"], "return_scores": True}) == \
                (200, {"result": [[{"document": {"id": "1", "contents": '"T"\nx'}, "score": 0.5}]]})
        with pytest.raises(RetrievalError, match="HTTP 500.*index row 17 is corrupt"):
            HttpRetriever(s.url).search(["boom"], 3)
    assert any("retrieval request failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_wrong_result_count_is_500() -> None:
    class Short(Retriever):
        def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
            return []

    with running(Short()) as s:
        status, data = post_json(s, {"queries": ["a", "b"]})
    assert status == 500 and "0 result lists for 2 queries" in data["error"]


def test_access_log_option(retriever: Retriever) -> None:
    lines: list[str] = []
    with running(retriever, log=lines.append) as s:
        post_json(s, {"queries": ["q"]})
    assert any('"POST /retrieve HTTP/1.1" 200' in line for line in lines)


def test_serve_prints_address_and_stops_on_ctrl_c(retriever: Retriever, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    def interrupted(self: RetrievalServer, poll_interval: float = 0.5) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(RetrievalServer, "serve_forever", interrupted)
    serve(retriever, port=0)
    out = capsys.readouterr().out
    assert "http://127.0.0.1:" in out and "/retrieve" in out and "stopped" in out


def test_bad_options_are_refused(retriever: Retriever) -> None:
    for options in ({"default_topk": 0}, {"default_topk": 101}, {"max_queries": 0}, {"max_threads": 0},
                    {"max_pending": -1}, {"request_timeout": 0}):
        with pytest.raises(ValueError):
            make_server(retriever, port=0, **options)
    with pytest.raises(InputError, match="not an http"):
        HttpRetriever("localhost:8000")

