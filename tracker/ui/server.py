"""The web view's HTTP server, read-only: a fixed pool of workers answers, one loop reads and writes every
connection with deadlines (``tracker.ui.connections``: how and the bounds, ``Limits``).

- Only ``GET`` and ``HEAD``; any other method is ``405`` with ``Allow: GET, HEAD``.
- The ``Host`` header must name one of the allowed hosts (``localhost``, ``127.0.0.1``, ``::1``, the address the
  server is bound to, and those given with ``--allowed-host``), else ``400``: a page of another site whose name was
  made to resolve to this address (DNS rebinding) cannot read it.
- Every response carries a Content-Security-Policy that allows no script, no frame and no other origin (styles
  from ``/static/ui.css`` only), ``nosniff``, no referrer and ``no-store``.
- A page of live data reloads itself: the runs, and the page of a run not finished, carry
  ``<meta http-equiv="refresh" content="N">`` (``N``: ``refresh=N``, default ``DEFAULT_REFRESH_S``; ``refresh=0``
  off; from ``MIN_REFRESH_S`` to ``MAX_REFRESH_S``, else ``400``). A page whose time is fixed (``now=``, or the
  server's ``--now``: a recording is read as of its end) does not, nor a finished run's page, nor an error page.
  The policy is kept as it is: a meta refresh is the browser loading the same URL again, not script, and no CSP
  directive governs it (``default-src 'none'`` does not stop it).
- Each request opens the index read-only once (``tracker.read.store.IndexReader``: ``mode=ro``) and closes it; an
  index that went away or broke is a ``503`` page saying why.
- The query string's filters are those of ``tracker runs``, read and checked by ``tracker.read.filters.run_filter``
  (the command line's own words when a value cannot work, as a ``400`` page). A query string is at most
  ``MAX_QUERY_CHARS`` characters (else ``414``), a path other than ``/runs/RUN`` at most ``MAX_PATH_CHARS`` (else
  ``414``), each name, value and run reference at most ``MAX_PARAM_CHARS``, and ``limit`` at most ``MAX_LIMIT``
  (else ``400``); an unknown name is a ``400``; a name given twice takes its values in order (the list filters) or
  the last (the others), as the command line does.
- The request's head: a request line of at most 64 KiB (else ``414``), at most 100 headers of at most 64 KiB each
  (http.server's limits, else ``431``), the whole head at most ``connections.MAX_HEAD_BYTES`` (else ``431``), read
  within ``Limits.header_timeout_s`` of the accept (else ``408``); the response written within
  ``Limits.response_timeout_s`` (else the connection is reset). An HTTP version of 2.0 or more is http.server's
  ``505`` (this server speaks HTTP/1.0: one request a connection); nothing else a client sends is a 5xx.

Routes: ``/`` (the runs; the query string takes the filters of ``tracker runs``), ``/runs/<run>`` (a run id, a
unique start of one, or ``NAMESPACE/NAME``; takes ``now`` and ``refresh``), ``/compare?run=A&run=B[&run=C...]``
(``MIN_COMPARED`` to ``MAX_COMPARED`` different runs, each referred to as in ``/runs/<run>``, else ``400``; a run not
found ``404``; what ``tracker compare`` shows, the rows that differ marked, and each metric's curves; takes ``now``
and ``refresh``), ``/static/ui.css``, ``/healthz`` (``ok``, whatever the Host: for
probes).
"""

from __future__ import annotations

import io
import sqlite3
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, NamedTuple, cast
from urllib.parse import parse_qs, unquote, urlsplit

import structlog

from tracker import errors
from tracker.core.vocab import FINAL_STATUSES
from tracker.read import nodeinfo
from tracker.read.filters import FILTERS, FilterError, ago, parse_duration, parse_now, run_filter
from tracker.read.pods import run_nodes
from tracker.read.queues import queue_context
from tracker.read.store import IndexQueryError, IndexReader
from tracker.ui import pages
from tracker.ui.compare_page import compare_page
from tracker.ui.connections import ConnectionLoop, Limits
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
DEFAULT_LIMITS = Limits()  # workers, queue, connections, deadlines: tracker.ui.connections
WORKER_JOIN_S = 1.0  # after the loop ends, how long serve_until waits for the workers (daemons) to end
MAX_LOGGED_CHARS = 512  # a logged path or request line is cut to this
MAX_PATH_CHARS = 2_048  # a longer path (other than /runs/RUN, whose reference is capped) is a 414
MAX_QUERY_CHARS = 8_192  # a longer query string is a 414
MAX_PARAM_CHARS = 1_024  # a longer query parameter value (or run reference in /runs/RUN) is a 400
MAX_LIMIT = 10_000  # the most runs one page lists (limit=); more is a 400
DEFAULT_REFRESH_S = 10  # a page of live data reloads itself this often (refresh=N sets it, refresh=0 turns it off)
MIN_REFRESH_S = 2  # refresh= below this (other than 0) is a 400: a page reloading faster only loads the index
MAX_REFRESH_S = 3_600  # refresh= above this is a 400
MIN_COMPARED = 2  # /compare: fewer runs (distinct) is a 400
MAX_COMPARED = 8  # /compare: more runs is a 400 (and the curves' colours: tracker.ui.curves.COLOURS)


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


