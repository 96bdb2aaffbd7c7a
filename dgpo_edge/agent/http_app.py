"""`dgpo-edge serve`: the agent behind an OpenAI-compatible HTTP API (Starlette + uvicorn).

Routes: `POST /v1/chat/completions` (plain, or `stream: true` server-sent
events ending in `data: [DONE]`), `GET /v1/models`, Search-R1's `POST /retrieve`
over the same index, and `GET /health`.

Concurrency: an `AgentPool` of N engines, each lent to one request at a time,
so no two requests share a KV cache; up to `max_waiting` more requests queue
for a free engine, and beyond that (or after waiting `timeout` seconds) the
answer is 503 with Retry-After. The blocking agent runs in a thread of a
pool sized for every engine and waiter, never on the event loop.

Hardening, as for `index serve`: loopback by default, and while bound to
loopback a Host header that is not local is refused (403: DNS rebinding);
bodies must be `Content-Type: application/json` (415) and at most
`max_body_bytes` (413), read within `body_timeout`; every question ends within
`timeout` seconds (the agent's own deadline); errors are JSON in OpenAI's
shape, never tracebacks: an unexpected failure is logged in one line and
answered 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..retrieval.http_checks import host_problem, json_type_problem, origin_problem
from ..retrieval.server import ClientError, Limits, _decode_json, parse_retrieve_body, result_json
from .openai_format import (ChatRequest, Trace, chunk_json, completion_json, error_json, extra_json,
                            parse_chat_request, sse, usage_json)
from .pool import AgentPool, Busy

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeLimits:
    """Bounds on requests (each a 4xx/503 when exceeded) and the time one may take."""

    max_body_bytes: int = 1_000_000
    body_timeout: float = 30.0
    timeout: float = 300.0          # seconds a question may take, queueing included
    retrieve: Limits = Limits()


def make_app(pool: AgentPool, model_name: str = "dgpo-edge", limits: ServeLimits = ServeLimits(),
             local_only: bool = True) -> Any:
    """The Starlette app; `local_only` refuses Host headers that do not name this machine."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    api = _Api(pool, model_name, limits, local_only)
    routes = [Route("/v1/chat/completions", api.chat, methods=["POST"]),
              Route("/v1/models", api.models, methods=["GET"]),
              Route("/retrieve", api.retrieve, methods=["POST"]),
              Route("/health", api.health, methods=["GET"])]

    async def http_error(request: Any, exc: HTTPException) -> Any:  # 404, 405 from the router
        return _json(error_json(exc.status_code, str(exc.detail)), exc.status_code, exc.headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        api.shutdown()

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.api = api
    return app


def _json(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status, headers=headers)


def _guarded(handler: Callable) -> Callable:
    """Host and Origin checks first (the retrieval server's rules, retrieval/http_checks.py);
    ClientError → its 4xx, Busy → 503, anything else → one log line and 500."""

    async def wrapper(self: _Api, request: Any) -> Any:
        try:
            problem = (host_problem(request.headers.get("host", ""), self.local_only)
                       or origin_problem(request.headers.get("origin")))
            if problem:
                raise ClientError(*problem)
            return await handler(self, request)
        except ClientError as e:
            return _json(error_json(e.status, e.message), e.status, e.headers)
        except Busy as e:
            return _json(error_json(503, f"busy: {e}; retry later"), 503, {"Retry-After": "5"})
        except Exception as e:  # noqa: BLE001 - the client gets JSON, the log gets the cause
            logger.error("%s %s failed: %s: %s", request.method, request.url.path, type(e).__name__, e)
            return _json(error_json(500, f"internal error: {type(e).__name__}"), 500)

    return wrapper


class _Api:
    def __init__(self, pool: AgentPool, model_name: str, limits: ServeLimits, local_only: bool):
        self.pool, self.model_name, self.limits, self.local_only = pool, model_name, limits, local_only
        workers = 2 * len(pool.agents) + pool.max_waiting + 4  # runs, waiters, stream drivers, /retrieve
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dgpo-serve")
        self.created = int(time.time())
        self._stops: set[threading.Event] = set()  # one per running question, set on shutdown

    def stop_all(self) -> None:
        """Stop every running question at its next token and refuse new ones: Ctrl-C waits for no answer."""
        self.pool.drain()
        for stop in list(self._stops):
            stop.set()

    def shutdown(self) -> None:
        """After the last response: wait for the (stopped) questions, so no engine is closed mid-token."""
        self.stop_all()
        self.executor.shutdown(wait=True, cancel_futures=True)

    def _run_question(self, agent: Any, question: str, stop: threading.Event, put: Callable) -> None:
        """Run one question on a lent agent (in a worker thread), handing each event to `put`;
        then give the agent back, whatever happened."""
        self._stops.add(stop)
        if self.pool.closing:  # lent just before Ctrl-C: stop_all did not see this question
            stop.set()
        try:
            for event in agent.run(question, stop):
                put(event)
        finally:
            self._stops.discard(stop)
            self.pool.release(agent)

    async def _run(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _body(self, request: Any) -> bytes:
        """The raw body: JSON content type, bounded size, read within the body timeout."""
        problem = json_type_problem(request.headers.get("content-type"))
        if problem:
            raise ClientError(*problem)
        limit = self.limits.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise ClientError(413, f"the body is larger than {limit:,} bytes")

        async def read() -> bytes:
            body = bytearray()
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise ClientError(413, f"the body is larger than {limit:,} bytes")
            return bytes(body)

        try:
            data = await asyncio.wait_for(read(), self.limits.body_timeout)
        except asyncio.TimeoutError:
            raise ClientError(408, f"the body took longer than {self.limits.body_timeout:g} s") from None
        return data

    # --- routes ------------------------------------------------------------------------------------
    @_guarded
    async def models(self, request: Any) -> Any:
        model = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "dgpo-edge"}
        return _json({"object": "list", "data": [model]})

    @_guarded
    async def health(self, request: Any) -> Any:
        return _json({"status": "ok", **self.pool.stats()})

    @_guarded
    async def retrieve(self, request: Any) -> Any:
        req = parse_retrieve_body(await self._body(request), self.limits.retrieve)
        hits = await self._run(self.pool.retriever.search, req.queries, req.topk)
        return _json(result_json(hits, req.return_scores))

    @_guarded
    async def chat(self, request: Any) -> Any:
        req = parse_chat_request(_decode_json(await self._body(request)))
        agent = await self._run(self.pool.acquire, self.limits.timeout)
        try:
            _set_sampling(agent, req)
        except BaseException:
            self.pool.release(agent)
            raise
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            return self._stream(agent, req, cid, created)
        trace = Trace()
        await self._run(self._run_question, agent, req.question, threading.Event(), trace.add)
        if trace.error is not None:
            return _json(error_json(500, trace.error), 500)
        return _json(completion_json(trace, cid, created, self.model_name))

    def _stream(self, agent: Any, req: ChatRequest, cid: str, created: int) -> Any:
        from starlette.responses import StreamingResponse

        events: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        loop = asyncio.get_running_loop()

        def put(item: Any) -> None:  # from the worker thread onto the loop's queue
            with contextlib.suppress(RuntimeError):  # the loop closed under us (shutdown)
                loop.call_soon_threadsafe(events.put_nowait, item)

        def drive() -> None:
            try:
                self._run_question(agent, req.question, stop, put)
            except Exception as e:  # noqa: BLE001 - the stream then ends with an error event
                logger.error("streamed question failed: %s: %s", type(e).__name__, e)
            finally:
                put(None)

        # started now, not when the body is first read: the agent goes back to the pool even if
        # the client is gone before the first byte (`stop`, set when the stream closes, ends it early)
        self.executor.submit(drive)
        chunks = self._chunks(events, stop, req, cid, created)
        return StreamingResponse(chunks, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def _chunks(self, events: asyncio.Queue, stop: threading.Event, req: ChatRequest, cid: str,
                      created: int) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
            return sse(chunk_json(cid, created, self.model_name, delta, finish, **extra))

        trace = Trace()
        try:
            yield chunk({"role": "assistant", "content": ""})
            while (event := await events.get()) is not None:
                if text := trace.add(event):
                    yield chunk({"reasoning_content": text})
            if trace.end is None or trace.error is not None:
                yield sse(error_json(500, trace.error or "internal error: the agent stopped without a result"))
            else:
                if trace.result.answer:
                    yield chunk({"content": trace.result.answer})
                yield chunk({}, trace.finish_reason, dgpo_edge=extra_json(trace))
                if req.include_usage:
                    yield sse({**chunk_json(cid, created, self.model_name, {}), "choices": [],
                               "usage": usage_json(trace.result)})
            yield sse("[DONE]")
        except Exception as e:  # noqa: BLE001 - the client gets an error event, the log one line
            logger.error("stream failed: %s: %s", type(e).__name__, e)
            yield sse(error_json(500, f"internal error: {type(e).__name__}"))
            yield sse("[DONE]")
        finally:
            stop.set()


def _set_sampling(agent: Any, req: ChatRequest) -> None:
    from ..engines.base import GREEDY, Sampling

    agent.sampling = Sampling(temperature=req.temperature, seed=req.seed) if req.temperature > 0 else GREEDY


# --- running it ------------------------------------------------------------------------------------------

def make_server(app: Any, host: str = "127.0.0.1", port: int = 8080) -> Any:
    """A uvicorn server for `app` (quiet: warnings only, no access log, no Server header).

    Ctrl-C stops the running questions first, so their requests end (finish_reason
    "length", stop_reason "stopped") within uvicorn's graceful shutdown.
    """
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.api.stop_all()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            server_header=False, timeout_keep_alive=5, lifespan="on",
                            timeout_graceful_shutdown=10)
    return Server(config)


def listen(host: str = "127.0.0.1", port: int = 8080) -> socket.socket:
    """A listening socket, bound before the model loads so a taken port fails fast (InputError)."""
    try:
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                    reuse_port=False)
    except OSError as e:
        raise InputError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
