"""Bounds for a stdlib socketserver: time per request, handler threads, waiting connections.

`http.server` gives a socket one timeout per read, so a client that sends a
header byte every few seconds ("slow loris") holds its connection forever, and
`ThreadingMixIn` starts a thread per connection, so 3,000 silent connections
make 3,000 threads. `DeadlineReader` replaces the handler's `rfile` with one
whose reads together end at a deadline; `HandlerPool` runs handlers on at
most `max_threads` threads with at most `max_pending` connections waiting
(sockets, not threads) and tells its caller when both are full; `Lingerer`
closes the sockets of refused clients without a thread and without a reset.
"""

from __future__ import annotations

import math
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

_RECV_BYTES = 65536


class DeadlineReader:
    """The `rfile` of a handler: buffered socket reads that all end by one deadline.

    `start(seconds)` opens the window for the next request; a read that would
    go past it raises TimeoutError. Between reads the socket keeps
    `write_timeout`, which bounds the writes of the answer.
    """

    def __init__(self, sock: socket.socket, write_timeout: float | None):
        self._sock = sock
        self._write_timeout = write_timeout
        self._buf = bytearray()
        self._eof = False
        self.deadline = math.inf
        self.started = False  # some byte of the current request has arrived
        self.expired = False  # a read of the current request ran out of time
        self.closed = False

    def start(self, seconds: float) -> None:
        """Begin a request: it must arrive, headers and body, within `seconds` from now."""
        self.deadline = time.monotonic() + seconds
        self.started = bool(self._buf)  # a pipelined request already waiting
        self.expired = False

    def _fill(self) -> bool:
        """Receive more bytes into the buffer; False at end of input."""
        if self._eof:
            return False
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.expired = True
            raise TimeoutError("the request deadline passed")
        self._sock.settimeout(remaining)
        try:
            chunk = self._sock.recv(_RECV_BYTES)
        except TimeoutError:
            self.expired = True
            raise
        finally:
            self._sock.settimeout(self._write_timeout)
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        self.started = True
        return True

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def readline(self, limit: int = -1) -> bytes:
        """Up to and including the next newline, at most `limit` bytes, or what came before EOF."""
        scanned = 0
        while True:
            end = self._buf.find(b"\n", scanned)
            if end >= 0:
                n = end + 1
                break
            scanned = len(self._buf)
            if 0 <= limit <= len(self._buf) or not self._fill():
                n = len(self._buf)
                break
        return self._take(n if limit < 0 else min(n, limit))

    def read(self, n: int = -1) -> bytes:
        """`n` bytes, fewer only at EOF; everything up to EOF when `n` < 0."""
        while (n < 0 or len(self._buf) < n) and self._fill():
            pass
        return self._take(len(self._buf) if n < 0 else min(n, len(self._buf)))

    def close(self) -> None:
        """The socket is the handler's to close; this only drops the buffer."""
        self.closed = True
        self._buf.clear()


class HandlerPool:
    """Runs `work(item)` on at most `max_threads` daemon threads, `max_pending` items waiting.

    Threads start on demand and then stay; `submit` returns False, leaving the
    item to its caller, when `max_threads + max_pending` items are in hand.
    """

    def __init__(self, work: Callable[[Any], None], max_threads: int, max_pending: int,
                 name: str = "handler"):
        if max_threads < 1:
            raise ValueError(f"max_threads must be >= 1, got {max_threads}")
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}")
        self.max_threads, self.max_pending = max_threads, max_pending
        self._work, self._name = work, name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._in_hand = 0  # running + waiting
        self._closed = False

    def submit(self, item: Any) -> bool:
        """Queue `item` for a thread; False when the pool is full or closed."""
        with self._lock:
            if self._closed or self._in_hand >= self.max_threads + self.max_pending:
                return False
            self._in_hand += 1
            if self._threads < min(self._in_hand, self.max_threads):
                self._threads += 1
                threading.Thread(target=self._run, name=f"{self._name}-{self._threads}", daemon=True).start()
        self._queue.put(item)
        return True

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._work(item)
            finally:
                with self._lock:
                    self._in_hand -= 1

    def close(self) -> list[Any]:
        """Refuse new items, let threads end after their current one; return the items still waiting."""
        with self._lock:
            self._closed = True
            threads = self._threads
        waiting = []
        while True:
            try:
                waiting.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for _ in range(threads):
            self._queue.put(None)
        return [item for item in waiting if item is not None]


class Lingerer:
    """Closes answered sockets gently, without a thread per socket.

    Closing a socket whose client is still sending makes the kernel send a
    reset, which can destroy the answer before the client reads it (a client
    refused with 503 at connect time is usually mid-request). So `add` sends
    our FIN at once, and each `poll` (the server loop's idle hook) discards
    what has arrived and closes a socket at the client's EOF or after
    `seconds`. Past `limit` sockets waiting, a new one is closed at once.
    """

    def __init__(self, seconds: float = 1.0, limit: int = 256):
        self.seconds, self.limit = seconds, limit
        self._waiting: list[tuple[float, socket.socket]] = []

    def add(self, sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        if len(self._waiting) >= self.limit:
            sock.close()
        else:
            self._waiting.append((time.monotonic() + self.seconds, sock))

    def poll(self) -> None:
        now, keep = time.monotonic(), []
        for deadline, sock in self._waiting:
            if _drained(sock) or now >= deadline:
                sock.close()
            else:
                keep.append((deadline, sock))
        self._waiting = keep

    def close_all(self) -> None:
        for _, sock in self._waiting:
            sock.close()
        self._waiting = []


def _drained(sock: socket.socket, max_chunks: int = 16) -> bool:
    """Discard what a non-blocking socket has received; True once the client has closed.

    At most `max_chunks` reads per call, so a client streaming into a refused
    socket cannot hold the server loop.
    """
    try:
        for _ in range(max_chunks):
            if not sock.recv(_RECV_BYTES):
                return True  # EOF
    except BlockingIOError:
        return False  # nothing more for now
    except OSError:
        return True  # reset: nothing left to protect
    return False
