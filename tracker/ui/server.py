"""The web view's HTTP server: ``http.server`` with one thread per request, read-only.

- Only ``GET`` and ``HEAD``; any other method is ``405`` with ``Allow: GET, HEAD``.
- The ``Host`` header must name one of the allowed hosts (``localhost``, ``127.0.0.1``, ``::1``, the address the
  server is bound to, and those given with ``--allowed-host``), else ``400``: a page of another site whose name was
  made to resolve to this address (DNS rebinding) cannot read it.
- Every response carries a Content-Security-Policy that allows no script, no frame and no other origin (styles
  from ``/static/ui.css`` only), ``nosniff``, no referrer and ``no-store``.
- Each request opens the index read-only once (``tracker.read.store.IndexReader``: ``mode=ro``) and closes it; an
  index that went away or broke is a ``503`` page saying why.
- The query string's filters are those of ``tracker runs``, read and checked by ``tracker.read.filters.run_filter``
  (the command line's own words when a value cannot work, as a ``400`` page). A query string is at most
  ``MAX_QUERY_CHARS`` characters (else ``414``), each value and a run reference at most ``MAX_PARAM_CHARS``, and
  ``limit`` at most ``MAX_LIMIT`` (else ``400``).

Routes: ``/`` (the runs; the query string takes the filters of ``tracker runs``), ``/runs/<run>`` (a run id, a
unique start of one, or ``NAMESPACE/NAME``), ``/static/ui.css``, ``/healthz`` (``ok``, whatever the Host: for
probes).
"""

from __future__ import annotations

import socket
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import structlog

from tracker import errors
from tracker.read.filters import FILTERS, FilterError, ago, parse_duration, parse_now, run_filter
from tracker.read.queues import queue_context
from tracker.read.store import IndexQueryError, IndexReader
from tracker.ui import pages
from tracker.ui.style import CSS

log = structlog.get_logger("tracker.ui")

CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)
ALLOWED_METHODS = ("GET", "HEAD")
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})
HTML = "text/html; charset=utf-8"
REQUEST_TIMEOUT_S = 30.0  # a client that sends nothing for this long is dropped
MAX_QUERY_CHARS = 8_192  # a longer query string is a 414
MAX_PARAM_CHARS = 1_024  # a longer query parameter value (or run reference in /runs/RUN) is a 400
MAX_LIMIT = 10_000  # the most runs one page lists (limit=); more is a 400


class Response(NamedTuple):
    status: int
    body: bytes
    content_type: str = HTML


def host_name(header: str | None) -> str | None:
    """The host of a ``Host`` header, lower case, without port or trailing dot (``[::1]:8321`` -> ``::1``)."""
    if not header:
        return None
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else None
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    elif ":" in value:
        return None  # an IPv6 address must be bracketed in a Host header
    return value.rstrip(".") or None


def allowed_hosts(bound: str, extra: Sequence[str]) -> frozenset[str]:
    names = set(LOCAL_HOSTS) | {e.strip().lower().rstrip(".") for e in extra if e.strip()}
    if bound not in WILDCARDS:
        names.add(bound.lower().strip("[]"))
    return frozenset(names)


class QueryError(errors.InvalidInput):
    """A query string the view refuses (an unknown filter, a parameter a page does not take): a 400 page with the
    reason. Not fatal: the request is refused, the server goes on."""


def _check_lengths(query: dict[str, list[str]], ref: str) -> None:
    """QueryError for a value (or a run reference) over ``MAX_PARAM_CHARS`` characters."""
    if len(ref) > MAX_PARAM_CHARS:
        raise QueryError(f"a run reference is at most {MAX_PARAM_CHARS} characters, got {len(ref)}")
    for key, given in query.items():
        longest = max((len(v) for v in given), default=0)
        if longest > MAX_PARAM_CHARS or len(key) > MAX_PARAM_CHARS:
            raise QueryError(f"{key[:64]!r}: a value is at most {MAX_PARAM_CHARS} characters, got "
                             f"{max(longest, len(key))}")


