"""The web view's connections: one thread reads every request head and writes every response, a fixed pool of
workers computes the answers. No thread per connection, no read without a deadline.

How a connection goes (every number a field of ``Limits``, its default below, documented in README "The web view"):

1. **Accepted** by the loop (one thread, ``selectors``: epoll on Linux) from a listen backlog of ``BACKLOG``
   (1,024; the kernel caps it at ``net.core.somaxconn``). With ``max_connections`` (2,048) open already, it is
   answered ``503`` with ``Retry-After`` at once and closed: open connections, and so file descriptors and buffers,
   stay bounded.
2. **Its head is read** (request line and headers, up to the blank line) without blocking, whatever its pace, until
   ``header_timeout_s`` (10 s) after it was accepted; then it is answered ``408`` and closed. A request line over
   ``MAX_REQUEST_LINE`` bytes is a ``414``, a head over ``MAX_HEAD_BYTES`` a ``431``. A client that sends nothing, or
   one byte a second, holds a socket and at most ``MAX_HEAD_BYTES`` of memory until then, never a thread.
3. **Queued** for the workers (``workers`` threads, 8): a complete head waits in a queue of at most ``queue``
   (256) heads; with the queue full it is answered ``503`` with ``Retry-After: 1`` at once.
4. **Answered** by a worker (``handle(head, client) -> bytes``, in memory), then **written** by the loop without
   blocking. The whole response must be written within ``response_timeout_s`` (30 s) of the accept, else the
   connection is closed (a request still queued or computed then is answered ``503``): a client that reads slowly
   holds a socket and its response's bytes, not a worker.
5. **Stopped** (``run`` returns): the listening socket is closed at once (new connections are refused), connections
   that sent nothing are closed, the others have ``stop_grace_s`` (3 s) to finish their request, then are closed.
   Workers are daemon threads: one still computing after the grace does not keep the process alive.

Every connection is HTTP/1.0 (one request, then closed). The 408/414/431/503 the loop writes itself are plain
text, with the headers the caller gives (the security headers).
"""

from __future__ import annotations

import contextlib
import queue
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import structlog

log = structlog.get_logger("tracker.ui")

BACKLOG = 1_024  # the listen backlog: a burst of connections the loop has not accepted yet waits here
MAX_REQUEST_LINE = 65_536  # http.server's own limit on the request line (a longer one is a 414)
MAX_HEAD_BYTES = MAX_REQUEST_LINE + 16_384  # the request line and every header (a longer head is a 431)
TICK_S = 0.1  # the loop looks at the deadlines (all connections) and the stop this often
ACCEPT_BATCH = 256  # connections accepted at most per readiness of the listening socket
ACCEPT_PAUSE_S = 0.25  # accepting pauses this long when the process is out of file descriptors
RETRY_AFTER_S = 1  # the Retry-After of a 503