def refresh_seconds(query: dict[str, list[str]]) -> int:
    """The ``refresh`` parameter taken out of ``query`` (its last value): seconds between reloads, 0 for none;
    ``DEFAULT_REFRESH_S`` when not given. QueryError for anything but 0 or a whole number of seconds from
    ``MIN_REFRESH_S`` to ``MAX_REFRESH_S``."""
    given = query.pop("refresh", None)
    if not given:
        return DEFAULT_REFRESH_S
    text = given[-1].strip()
    seconds = int(text) if text.isascii() and text.isdigit() and len(text) <= 6 else -1
    if seconds != 0 and not MIN_REFRESH_S <= seconds <= MAX_REFRESH_S:
        raise QueryError(f"refresh: 0 (off) or whole seconds from {MIN_REFRESH_S} to {MAX_REFRESH_S}, "
                         f"got {text[:64]!r}")
    return seconds


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
        if len(path) > MAX_PATH_CHARS and not path.startswith("/runs/"):
            return self._error(HTTPStatus.REQUEST_URI_TOO_LONG, f"the path has {len(path)} characters, at most "
                               f"{MAX_PATH_CHARS} characters are read", now)
        try:
            _check_lengths(query, unquote(path[len("/runs/"):]) if path.startswith("/runs/") else "")
            if path in ("/", "/runs", "/runs/"):
                refresh = "refresh" in query
                every = refresh_seconds(query)
                values = self._filter_values(query)
                now_value = values.get("now")
                fixed = parse_now(now_value[-1] if now_value else None) or self.now
                now = fixed or self.clock()
                shown = {k.replace("_", "-"): v for k, v in query.items()}
                if refresh:  # kept by the filter form
                    shown["refresh"] = [str(every)]
                return self._page("Runs", self._runs(values, shown, now), now,
                                  refresh=0 if fixed else every)
            if path.startswith("/runs/"):
                every = refresh_seconds(query)
                unknown = sorted(set(query) - {"now"})
                if unknown:
                    raise QueryError(f"a run's page takes only now=TIME and refresh=SECONDS, not {', '.join(unknown)}")
                now_param = query["now"][-1] if "now" in query else None
                fixed = (parse_now(now_param) if now_param else None) or self.now
                now = fixed or self.clock()
                return self._run(unquote(path[len("/runs/"):]), now, now_param, 0 if fixed else every)
            if path == "/compare":
                every = refresh_seconds(query)
                unknown = sorted(set(query) - {"now", "run"})
                if unknown:
                    raise QueryError("the compare page takes only run=RUN (2 to 8 times), now=TIME and "
                                     f"refresh=SECONDS, not {', '.join(unknown)}")
                now_param = query["now"][-1] if "now" in query else None
                fixed = (parse_now(now_param) if now_param else None) or self.now
                now = fixed or self.clock()
                return self._compare(query.get("run", []), now, now_param, 0 if fixed else every)
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

    def _run(self, ref: str, now: datetime, now_param: str | None = None, refresh: int = 0) -> Response:
        with IndexReader(self.index) as reader:
            try:
                run_id, note = reader.resolve(ref)
            except IndexQueryError as exc:
                return self._error(HTTPStatus.NOT_FOUND, str(exc).replace(str(self.index), self.index.name), now)
            waiting = queue_context(reader, [run_id]).get(run_id)
            resumed_by = reader.resumed_by(run_id)
            history = reader.history(run_id)
            node_notes = {} if history is None else nodeinfo.notes(nodeinfo.node_info(reader, run_nodes(history)))
        if history is None:  # deleted between the reads (the reader read again after a writer appeared)
            return self._error(HTTPStatus.NOT_FOUND, f"no run {ref!r} in {self.index.name}", now)
        live = history.run.status not in FINAL_STATUSES
        return self._page(f"run {run_id}", pages.run_page(history, now=now, note=note, waiting=waiting,
                                                          resumed_by=resumed_by, now_param=now_param,
                                                          node_notes=node_notes), now,
                          refresh=refresh if live else 0)

    def _compare(self, refs: list[str], now: datetime, now_param: str | None, refresh: int) -> Response:
        if not MIN_COMPARED <= len(refs) <= MAX_COMPARED:
            raise QueryError(f"compare {MIN_COMPARED} to {MAX_COMPARED} runs (run=RUN, once each), got {len(refs)}")
        with IndexReader(self.index) as reader:
            ids: list[str] = []
            notes: list[str] = []
            for ref in refs:
                try:
                    run_id, note = reader.resolve(ref)
                except IndexQueryError as exc:
                    return self._error(HTTPStatus.NOT_FOUND, str(exc).replace(str(self.index), self.index.name), now)
                if run_id in ids:
                    raise QueryError(f"run {run_id!r} is given twice: compare {MIN_COMPARED} to {MAX_COMPARED} "
                                     "different runs")
                ids.append(run_id)
                if note:
                    notes.append(note)
            histories = [reader.history(r) for r in ids]
            resumed_by = {r: reader.resumed_by(r) for r in ids}
            nodes = nodeinfo.node_info(reader, [n for h in histories if h is not None for n in run_nodes(h)])
        found = [h for h in histories if h is not None]
        if len(found) < len(ids):  # deleted between the reads
            return self._error(HTTPStatus.NOT_FOUND, "a run went away while it was read: load the page again", now)
        live = any(h.run.status not in FINAL_STATUSES for h in found)
        return self._page(f"compare {len(ids)} runs", compare_page(found, now=now, resumed_by=resumed_by,
                                                                   notes=notes, now_param=now_param, nodes=nodes),
                          now, refresh=refresh if live else 0)

    def _page(self, title: str, body: str, now: datetime, status: int = HTTPStatus.OK, *, refresh: int = 0) -> Response:
        return Response(status, pages.layout(title, body, index_name=self.index.name, now=now,
                                             refresh=refresh).encode())

    def _error(self, status: HTTPStatus, message: str, now: datetime | None) -> Response:
        return self._page(status.phrase, pages.error_body(status.value, status.phrase, message),
                          now or self.now or self.clock(), status.value)


