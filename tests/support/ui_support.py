"""What the web view's tests share: an index of the bundled captures plus one run whose id, project, reason and
message are HTML, and the real server (``tracker.ui.server``) on a free loopback port in a thread."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

from rich.console import Console

from tracker.cli.args import DEMO_CAPTURES
from tracker.runtime.replay import replay
from tracker.ui.connections import Limits
from tracker.ui.server import DEFAULT_LIMITS, App, UiServer, allowed_hosts, serve_until

NOW = datetime(2026, 8, 20, 13, 0, tzinfo=UTC)  # the end of the bundled capture's day
NOW_TEXT = "2026-08-20T13:00:00Z"
EVIL_RUN = "<script>alert(1)</script>&\"'/x"
EVIL_EVENT = {
    "schema": "taugrid.io/intake/v1", "event_id": "evil-1", "run_id": EVIL_RUN, "at": "2026-08-20T12:00:00Z",
    "kind": "Resolution", "status": "failed", "project": "<b>proj</b>", "reason": "Bad<Reason>",
    "message": "<img src=x onerror=alert(2)> & \"quotes\"",
}
EXTRA_HOST = "tracker.example.internal"


def build_index(directory: Path) -> Path:
    """The bundled captures, then one intake event whose every text is HTML."""
    path = directory / "ui.sqlite"
    replay(captures=[DEMO_CAPTURES], index_path=path, console=Console(quiet=True), quiet=True)
    evil = directory / "evil.jsonl"
    evil.write_text(json.dumps(EVIL_EVENT) + "\n")
    replay(captures=[evil], index_path=path, console=Console(quiet=True), quiet=True)
    return path


@contextmanager
def running(index: Path, *, stuck_after: str = "30m", limits: Limits = DEFAULT_LIMITS,
            app: App | None = None) -> Iterator[UiServer]:
    """The server on 127.0.0.1 (any free port), its clock at NOW, within ``limits``; stopped (gracefully) at the
    end. ``app``: another App than the one on ``index``."""
    app = app or App(index=index, hosts=allowed_hosts("127.0.0.1", [EXTRA_HOST]), stuck_after=stuck_after,
                     clock=lambda: NOW)
    server = UiServer("127.0.0.1", 0, app, limits=limits)
    stop = threading.Event()
    thread = threading.Thread(target=serve_until, args=(server, stop), name="ui-test-server")
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"


class Reply(NamedTuple):
    status: int
    headers: http.client.HTTPMessage
    body: str


def request(server: UiServer, target: str, *, method: str = "GET", host: str | None = "") -> Reply:
    """One request; ``host`` "" sends the server's own address, None no Host header at all."""
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            conn.putheader("Host", host or f"127.0.0.1:{port}")
        conn.endheaders()
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read().decode())
    finally:
        conn.close()