@dataclass(frozen=True)
class Limits:
    """The bounds of the server (see the module docstring)."""

    workers: int = 8
    queue: int = 256
    max_connections: int = 2_048
    header_timeout_s: float = 10.0
    response_timeout_s: float = 30.0
    stop_grace_s: float = 3.0

    def __post_init__(self) -> None:
        for name in ("workers", "queue", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.header_timeout_s <= self.response_timeout_s:
            raise ValueError("0 < header_timeout_s <= response_timeout_s must hold")
        if self.stop_grace_s < 0:
            raise ValueError(f"stop_grace_s must be at least 0, got {self.stop_grace_s}")


Handle = Callable[[bytes, tuple[Any, ...]], bytes]


def plain(status: HTTPStatus, text: str, headers: Iterable[tuple[str, str]] = ()) -> bytes:
    """A whole HTTP/1.0 response of plain text."""
    body = (text + "\n").encode()
    lines = [f"HTTP/1.0 {status.value} {status.phrase}", "Server: tracker-ui", "Connection: close",
             "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}",
             *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    client: tuple[Any, ...]
    accepted: float
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    state: str = "reading"  # reading -> queued (a worker has it) -> writing -> closed
    out: memoryview | None = None


class ConnectionLoop:
    """Listens on ``host:port`` (``address``), then ``run(stop)`` serves until ``stop`` is set."""

    def __init__(self, host: str, port: int, handle: Handle, *, limits: Limits,
                 headers: Sequence[tuple[str, str]] = ()) -> None:
        self.limits = limits
        self.handle = handle
        self.headers = tuple(headers)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.create_server((host, port), family=family, backlog=BACKLOG, reuse_port=False)
        self.listener.setblocking(False)
        self.address: tuple[Any, ...] = self.listener.getsockname()
        self.conns: set[_Conn] = set()
        self.requests: queue.SimpleQueue[tuple[_Conn, bytes] | None] = queue.SimpleQueue()
        self.waiting = 0  # heads queued, not yet taken by a worker (only the loop adds; the count is guarded)
        self.lock = threading.Lock()
        self.done: deque[tuple[_Conn, bytes]] = deque()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.workers = [threading.Thread(target=self._work, name=f"ui-worker-{i}", daemon=True)
                        for i in range(limits.workers)]
        self.paused_until = 0.0

    # ------------------------------------------------------------------------------------------ the loop

    def run(self, stop: threading.Event) -> None:
        for worker in self.workers:
            worker.start()
        self.selector.register(self.listener, selectors.EVENT_READ, "listen")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        stop_by: float | None = None
        next_expiry = 0.0
        try:
            while True:
                now = time.monotonic()
                if stop_by is None and stop.is_set():
                    stop_by = now + self.limits.stop_grace_s
                    self._begin_stop(stop_by)
                if stop_by is not None and (not self.conns or now >= stop_by):
                    break
                if self.paused_until and now >= self.paused_until and stop_by is None:
                    self.paused_until = 0.0
                    self.selector.register(self.listener, selectors.EVENT_READ, "listen")
                for key, _mask in self.selector.select(TICK_S):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self.wake_r.recv(4096)
                    elif isinstance(key.data, _Conn):
                        self._ready(key.data)
                self._finish_answers()
                now = time.monotonic()
                if now >= next_expiry:  # a look at every connection, at most every TICK_S
                    next_expiry = now + TICK_S
                    self._expire(now)
        finally:
            self._close_all()

    def _begin_stop(self, stop_by: float) -> None:
        if not self.paused_until:
            self.selector.unregister(self.listener)
        self.listener.close()
        for conn in list(self.conns):
            if conn.state == "reading" and not conn.head:
                self._close(conn)  # idle: nothing in flight
            else:
                conn.deadline = min(conn.deadline, stop_by)

    def _close_all(self) -> None:
        for conn in list(self.conns):
            self._close(conn)
        if self.listener.fileno() >= 0:
            self.listener.close()
        for _ in self.workers:
            self.requests.put(None)
        self.selector.close()
        self.wake_r.close()
        self.wake_w.close()

    def join_workers(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` in all for the workers (daemons) to end, after ``run`` returned."""
        end = time.monotonic() + timeout_s
        for worker in self.workers:
            if worker.ident is not None:
                worker.join(max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------------------------------------ accepting

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, client = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE/ENFILE/ENOBUFS: leave the rest in the backlog a moment
                log.warning("ui_accept_failed", error=str(exc), open_connections=len(self.conns))
                self.selector.unregister(self.listener)
                self.paused_until = time.monotonic() + ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            if len(self.conns) >= self.limits.max_connections:
                self._refuse(sock, plain(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections; try again",
                                         (*self.headers, ("Retry-After", str(RETRY_AFTER_S)))))
                continue
            now = time.monotonic()
            conn = _Conn(sock, client, now, now + self.limits.header_timeout_s)
            self.conns.add(conn)
            self.selector.register(sock, selectors.EVENT_READ, conn)

    # ------------------------------------------------------------------------------------------ reading, writing

    def _ready(self, conn: _Conn) -> None:
        if conn.state == "reading":
            self._read(conn)
        elif conn.state == "writing":
            self._write(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(MAX_HEAD_BYTES + 1 - len(conn.head))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not chunk:
            self._close(conn)  # the client went away before its head was whole
            return
        start = max(0, len(conn.head) - 3)
        conn.head += chunk
        end = _head_end(conn.head, start)
        if end is None:
            if b"\n" not in conn.head and len(conn.head) > MAX_REQUEST_LINE:
                self._answer_now(conn, plain(HTTPStatus.REQUEST_URI_TOO_LONG,
                                             f"the request line is longer than {MAX_REQUEST_LINE:,} bytes",
                                             self.headers))
            elif len(conn.head) > MAX_HEAD_BYTES:
                self._answer_now(conn, plain(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                             f"the request's head is longer than {MAX_HEAD_BYTES:,} bytes",
                                             self.headers))
            return
        if self.waiting >= self.limits.queue:
            self._answer_now(conn, plain(HTTPStatus.SERVICE_UNAVAILABLE, "too busy; try again",
                                         (*self.headers, ("Retry-After", str(RETRY_AFTER_S)))))
            return
        conn.state = "queued"
        conn.deadline = conn.accepted + self.limits.response_timeout_s
        self.selector.unregister(conn.sock)
        with self.lock:
            self.waiting += 1
        self.requests.put((conn, bytes(conn.head[:end])))

    def _answer_now(self, conn: _Conn, response: bytes) -> None:
        """Write ``response`` (the loop's own, not a worker's) and close."""
        if conn.state == "reading":
            self.selector.unregister(conn.sock)
        conn.state = "writing"
        conn.out = memoryview(response)
        self.selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._close(conn)

    def _finish_answers(self) -> None:
        while self.done:
            conn, response = self.done.popleft()
            if conn.state == "queued":  # not cut at its deadline meanwhile
                self._answer_now(conn, response)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self.conns if c.deadline <= now]:
            if conn.state == "reading" and conn.head and now < conn.accepted + self.limits.header_timeout_s:
                self._close(conn)  # stopping: the grace is over
            elif conn.state == "reading":
                self._refuse(conn.sock, plain(HTTPStatus.REQUEST_TIMEOUT, "the request's head took longer than "
                                              f"{self.limits.header_timeout_s:g} s", self.headers), conn)
            elif conn.state == "queued":
                self._refuse(conn.sock, plain(HTTPStatus.SERVICE_UNAVAILABLE, "too busy; try again",
                                              (*self.headers, ("Retry-After", str(RETRY_AFTER_S)))), conn)
            else:  # writing: reset, so that what the kernel still holds of the response is not sent either
                with contextlib.suppress(OSError):
                    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self._close(conn)

    def _refuse(self, sock: socket.socket, response: bytes, conn: _Conn | None = None) -> None:
        """One non-blocking try to say why, then close."""
        with contextlib.suppress(OSError):
            sock.send(response)
        if conn is not None:
            self._close(conn)
        else:
            _close_socket(sock)

    def _close(self, conn: _Conn) -> None:
        if conn.state in ("reading", "writing"):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn.sock)
        conn.state = "closed"
        self.conns.discard(conn)
        _close_socket(conn.sock)

    # ------------------------------------------------------------------------------------------ the workers

    def _work(self) -> None:
        while (item := self.requests.get()) is not None:
            conn, head = item
            with self.lock:
                self.waiting -= 1
            try:
                response = self.handle(head, conn.client)
            except Exception:
                log.exception("ui_request_failed", client=str(conn.client[0]))
                response = plain(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error; see the server's log",
                                 self.headers)
            self.done.append((conn, response))
            with contextlib.suppress(OSError):  # full: the loop is awake already
                self.wake_w.send(b"\0")


def _head_end(head: bytearray, start: int) -> int | None:
    """Where the head ends (after its blank line), looking from ``start``; None if not yet."""
    found = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := head.find(sep, start)) >= 0]
    return min(found) if found else None


def _close_socket(sock: socket.socket) -> None:
    """Close ``sock``, first reading what the client sent unread (so that the close is a FIN, not a reset that
    could discard the response before the client reads it)."""
    with contextlib.suppress(OSError):
        sock.recv(65_536)
    with contextlib.suppress(OSError):
        sock.close()
