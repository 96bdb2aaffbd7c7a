"""Search-R1's `/retrieve` HTTP API over any `Retriever`, stdlib only.

Search-R1 (and veRL, and DGPO's released rollout code) talk to retrieval through
`POST /retrieve` with `{"queries": [...], "topk": 3, "return_scores": true}`
and read `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`.
Serving that exact shape lets their clients use our indexes and our
`HttpRetriever` use theirs. Two deliberate differences from their FastAPI
server: `return_scores: false` works (theirs crashes on the dense path) and
returns the bare corpus rows, and every request is bounded (body size, query
count and length, topk) because this runs on a laptop next to private notes.

The server binds 127.0.0.1 by default. Web pages the user opens must not use
it (`http_checks`): while bound to loopback it refuses requests whose `Host`
names anything but this machine (DNS rebinding, 403), it refuses requests with
a foreign `Origin` (403), and a body must be declared `application/json` (415),
which a page cannot send cross-origin without a preflight.

Slow or idle clients are bounded too (`bounded`): a whole request, headers and
body, must arrive within `request_timeout` seconds (408, or a silent close for
a connection that sent nothing), at most `max_threads` handler threads run,
at most `max_pending` further connections wait for one, and the rest are
answered 503 at once.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import re
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from ..errors import InputError
from ..protocol import Passage
from ..termtext import not_utf8
from .base import Retriever
from .bounded import DeadlineReader, HandlerPool, Lingerer
from .http_checks import host_problem, is_loopback, json_type_problem, origin_problem

logger = logging.getLogger(__name__)

JSON_TYPE = "application/json; charset=utf-8"
_MAX_ERROR_CHARS = 200


@dataclass(frozen=True)
class Limits:
    """Bounds on one request; every one of them is a 4xx when exceeded."""

    default_topk: int = 3
    max_queries: int = 256
    max_topk: int = 100
    max_body_bytes: int = 1_000_000
    max_query_chars: int = 2000

    def __post_init__(self) -> None:
        for name in ("max_queries", "max_topk", "max_body_bytes", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(f"default_topk must be in 1..{self.max_topk}, got {self.default_topk}")


class ClientError(Exception):
    """A request the client got wrong: answered with `status` and a JSON error."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass(frozen=True)
class RetrieveRequest:
    """A validated `/retrieve` body."""

    queries: list[str]
    topk: int
    return_scores: bool


# --- request validation (pure functions, easy to test and to reuse) ----------------

def parse_retrieve_body(body: bytes, limits: Limits) -> RetrieveRequest:
    """Decode and validate a `/retrieve` body; ClientError(400) says what is wrong.

    Types are checked strictly (no "3" for 3, no 1 for true): a client that
    sends the wrong type has a bug worth hearing about, and silently coercing
    would make our server accept what Search-R1's clients never send.
    Empty query strings are allowed: a model can emit `<search></search>`, and
    one such query must not fail the whole rollout batch.
    """
    data = _decode_json(body)
    if not isinstance(data, dict):
        raise ClientError(400, "the body must be a JSON object with a 'queries' list")
    return RetrieveRequest(_check_queries(data.get("queries"), limits),
                           _check_topk(data.get("topk"), limits),
                           _check_return_scores(data.get("return_scores", False)))