class _Handler(BaseHTTPRequestHandler):
    """One request, run on its head in memory (``rfile``) into a buffer (``wfile``): the connection loop
    (``tracker.ui.connections``) read the head and writes the bytes. http.server's parsing stays: a bad request
    line or version is a ``400``, more than 100 headers or a header line over 64 KiB a ``431``."""

    server_version = "tracker-ui"
    sys_version = ""
    server: UiServer  # type: ignore[assignment]  # not a socketserver: what the handler reads of it is app

    def setup(self) -> None:
        self.rfile = io.BytesIO(self.request)
        self.wfile = io.BytesIO()

    def finish(self) -> None:
        """Nothing to flush or close: ``wfile`` is read after the request."""

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
            log.exception("ui_request_failed", method=self.command, path=self.path[:MAX_LOGGED_CHARS])
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
        log.info("ui_request", client=str(self.client_address[0]), request=(format % args)[:MAX_LOGGED_CHARS])


class UiServer:
    """Serves ``app`` on ``host:port`` (bound at once: ``OSError`` if it cannot be) within ``limits``; see
    ``tracker.ui.connections`` for how connections are read, queued, answered and cut."""

    def __init__(self, host: str, port: int, app: App, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.app = app
        self.limits = limits
        self.loop = ConnectionLoop(host, port, self._answer, limits=limits, headers=SECURITY_HEADERS)
        self.server_address = self.loop.address

    def _answer(self, head: bytes, client: tuple[Any, ...]) -> bytes:
        handler = _Handler(cast(Any, head), client, cast(Any, self))
        return cast(io.BytesIO, handler.wfile).getvalue()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        text = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{text}]" if ":" in text else text
        return f"http://{shown}:{port}/"


def serve_until(server: UiServer, stop: threading.Event) -> None:
    """Serve (in this thread) until ``stop`` is set, then refuse new connections, give those in flight
    ``limits.stop_grace_s`` to finish, and close; the workers get one more second (they are daemons)."""
    try:
        server.loop.run(stop)
    finally:
        server.loop.join_workers(WORKER_JOIN_S)