class App:
    """What the server answers, apart from HTTP: ``respond(method, target, host)``."""

    def __init__(self, *, index: Path, hosts: frozenset[str], stuck_after: str, clock: Callable[[], datetime],
                 now: datetime | None = None) -> None:
        self.index = index
        self.hosts = hosts
        self.stuck_after = stuck_after
        self.stuck_after_s = parse_duration(stuck_after)
        self.clock = clock
        self.now = now

    def respond(self, method: str, target: str, host: str | None) -> Response:
        if method not in ALLOWED_METHODS:
            return self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed: this view only reads "
                               "(GET and HEAD)", None)
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query, keep_blank_values=False)
        if path == "/healthz":  # for probes, which name the pod's address: it tells nothing
            return Response(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8")
        if host_name(host) not in self.hosts:
            return self._error(HTTPStatus.BAD_REQUEST, "unknown Host header: this server answers to "
                               + ", ".join(sorted(self.hosts)) + " (start it with --allowed-host NAME for others)",
                               None)
        if path == "/static/ui.css":
            return Response(HTTPStatus.OK, CSS.encode(), "text/css; charset=utf-8")
        now = self.now
        if len(parts.query) > MAX_QUERY_CHARS:
            return self._error(HTTPStatus.REQUEST_URI_TOO_LONG, f"the query string has {len(parts.query)} "
                               f"characters, at most {MAX_QUERY_CHARS} characters are read", now)
        try:
            _check_lengths(query, unquote(path[len("/runs/"):]) if path.startswith("/runs/") else "")
            if path in ("/", "/runs", "/runs/"):
                values = self._filter_values(query)
                now_value = values.get("now")
                now = parse_now(now_value[-1] if now_value else None) or self.now or self.clock()
                return self._page("Runs", self._runs(values, {k.replace("_", "-"): v for k, v in query.items()}, now),
                                  now)
            if path.startswith("/runs/"):
                unknown = sorted(set(query) - {"now"})
                if unknown:
                    raise QueryError(f"a run's page takes only now=TIME, not {', '.join(unknown)}")
                now_param = query["now"][-1] if "now" in query else None
                now = (parse_now(now_param) if now_param else None) or self.now or self.clock()
                return self._run(unquote(path[len("/runs/"):]), now, now_param)
        except (QueryError, FilterError) as exc:
            return self._error(HTTPStatus.BAD_REQUEST, str(exc), now)
        except (OSError, sqlite3.Error, errors.Fatal) as exc:
            log.warning("ui_index_unavailable", index=str(self.index), error=str(exc))
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"the index cannot be read: {exc}", now)
        return self._error(HTTPStatus.NOT_FOUND, f"no page {path} (the runs are at /)", now)

    # ------------------------------------------------------------------------------------------ pages

    def _filter_values(self, query: dict[str, list[str]]) -> dict[str, list[str]]:
        """The query string's filters by name (``cluster_queue`` is ``cluster-queue``), blank values left out."""
        values: dict[str, list[str]] = {}
        for key, given in query.items():
            name = key.replace("_", "-")
            if name not in FILTERS:
                raise QueryError(f"unknown filter {key!r} (one of: {', '.join(FILTERS)})")
            kept = [v for v in given if v.strip()]
            if kept:
                values.setdefault(name, []).extend(kept)
        return values

    def _runs(self, values: dict[str, list[str]], shown: dict[str, list[str]], now: datetime) -> str:
        """``values``: the filters given; ``shown``: the query string as the page's form shows it back."""
        run_query = run_filter(values, now=now)
        if run_query.limit is not None and run_query.limit > MAX_LIMIT:
            raise QueryError(f"limit: at most {MAX_LIMIT} runs on a page, got {run_query.limit}")
        stuck = values.get("stuck")
        with IndexReader(self.index) as reader:
            return pages.runs_page(reader, run_query, values=shown, now=now,
                                   stuck_before=ago(now, self.stuck_after_s),
                                   stuck_label=stuck[-1] if stuck else self.stuck_after)

    def _run(self, ref: str, now: datetime, now_param: str | None = None) -> Response:
        with IndexReader(self.index) as reader:
            try:
                run_id, note = reader.resolve(ref)
            except IndexQueryError as exc:
                return self._error(HTTPStatus.NOT_FOUND, str(exc).replace(str(self.index), self.index.name), now)
            waiting = queue_context(reader, [run_id]).get(run_id)
            resumed_by = reader.resumed_by(run_id)
            history = reader.history(run_id)
        if history is None:  # deleted between the reads (the reader read again after a writer appeared)
            return self._error(HTTPStatus.NOT_FOUND, f"no run {ref!r} in {self.index.name}", now)
        return self._page(f"run {run_id}", pages.run_page(history, now=now, note=note, waiting=waiting,
                                                          resumed_by=resumed_by, now_param=now_param), now)

    def _page(self, title: str, body: str, now: datetime, status: int = HTTPStatus.OK) -> Response:
        return Response(status, pages.layout(title, body, index_name=self.index.name, now=now).encode())

    def _error(self, status: HTTPStatus, message: str, now: datetime | None) -> Response:
        return self._page(status.phrase, pages.error_body(status.value, status.phrase, message),
                          now or self.now or self.clock(), status.value)


class _Handler(BaseHTTPRequestHandler):
    server_version = "tracker-ui"
    sys_version = ""
    timeout = REQUEST_TIMEOUT_S
    server: UiServer

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def __getattr__(self, name: str) -> Any:
        """Every other method (``do_POST``, ``do_PUT``, ``do_FOO``...) answers 405, not http.server's 501."""
        if name.startswith("do_"):
            return lambda: self._serve(head=False)
        raise AttributeError(name)

    def _serve(self, *, head: bool) -> None:
        try:
            response = self.server.app.respond(self.command, self.path, self.headers.get("Host"))
        except Exception:
            log.exception("ui_request_failed", method=self.command, path=self.path)
            response = Response(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error; see the server's log\n",
                                "text/plain; charset=utf-8")
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        if response.status == HTTPStatus.METHOD_NOT_ALLOWED:
            self.send_header("Allow", ", ".join(ALLOWED_METHODS))
        self.end_headers()
        if not head:
            self.wfile.write(response.body)

    def end_headers(self) -> None:
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        log.info("ui_request", client=self.client_address[0], request=format % args)


class UiServer(ThreadingHTTPServer):
    """Serves ``app``; ``server_close`` waits for the requests in flight (their threads are not daemons)."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, app: App) -> None:
        self.app = app
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{text}]" if ":" in text else text
        return f"http://{shown}:{port}/"


def serve_until(server: UiServer, stop: threading.Event) -> None:
    """Serve until ``stop`` is set, then stop accepting, finish the requests in flight and close."""
    worker = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="ui-server")
    worker.start()
    try:
        while not stop.wait(0.5):
            if not worker.is_alive():
                break
    finally:
        server.shutdown()
        worker.join()
        server.server_close()