def _decode_json(body: bytes) -> Any:
    """JSON from UTF-8 bytes; deep nesting, huge integers and bad bytes are client errors too."""
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise ClientError(400, "the body is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise ClientError(400, f"malformed JSON: {e}") from None
    except ValueError:  # Python's int-string limit, raised while parsing a long integer
        raise ClientError(400, f"malformed JSON: an integer has more than {sys.get_int_max_str_digits()} "
                               "digits") from None
    except RecursionError:
        raise ClientError(400, "malformed JSON: nested too deeply") from None


def _check_queries(queries: Any, limits: Limits) -> list[str]:
    if queries is None:
        raise ClientError(400, "missing 'queries' (a list of strings)")
    if not isinstance(queries, list):
        raise ClientError(400, f"'queries' must be a list of strings, not {_json_type(queries)}")
    if not queries:
        raise ClientError(400, "'queries' is empty")
    if len(queries) > limits.max_queries:
        raise ClientError(400, f"too many queries: {len(queries)} > {limits.max_queries}; "
                               "send them in smaller batches")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise ClientError(400, f"queries[{i}] must be a string, not {_json_type(q)}")
        if len(q) > limits.max_query_chars:
            raise ClientError(400, f"queries[{i}] is too long: {len(q)} > {limits.max_query_chars} characters")
        check_unicode(q, f"queries[{i}]")
    return queries


def check_unicode(text: str, name: str) -> None:
    """Refuse JSON's `\\ud800` escapes that decode to a lone surrogate: no encoder can take one."""
    if bad := not_utf8(text):
        raise ClientError(400, f"{name} is not valid Unicode text: {bad}")


def _check_topk(topk: Any, limits: Limits) -> int:
    if topk is None:
        return limits.default_topk
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise ClientError(400, f"'topk' must be an integer, not {_json_type(topk)}")
    if not 1 <= topk <= limits.max_topk:
        raise ClientError(400, f"'topk' must be in 1..{limits.max_topk}, got {topk}")
    return topk


def _check_return_scores(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ClientError(400, f"'return_scores' must be true or false, not {_json_type(value)}")
    return value


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


# --- responses -----------------------------------------------------------------------

def result_json(results: Sequence[Sequence[Passage]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's response body for per-query passage lists.

    With scores: `{"document": {"id", "contents"}, "score"}` per hit; without:
    the bare corpus row `{"id", "contents"}`, which is what Search-R1's dense
    path holds before it pairs rows with scores. A missing or non-finite score
    becomes null, keeping the body strict JSON.
    """
    def row(p: Passage) -> dict[str, str]:
        return {"id": p.id, "contents": p.contents}

    def scored(p: Passage) -> dict[str, Any]:
        score = p.score if p.score is not None and math.isfinite(p.score) else None
        return {"document": row(p), "score": None if score is None else float(score)}

    item = scored if return_scores else row
    return {"result": [[item(p) for p in hits] for hits in results]}


def _short(e: BaseException) -> str:
    """`Type: message`, cut to a line a client can show (the traceback is logged)."""
    text = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS - 3] + "..."


# --- the server ------------------------------------------------------------------------

class RetrievalServer(HTTPServer):
    """An HTTPServer that owns the retriever, the limits, the handler pool and the lock.

    Connections are handled by a `HandlerPool` of daemon threads (a client
    stuck mid-request never blocks shutdown); when it is full, the accepting
    thread answers 503 itself. The retriever is called under one lock unless
    it declares `thread_safe = True`: FAISS searches and SQLite connections are
    not all safe to share, and a serialised search is slower, never wrong.
    """

    # socketserver's default listen backlog is 5: a rollout batch of 20+ workers
    # connecting at once then sees connection resets.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], retriever: Retriever, limits: Limits,
                 log: Callable[[str], None] | None, request_timeout: float,
                 max_threads: int = 32, max_pending: int = 64):
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be > 0, got {request_timeout}")
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.retriever = retriever
        self.limits = limits
        self.log = log
        self.request_timeout = request_timeout
        self._search_lock = None if getattr(retriever, "thread_safe", False) else threading.Lock()
        self._pool = HandlerPool(self._handle, max_threads, max_pending, name="retrieval")
        self._lingerer = Lingerer()
        super().__init__(address, RetrieveHandler)
        self.loopback_only = is_loopback(self.server_address[0])

    @property
    def url(self) -> str:
        """Base URL clients should use, e.g. `http://127.0.0.1:8000`."""
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def search(self, request: RetrieveRequest) -> list[list[Passage]]:
        """Run the retriever (serialised when needed) and check what it returned."""
        if self._search_lock is None:
            results = self.retriever.search(request.queries, request.topk)
        else:
            with self._search_lock:
                results = self.retriever.search(request.queries, request.topk)
        if len(results) != len(request.queries):
            raise RuntimeError(f"retriever returned {len(results)} result lists "
                               f"for {len(request.queries)} queries")
        return [list(hits)[:request.topk] for hits in results]

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse-DNS lookup of the host, which can
        stall for seconds on an offline laptop."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def passage_count(self) -> int | None:
        """How many passages the retriever searches, when it can say."""
        for obj in (self.retriever, getattr(self.retriever, "store", None)):
            try:
                return len(obj)  # type: ignore[arg-type]
            except TypeError:
                continue
        return None

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hand the connection to a pool thread, or answer 503 now when none is free or waiting."""
        if not self._pool.submit((request, client_address)):
            self._refuse_busy(request)

    def _handle(self, item: tuple[Any, Any]) -> None:
        """One connection on a pool thread, as ThreadingMixIn's thread would do it."""
        request, client_address = item
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - socketserver's contract: report, then close
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def _refuse_busy(self, sock: socket.socket) -> None:
        """A 503 on the accepting thread, which never waits on the client: the
        answer fits the empty send buffer, and the socket is closed by `_lingerer`."""
        pool = self._pool
        body = json.dumps({"error": f"the server is busy ({pool.max_threads} requests in progress, "
                                    f"{pool.max_pending} waiting); retry shortly"}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {JSON_TYPE}\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
        try:
            sock.settimeout(0.5)
            sock.sendall(head.encode() + body)
        except OSError:
            pass  # the client is gone or stalled; the socket is closed next either way
        self._lingerer.add(sock)

    def service_actions(self) -> None:
        """Called by `serve_forever` between requests: close refused sockets whose time is up."""
        super().service_actions()
        self._lingerer.poll()

    def server_close(self) -> None:
        """Close the listening socket and the connections still waiting for a thread."""
        super().server_close()
        self._lingerer.close_all()
        for request, _ in self._pool.close():
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log unexpected handler failures instead of printing to stderr.

        A client that hangs up mid-response is routine, not worth a traceback.
        """
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)


class RetrieveHandler(BaseHTTPRequestHandler):
    """Routes `POST /retrieve` and `GET /health`; every answer is JSON."""

    server: RetrievalServer
    protocol_version = "HTTP/1.1"  # keep-alive for clients that reuse connections
    server_version = "dgpo-edge-retrieval"
    routes = {"/retrieve": "POST", "/health": "GET"}

    def setup(self) -> None:
        """Reads share one deadline per request, so a slow or silent client cannot pin a thread."""
        self.timeout = self.server.request_timeout  # bounds each write of an answer
        super().setup()
        self.rfile.close()
        self.rfile = DeadlineReader(self.connection, self.timeout)  # type: ignore[assignment]

    def handle_one_request(self) -> None:
        """One request within `request_timeout`; 408 when it started but did not finish in time.

        The stdlib catches the timeout of a request line or header read and just
        closes; a client that sent part of a request is told why. A connection
        that sent nothing (idle keep-alive, a half-open socket) is closed silently.
        """
        reader: DeadlineReader = self.rfile  # type: ignore[assignment]
        reader.start(self.server.request_timeout)
        self._answered = False
        self.command, self.requestline, self.request_version = "", "", self.protocol_version
        super().handle_one_request()
        if reader.expired and reader.started and not self._answered:
            self.send_error(408, f"the request did not arrive within {self.server.request_timeout:g} s")

    # One entry point per method: the router decides 404/405.
    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_OPTIONS(self) -> None:
        self._route("OPTIONS")

    def _route(self, method: str) -> None:
        """Dispatch, turning ClientError into its status and anything else into 500."""
        self._body_read = False
        try:
            self._refuse_web_pages()
            path = self.path.split("?", 1)[0]
            allowed = self.routes.get(path)
            if allowed is None:
                raise ClientError(404, f"no such endpoint {path!r}; use POST /retrieve or GET /health")
            if method != allowed and not (method == "HEAD" and allowed == "GET"):
                raise ClientError(405, f"{path} accepts {allowed}, not {method}", {"Allow": allowed})
            if path == "/retrieve":
                self._retrieve()
            else:
                self._health()
        except ClientError as e:
            if self._has_unread_body():
                self._abandon_input()  # e.g. a 404 for a POST: its body must not become a "request"
            self._send_error_json(e.status, e.message, e.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left; nobody to answer
        except Exception as e:  # noqa: BLE001 - a server error must still get a JSON answer
            logger.exception("retrieval request failed: %s %s", method, self.path)
            if self._has_unread_body():
                self._abandon_input()
            self._send_error_json(500, f"retrieval failed: {_short(e)}")

    def _refuse_web_pages(self) -> None:
        """Refuse requests made by web pages: a rebound DNS name or a foreign Origin."""
        problem = host_problem(self.headers.get("Host"), self.server.loopback_only) \
            or origin_problem(self.headers.get("Origin"))
        if problem:
            raise ClientError(*problem)

    def _retrieve(self) -> None:
        body = self._read_body()
        request = parse_retrieve_body(body, self.server.limits)
        results = self.server.search(request)
        self._send_json(200, result_json(results, request.return_scores))

    def _health(self) -> None:
        limits = self.server.limits
        info: dict[str, Any] = {"status": "ok"}
        count = self.server.passage_count()
        if count is not None:
            info["passages"] = count
        info.update(retriever=type(self.server.retriever).__name__, default_topk=limits.default_topk,
                    max_topk=limits.max_topk, max_queries=limits.max_queries)
        self._send_json(200, info)

    def _read_body(self) -> bytes:
        """The request body, refusing before reading when it cannot be acceptable.

        Content-Length is checked against the limit first, so an oversized body
        is answered with 413 without reading it (the connection is then closed,
        since the unread rest would otherwise be parsed as the next request).
        A body shorter than announced is a 400 when the client closes, a 408
        when it goes silent; chunked bodies are refused (Search-R1's clients, via
        `requests.post(json=...)`, always send Content-Length).
        """
        self._check_content_type()
        length = self._content_length()
        try:
            data = self.rfile.read(length) if length else b""
        except TimeoutError:
            self._abandon_input()
            raise ClientError(408, f"the request did not arrive within {self.server.request_timeout:g} s "
                                   "(headers and body)") from None
        self._body_read = True
        if len(data) < length:
            self.close_connection = True
            raise ClientError(400, f"the body ended after {len(data)} of {length} bytes")
        return data

    def _check_content_type(self) -> None:
        problem = json_type_problem(self.headers.get("Content-Type"))
        if problem:
            self._abandon_input()
            raise ClientError(*problem)

    def _content_length(self) -> int:
        limit = self.server.limits.max_body_bytes
        raw = self.headers.get("Content-Length")
        if raw is None or self.headers.get("Transfer-Encoding"):
            self._abandon_input()
            raise ClientError(411, "a Content-Length header is required (chunked bodies are not accepted)")
        # ASCII digits only (str.isdigit takes "²", which int() refuses), few enough for int()
        if not re.fullmatch(r"[0-9]{1,18}", raw.strip()):
            self._abandon_input()
            raise ClientError(400, f"bad Content-Length {raw[:40]!r}")
        length = int(raw)
        if length > limit:
            self._abandon_input()
            raise ClientError(413, f"the body is {length} bytes; the limit is {limit}")
        return length

    def _has_unread_body(self) -> bool:
        """Whether the request announced a body that has not been read."""
        if self._body_read:
            return False
        return bool(self.headers.get("Transfer-Encoding")) or \
            self.headers.get("Content-Length", "0").strip() not in ("", "0")

    def _abandon_input(self) -> None:
        """Mark the rest of the request as unread: answer, then close (lingering)."""
        self.close_connection = True
        self._unread_input = True

    def finish(self) -> None:
        """After answering without reading the body, close gently.

        Closing a socket with unread input makes the kernel send a reset, which
        can destroy our 413/411 answer in the client's buffers before it reads
        it. So: send our FIN first, then discard what the client is still
        sending for a bounded time and amount, as web servers' "lingering
        close" does, and only then close.
        """
        super().finish()
        if getattr(self, "_unread_input", False):
            _linger(self.connection)

    # --- writing ---------------------------------------------------------------------

    def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8")
        self._answered = True
        self.send_response(status)
        self.send_header("Content-Type", JSON_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error_json(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        try:
            self._send_json(status, {"error": message}, headers)
        except OSError:
            self.close_connection = True  # the client is gone

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """JSON instead of the stdlib's HTML page, for protocol-level errors too.

        `BaseHTTPRequestHandler` calls this for a malformed request line, headers
        that are too long, or an unknown method; clients then still get JSON.
        """
        self._abandon_input()
        if not hasattr(self, "command") or self.command is None:
            self.command = ""  # the request line never parsed
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        self._send_error_json(code, message or explain or phrase)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Access and protocol logs go to `log` when given; quiet otherwise."""
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} - {format % args}")


def _linger(sock: socket.socket, seconds: float = 1.0, max_bytes: int = 1 << 20) -> None:
    """Half-close `sock` and drain its input until EOF, `seconds` or `max_bytes`."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(seconds)
        drained = 0
        while drained < max_bytes:
            chunk = sock.recv(65536)
            if not chunk:
                break
            drained += len(chunk)
    except OSError:
        pass  # timed out or reset: the socket is closed next either way


def make_server(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000,
                default_topk: int = 3, max_queries: int = 256, max_topk: int = 100,
                max_body_bytes: int = 1_000_000, max_query_chars: int = 2000, *,
                log: Callable[[str], None] | None = None, request_timeout: float = 10.0,
                max_threads: int = 32, max_pending: int = 64) -> RetrievalServer:
    """A bound, not yet serving, Search-R1-compatible server (port 0 picks a free one).

    Call `serve_forever()` (in a thread, for tests) and `shutdown()` plus
    `server_close()` to stop; `.url` gives the base URL. `log(line)` receives
    access lines; server errors always go to the `logging` module as well.
    `request_timeout` bounds the arrival of each whole request (and each write
    of an answer); `max_threads` and `max_pending` bound the connections
    handled and waiting (see the module docstring). Bad values raise
    ValueError; a failed bind raises the socket's OSError.
    """
    limits = Limits(default_topk, max_queries, max_topk, max_body_bytes, max_query_chars)
    return RetrievalServer((host, port), retriever, limits, log, request_timeout, max_threads, max_pending)


def serve(retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Serve until Ctrl-C or SIGTERM, printing the bound address first (the port when 0 was asked).

    SIGINT is left as the process got it: a server started in the background by a script inherits
    an ignored SIGINT (so the terminal's Ctrl-C for the foreground job does not stop it); SIGTERM,
    what `kill`, systemd and `docker stop` send, stops it the same clean way (unless the process
    was started with SIGTERM ignored too).

    The retriever is left open: whoever made it closes it. A host or port that
    cannot be bound is an InputError (one `error:` line from the CLI).
    """
    try:
        server = make_server(retriever, host, port, **options)
    except (OSError, OverflowError) as e:
        raise InputError(bind_error_message(e, host, port)) from None
    print(f"Serving POST {server.url}/retrieve (Ctrl-C stops)", flush=True)
    if not server.loopback_only:
        print(f"warning: bound to {host}, reachable from other machines", flush=True)
    try:
        with _sigterm_interrupts():
            server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", flush=True)
    finally:
        server.server_close()


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt as Ctrl-C does (main thread only: Python
    runs signal handlers there, and a server run in a thread is stopped by `shutdown()`). A SIGTERM
    the process was started with ignored stays ignored, as SIGINT does."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def bind_error_message(e: OSError | OverflowError, host: str, port: int) -> str:
    """Why `host:port` cannot be listened on, in the user's terms."""
    where = f"cannot listen on {host}:{port}"
    if isinstance(e, OverflowError):
        return f"{where}: the port must be in 0..65535"
    if isinstance(e, socket.gaierror):
        return f"{where}: the host name does not resolve ({e.strerror})"
    reasons = {errno.EADDRINUSE: "the port is in use (choose another --port, or 0 for a free one)",
               errno.EADDRNOTAVAIL: "that address is not one of this machine's",
               errno.EACCES: "permission denied (ports below 1024 need privileges)"}
    return f"{where}: {reasons.get(e.errno or 0, e.strerror or str(e))}"
