"""The web view (`tracker ui`) under a burst, with idle and with dripping clients connected, and its stop.

    uv run python bench/ui.py [--index PATH] [--burst 100] [--idle 500] [--dripping 1000] [--workers N]
                              [--settle 11]

Starts ``tracker ui`` as a subprocess (``--port 0``) on ``--index`` (default: the bundled demo captures replayed
into a temporary index by ``tracker replay``), once for each state:

- **quiet**: no other client;
- **idle**: ``--idle`` connections open that send nothing (the server cuts each at its 10 s head deadline; this
  script opens it again at once, so that as many stay open);
- **dripping**: ``--dripping`` connections that send their head one byte a second and never end it (cut at 10 s,
  opened again).

In each state, ``--settle`` seconds after opening those connections, it sends ``--burst`` concurrent GETs of ``/``
(all released at once by a barrier, each on its own connection), then as many of a run's page (the first run
``/`` links to), and prints per burst the statuses, latency (connect to the last byte) p50/p95/p99/max and
throughput (requests / the burst's wall time); then the
server's threads and RSS (``/proc/PID/status``: Threads, VmRSS, VmHWM), the clients it cut, and the time from
SIGTERM to its exit with those clients still connected, and its exit code.

Everything runs on this machine: the clients (one thread per burst request, one thread for the idle and dripping
connections) share its cores with the server, so the latencies include the client's own scheduling. The script
raises its own soft limit of open files (``resource.setrlimit(RLIMIT_NOFILE)``) up to the hard limit to hold the
connections; the server raises its own (``tracker ui`` does, for ``--max-connections``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # run as a script: bench/ui.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import REPO, load_average, tracker_command

DEMO = REPO / "tracker" / "captures" / "demo"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0  # a server that has not exited by then is killed and reported so
CLIENT_TIMEOUT_S = 60.0  # each burst request's socket timeout


def raise_open_files(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def start(index: Path, workers: int | None) -> tuple[subprocess.Popen[str], int]:
    extra = ["--workers", str(workers)] if workers else []
    env = {k: v for k, v in os.environ.items() if k != "TRACKER_INDEX"}
    proc = subprocess.Popen([*tracker_command(), "ui", "--index", str(index), "--port", "0", *extra], env=env,
                            text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if match := re.search(r"url=http://127\.0\.0\.1:(\d+)/", line):
            threading.Thread(target=lambda: proc.stderr.read() if proc.stderr else None, daemon=True).start()
            return proc, int(match.group(1))
        if not line:
            break
    proc.kill()
    raise SystemExit(f"tracker ui did not start (rc={proc.wait()})")


class Background:
    """``count`` connections kept open (opened again when the server cuts one); ``drip``: each sends one byte of
    a never-ending head every second."""

    def __init__(self, port: int, count: int, *, drip: bool) -> None:
        self.port, self.count, self.drip = port, count, drip
        self.selector = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.cut = 0
        self.failed_connects = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self) -> None:
        try:
            conn = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError:
            self.failed_connects += 1
            return
        conn.setblocking(False)
        if self.drip:
            with contextlib.suppress(OSError):
                conn.send(b"GET / HTTP/1.0\r\nX-Pad: ")
        self.selector.register(conn, selectors.EVENT_READ)

    def _close(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        conn.close()
        self.cut += 1

    def start(self) -> None:
        for _ in range(self.count):
            self._open()
        self.thread.start()

    def open_now(self) -> int:
        return len(self.selector.get_map())

    def _run(self) -> None:
        next_drip = time.monotonic() + 1
        while not self.stop.is_set():
            for key, _ in self.selector.select(0.2):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    data = conn.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._close(conn)
            if time.monotonic() >= next_drip and self.drip:
                next_drip += 1
                for key in list(self.selector.get_map().values()):
                    conn = key.fileobj
                    assert isinstance(conn, socket.socket)
                    try:
                        conn.send(b"a")
                    except OSError:
                        self._close(conn)
            while not self.stop.is_set() and self.open_now() < self.count:
                self._open()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self.selector.close()


def one_get(port: int, target: str, gate: threading.Barrier) -> tuple[int, float]:
    gate.wait(60)
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT_S) as conn:
            conn.sendall(f"GET {target} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
            chunks = []
            while chunk := conn.recv(1 << 20):
                chunks.append(chunk)
        reply = b"".join(chunks)
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else 0
    except OSError:
        status = -1
    return status, time.perf_counter() - started


def burst(port: int, target: str, n: int) -> str:
    gate = threading.Barrier(n)
    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda _: one_get(port, target, gate), range(n)))
    wall = time.perf_counter() - started
    lat = sorted(t * 1000 for _, t in results)
    statuses: dict[int, int] = {}
    for status, _ in results:
        statuses[status] = statuses.get(status, 0) + 1

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, round(p / 100 * len(lat) + 0.5) - 1)]

    shown = ", ".join(f"{k if k > 0 else 'error'}: {v}" for k, v in sorted(statuses.items()))
    return (f"{n} x GET {target[:40]:<22} [{shown}]  p50 {statistics.median(lat):6.0f}  p95 {pct(95):6.0f}  "
            f"p99 {pct(99):6.0f}  max {lat[-1]:6.0f} ms  {n / wall:6.0f} req/s")


def proc_status(pid: int) -> str:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (f"threads {fields['Threads'].strip()}, RSS {int(fields['VmRSS'].split()[0]) / 1024:.0f} MiB "
            f"(peak {int(fields['VmHWM'].split()[0]) / 1024:.0f} MiB)")


def state(index: Path, label: str, background: int, drip: bool, args: argparse.Namespace, run: str) -> None:
    proc, port = start(index, args.workers)
    clients = Background(port, background, drip=drip)
    try:
        clients.start()
        time.sleep(args.settle)
        print(f"-- {label}: {clients.open_now()} background connections open")
        print("   " + burst(port, "/", args.burst))
        print("   " + burst(port, f"/runs/{run}", args.burst))
        print(f"   server: {proc_status(proc.pid)}; background connections cut by the server so far: {clients.cut}"
              f" (opened again), failed connects: {clients.failed_connects}")
        open_at_stop = clients.open_now()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(STOP_TIMEOUT_S)
            print(f"   SIGTERM with {open_at_stop} connections open: exited {rc} in "
                  f"{time.monotonic() - started:.2f} s")
        except subprocess.TimeoutExpired:
            print(f"   SIGTERM with {open_at_stop} connections open: still running after {STOP_TIMEOUT_S:.0f} s "
                  "(killed)")
    finally:
        clients.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, help="experiment index (default: the demo captures, replayed)")
    ap.add_argument("--burst", type=int, default=100)
    ap.add_argument("--idle", type=int, default=500)
    ap.add_argument("--dripping", type=int, default=1000)
    ap.add_argument("--workers", type=int, help="tracker ui --workers (default: its own)")
    ap.add_argument("--settle", type=float, default=11.0,
                    help="seconds between opening the background connections and the bursts (default 11: past the "
                         "server's 10 s head deadline, so that the bursts meet the cuts and the connections opened "
                         "again)")
    args = ap.parse_args(argv)
    limit = raise_open_files(args.burst + max(args.idle, args.dripping) + 256)
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        index = args.index
        if index is None:
            index = Path(tmp) / "demo.sqlite"
            subprocess.run([*tracker_command(), "replay", "--index", str(index), str(DEMO)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc, port = start(index, args.workers)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            page = b"".join(iter(lambda: conn.recv(1 << 20), b"")).decode()
        proc.send_signal(signal.SIGTERM)
        proc.wait(STOP_TIMEOUT_S)
        found = re.search(r'<td class="run"><a href="/runs/([^"?]+)"', page)
        run = found.group(1) if found else "none"
        listed = page.count('<td class="run">')
        print(f"python {sys.version.split()[0]}; {load_average()}; open files soft limit {limit} (raised); "
              f"index {index.name} ({listed} runs on /, {len(page):,} bytes), run page "
              f"/runs/{run}; latencies from connect to the last byte")
        state(index, "quiet", 0, False, args, run)
        state(index, f"{args.idle} idle", args.idle, False, args, run)
        state(index, f"{args.dripping} dripping (1 byte/s)", args.dripping, True, args, run)
        print(load_average())
    return 0


if __name__ == "__main__":
    sys.exit(main())
