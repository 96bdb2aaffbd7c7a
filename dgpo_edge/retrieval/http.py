"""A `Retriever` backed by any Search-R1-compatible `POST /retrieve` server.

Works against our `retrieval.server` and against Search-R1's own FastAPI server
(dense or BM25), so a training run or the agent can use an index that lives in
another process or on a GPU box. urllib only: nothing to install.

Failures raise `RetrievalError`, a subclass of `InputError` whose path is the
URL: the CLI already prints an InputError as one `error: <url>: ...` line, and
the usual cause (server not started, wrong port) is a setting the user gave.
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from ..errors import InputError
from ..protocol import Passage
from .base import Retriever

_ERROR_BODY_BYTES = 4096  # enough of an error body to quote, never a whole page
_BODY_OVERHEAD = 100  # the payload's keys and brackets around the queries


class RetrievalError(InputError):
    """The retrieval server was unreachable, refused the request or answered nonsense."""

    def __init__(self, message: str, url: str):
        super().__init__(message, url, where="url")
        self.url = url


class HttpRetriever(Retriever):
    """Search through `POST /retrieve` with `return_scores: true`.

    `url` is the endpoint (`http://127.0.0.1:8000/retrieve`, as Search-R1's
    configs write it) or just the server's base URL, to which `/retrieve` is
    added. Queries go out in batches of at most `max_batch` queries and about
    `max_body_bytes` of JSON (our server's default limits), so any list works
    against a bounded server. Each call opens its own connection, so one
    instance can be shared by threads.
    """

    thread_safe = True

    def __init__(self, url: str, timeout: float = 30.0, max_batch: int = 256,
                 max_body_bytes: int = 1_000_000):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.url = _endpoint(url)
        self.timeout = timeout
        self.max_batch = max_batch
        self.max_body_bytes = max_body_bytes
        self._opener = _opener_for(self.url)

    def search(self, queries: Sequence[str], k: int = 3) -> list[list[Passage]]:
        """Best-first passages per query, in query order, across as many requests as needed."""
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        out: list[list[Passage]] = []
        for batch in _batches(list(queries), self.max_batch, self.max_body_bytes - _BODY_OVERHEAD):
            out.extend(self._search_batch(batch, k))
        return out

    def health(self) -> dict[str, Any]:
        """`GET /health` of our server (Search-R1's has none): a cheap reachability check."""
        base = self.url.rsplit("/", 1)[0]
        return self._call(urllib.request.Request(base + "/health", method="GET"))

    def _search_batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        payload = {"queries": queries, "topk": k, "return_scores": True}
        request = urllib.request.Request(
            self.url, data=json.dumps(payload, ensure_ascii=False).encode("utf-8"), method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"})
        return _parse_result(self._call(request), len(queries), self.url)

    def _call(self, request: urllib.request.Request) -> Any:
        """Send one request and decode its JSON; every failure becomes RetrievalError."""
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            raise RetrievalError(_http_error_message(e), self.url) from None
        except urllib.error.URLError as e:
            raise RetrievalError(_url_error_message(e.reason), self.url) from None
        except TimeoutError:
            raise RetrievalError(f"no answer within {self.timeout:g} s", self.url) from None
        except (http.client.HTTPException, OSError) as e:
            raise RetrievalError(f"the connection failed ({type(e).__name__}: {e})", self.url) from None
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RetrievalError(f"the answer is not JSON: {body[:120]!r}", self.url) from None


def _batches(queries: list[str], max_count: int, max_bytes: int) -> list[list[str]]:
    """Consecutive groups of at most `max_count` queries and about `max_bytes` of JSON.

    A bounded server refuses a whole request over its body limit (and, when far
    over, drops the connection mid-upload), so long non-ASCII queries must not
    be packed 256 at a time. A single oversized query still goes alone and
    gets the server's own error.
    """
    batches: list[list[str]] = []
    current: list[str] = []
    size = 0
    for q in queries:
        q_bytes = len(json.dumps(q, ensure_ascii=False).encode("utf-8")) + 2  # ", "
        if current and (len(current) >= max_count or size + q_bytes > max_bytes):
            batches.append(current)
            current, size = [], 0
        current.append(q)
        size += q_bytes
    if current:
        batches.append(current)
    return batches


def _url_error_message(reason: object) -> str:
    """Why a request failed below HTTP: server down, or the server hung up on us."""
    if isinstance(reason, (BrokenPipeError, ConnectionResetError)):
        return (f"the server closed the connection during the request ({reason}); "
                "was the request over its size limit?")
    return f"cannot reach the retrieval server ({reason}); is it running?"


def _endpoint(url: str) -> str:
    """The `/retrieve` URL for a full endpoint or a bare base URL."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"not an http(s) URL: {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/retrieve")
    return urllib.parse.urlunsplit(parts)


def _opener_for(url: str) -> urllib.request.OpenerDirector:
    """An opener that ignores http_proxy for loopback servers.

    urllib honours proxy environment variables for every host not in
    no_proxy, which would send requests for 127.0.0.1 to a corporate proxy.
    """
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost" or host.endswith(".localhost")
    return urllib.request.build_opener(urllib.request.ProxyHandler({})) if local \
        else urllib.request.build_opener()


def _http_error_message(e: urllib.error.HTTPError) -> str:
    """`HTTP 400: <the server's own message>`; ours says `error`, FastAPI says `detail`."""
    try:
        raw = e.read(_ERROR_BODY_BYTES)
    except OSError:
        raw = b""
    detail: Any = raw.decode("utf-8", "replace").strip()
    try:
        data = json.loads(raw)
        if isinstance(data, dict):
            detail = data.get("error") or data.get("detail") or detail
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    detail = str(detail)[:300]
    return f"the server answered HTTP {e.code} {e.reason}" + (f": {detail}" if detail else "")


def _parse_result(data: Any, n_queries: int, url: str) -> list[list[Passage]]:
    """Passages from `{"result": [[item, ...], ...]}`, scored or not.

    Items are `{"document": row, "score": s}` or bare rows. Rows from Search-R1's
    BM25 path have no `id`; they get a stable one from their contents.
    """
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list) or len(result) != n_queries:
        got = f"{len(result)} lists" if isinstance(result, list) else repr(data)[:120]
        raise RetrievalError(f"expected {{'result': [...]}} with {n_queries} lists, got {got}", url)
    try:
        return [[_passage(item) for item in hits] for hits in result]
    except (TypeError, KeyError, ValueError, AttributeError) as e:
        raise RetrievalError(f"malformed result item ({type(e).__name__}: {e})", url) from None


def _passage(item: dict) -> Passage:
    """One result item as a Passage, via `Passage.from_search_r1`."""
    doc = item.get("document", item)
    if "contents" not in doc and "text" in doc:
        doc = {**doc, "contents": f'"{doc.get("title", "")}"\n{doc["text"]}'}
    if not isinstance(doc["contents"], str):
        raise TypeError(f"contents must be a string, not {type(doc['contents']).__name__}")
    if doc.get("id") is None:
        digest = hashlib.sha1(doc["contents"].encode("utf-8")).hexdigest()[:16]
        doc = {**doc, "id": f"sha1:{digest}"}
    score = item.get("score") if "document" in item else None
    if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))
                              or not math.isfinite(score)):
        raise ValueError(f"score must be a number, not {score!r}")
    return Passage.from_search_r1({"document": doc, "score": None if score is None else float(score)})
