"""The web view under a busy or hostile client population: a fixed pool of workers whatever the connections (the
overflow a fast 503 with Retry-After), a client that drips its head or reads its response slowly cut at the
deadline whatever its pace, a burst of 100 concurrent GETs all accepted at once and served, and SIGTERM/SIGINT
stopping `tracker ui` within 5 s with idle and dripping clients connected."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.ui_support import NOW, build_index, running
from tracker.ui.connections import Limits
from tracker.ui.server import App, Response, allowed_hosts

REPO = Path(__file__).resolve().parents[2]
GET = b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_index(tmp_path_factory.mktemp("ui-load"))


class GatedApp(App):
    """An App whose answers wait for ``release`` (at most 30 s), counting the requests it is answering; its body
    ``body`` when given."""

    def __init__(self, index: Path, body: bytes | None = None) -> None:
        super().__init__(index=index, hosts=allowed_hosts("127.0.0.1", []), stuck_after="30m", clock=lambda: NOW)
        self.release = threading.Event()
        self.inside = 0
        self.lock = threading.Lock()
        self.body = body

    def respond(self, method: str, target: str, host: str | None) -> Response:
        with self.lock:
            self.inside += 1
        self.release.wait(30)
        return Response(200, self.body) if self.body is not None else super().respond(method, target, host)


def read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.02)


def ui_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ui-worker-")]


def test_the_worker_pool_is_bounded_and_the_overflow_is_a_fast_503(index: Path) -> None:
    """2 workers, a queue of 2: 30 clients dripping their head and 8 whole requests while the workers are held
    make 2 worker threads in all; 2 requests answered, 2 waiting, the 4 others a 503 with Retry-After at once."""
    app = GatedApp(index)
    before = threading.active_count()
    with running(index, app=app, limits=Limits(workers=2, queue=2, header_timeout_s=20, response_timeout_s=30)) \
            as srv:
        port = srv.server_address[1]
        drippers = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(30)]
        for conn in drippers:
            conn.sendall(b"GET / HT")
        whole = []
        for i in range(8):
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            conn.sendall(GET)
            whole.append(conn)
            if i < 2:
                wait_for(lambda n=i + 1: app.inside == n)  # type: ignore[misc]
            else:
                time.sleep(0.2)  # read by the loop in order
        assert len(ui_threads()) == 2
        assert threading.active_count() == before + 1 + 2  # the server's loop and its 2 workers, nothing per client
        started = time.monotonic()
        refused = [read_all(conn) for conn in whole[4:]]
        assert time.monotonic() - started < 2
        assert all(r.startswith(b"HTTP/1.0 503 ") and b"\r\nRetry-After: 1\r\n" in r for r in refused), refused
        assert app.inside == 2
        app.release.set()
        served = [read_all(conn) for conn in whole[:4]]
        assert all(r.startswith(b"HTTP/1.0 200 ") for r in served)
        assert app.inside == 4 and len(ui_threads()) == 2
        for conn in [*drippers, *whole]:
            conn.close()


def test_connections_beyond_the_cap_are_a_503_at_once_and_the_others_still_served(index: Path) -> None:
    """With max_connections open (idle), one more is answered 503 with Retry-After at once; once one closes, a
    request is a 200."""
    with running(index, limits=Limits(max_connections=3, header_timeout_s=20, response_timeout_s=30)) as srv:
        port = srv.server_address[1]
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        time.sleep(0.3)
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            refused = read_all(extra)
        assert time.monotonic() - started < 2
        assert refused.startswith(b"HTTP/1.0 503 ") and b"\r\nRetry-After: 1\r\n" in refused
        assert b"Content-Security-Policy: default-src 'none'" in refused
        held.pop().close()
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(GET)
            assert read_all(conn).startswith(b"HTTP/1.0 200 ")
        for conn in held:
            conn.close()


@pytest.mark.parametrize("option, value", [("--workers", "0"), ("--workers", "257"), ("--max-connections", "x")])
def test_a_bad_pool_option_is_a_usage_error(index: Path, option: str, value: str) -> None:
    """As argparse refuses a bad --port: the usage, then one line saying why; exit 2."""
    proc = subprocess.run([sys.executable, "-m", "tracker.cli", "ui", "--index", str(index), option, value],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1].startswith(f"tracker ui: error: argument {option}: must be a whole number "
                                                   "from 1 to") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("pace_s", [0.05, 0.4])
def test_a_dripping_client_is_cut_at_the_header_deadline_whatever_its_pace(index: Path, pace_s: float) -> None:
    """A client sending its head a byte at a time (never ending it) is answered 408 and closed at
    header_timeout_s after the accept, however often it sends."""
    with running(index, limits=Limits(header_timeout_s=1.5, response_timeout_s=5)) as srv:
        conn = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10)
        started = time.monotonic()
        conn.sendall(b"GET / HTTP/1.0\r\nX-Pad: ")
        reply = b""
        try:
            while time.monotonic() - started < 10:
                conn.sendall(b"a")
                time.sleep(pace_s)
        except OSError:
            pass
        took = time.monotonic() - started
        conn.settimeout(2)
        with contextlib.suppress(OSError):
            reply = read_all(conn)
        conn.close()
    assert 1.4 <= took < 1.5 + pace_s + 1.0, took
    assert reply == b"" or reply.startswith(b"HTTP/1.0 408 ")


def test_a_client_reading_its_response_slowly_is_cut_at_the_response_deadline(index: Path) -> None:
    """A client reading a 32 MiB answer a few bytes at a time is closed at response_timeout_s after the accept,
    with most of the answer unread: it held a socket and a buffer, not a worker, so others are answered meanwhile."""
    body = b"x" * (32 << 20)
    app = GatedApp(index, body=body)
    app.release.set()
    with running(index, app=app, limits=Limits(workers=1, header_timeout_s=1, response_timeout_s=2)) as srv:
        port = srv.server_address[1]
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.settimeout(10)
        conn.connect(("127.0.0.1", port))
        started = time.monotonic()
        conn.sendall(GET)
        got = 0
        try:
            while chunk := conn.recv(64):
                got += len(chunk)
                time.sleep(0.01)
                if time.monotonic() - started > 10:
                    break
        except OSError:
            pass
        took = time.monotonic() - started
        conn.close()
        other = socket.create_connection(("127.0.0.1", port), timeout=10)
        other.sendall(GET)
        assert read_all(other).startswith(b"HTTP/1.0 200 ")
        other.close()
    assert 1.9 <= took < 3.5, took
    assert got < len(body) // 2


def test_a_burst_of_100_concurrent_gets_is_accepted_at_once_and_all_served(index: Path) -> None:
    """100 clients connecting at the same instant: no connection waits for a SYN retransmission (the first is after
    1 s: the listen backlog holds them all), and every one is a 200 within 30 s."""
    with running(index) as srv:
        port = srv.server_address[1]
        gate = threading.Barrier(100)

        def one(_: int) -> tuple[float, float, bytes]:
            gate.wait(30)
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
                connected = time.monotonic() - started
                conn.sendall(GET)
                reply = read_all(conn)
            return connected, time.monotonic() - started, reply[:16]

        with ThreadPoolExecutor(100) as pool:
            results = list(pool.map(one, range(100)))
    assert all(reply.startswith(b"HTTP/1.0 200 ") for _, _, reply in results)
    assert max(connect for connect, _, _ in results) < 1.0, sorted(c for c, _, _ in results)[-5:]
    assert max(total for _, total, _ in results) < 30


def _tracker_ui(index: Path) -> tuple[subprocess.Popen[str], int]:
    env = {k: v for k, v in os.environ.items() if k != "TRACKER_INDEX"}
    proc = subprocess.Popen([sys.executable, "-m", "tracker.cli", "ui", "--index", str(index), "--port", "0"],
                            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "url=http://127.0.0.1:" in line:
            return proc, int(line.split("url=http://127.0.0.1:", 1)[1].split("/", 1)[0])
        assert line, f"the server ended before serving (rc={proc.poll()})"
    raise AssertionError("the server did not start within 60 s")


@pytest.fixture()
def dripping() -> Iterator[list[socket.socket]]:
    """Sockets a thread feeds one byte every 0.2 s (never ending their heads) until the test ends."""
    conns: list[socket.socket] = []
    done = threading.Event()

    def drip() -> None:
        while not done.wait(0.2):
            for conn in list(conns):
                try:
                    conn.send(b"a")
                except OSError:
                    conns.remove(conn)

    feeder = threading.Thread(target=drip, daemon=True)
    feeder.start()
    yield conns
    done.set()
    feeder.join(5)
    for conn in conns:
        conn.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_it_within_5_s_with_idle_and_dripping_clients(index: Path, signum: int,
                                                                     dripping: list[socket.socket]) -> None:
    proc, port = _tracker_ui(index)
    idle = []
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(50)]
        for _ in range(50):
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            conn.sendall(b"GET / HTTP/1.0\r\nX-Pad: ")
            dripping.append(conn)
        time.sleep(1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(GET)
            assert read_all(conn).startswith(b"HTTP/1.0 200 ")
        started = time.monotonic()
        proc.send_signal(signum)
        try:
            _, err = proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tracker ui did not stop within 5 s of {signal.Signals(signum).name}")
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for conn in idle:
            conn.close()
    assert proc.returncode == 0 and took < 5
    assert f"signal={signal.Signals(signum).name}" in err and "Traceback" not in err


def test_the_bounds_are_documented() -> None:
    readme = (REPO / "README.md").read_text()
    limits = Limits()
    for figure in (f"{limits.workers} workers", f"{limits.queue:,}", f"{limits.max_connections:,}",
                   f"{limits.header_timeout_s:g} s", f"{limits.response_timeout_s:g} s", f"{limits.stop_grace_s:g} s",
                   "--workers", "--max-connections", "Retry-After"):
        assert figure in readme, figure
