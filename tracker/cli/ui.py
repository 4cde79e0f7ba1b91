"""The ``tracker ui`` command: its options, the start-up checks (one line and exit 2 when the index cannot be read or
the address cannot be bound), and a graceful stop on SIGTERM or SIGINT: exit 0 within ``Limits.stop_grace_s`` (3 s)
and a fraction of a second (new connections refused at once, idle ones closed, requests in flight and heads begun
given the grace, then cut); a second signal ends the process at once, killed by it.

Imported by ``tracker.cli.parser`` at start: standard library and ``tracker.cli.args`` only at the top; the server
and the pages are imported when the command runs.
"""

from __future__ import annotations

import argparse
import signal
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tracker.cli.args import DEFAULT_INDEX, INDEX_ENV, UsageError, index_path, parse_duration, parse_now, recorded_now

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321
DEFAULT_STUCK_AFTER = "30m"
DEFAULT_WORKERS = 8  # tracker.ui.connections.Limits.workers: requests answered at once
DEFAULT_MAX_CONNECTIONS = 2_048  # Limits.max_connections: connections open at once (more: a 503 at once)
MAX_WORKERS = 256
MAX_CONNECTIONS = 65_536
SPARE_FDS = 64  # file descriptors kept beside the connections (the index, logs, the workers' SQLite files)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

UI_EPILOG = f"""\
examples:
  tracker ui --index runs.sqlite                 # http://127.0.0.1:{DEFAULT_PORT}/ (this machine only)
  tracker ui --port 9000 --stuck-after 1h        # runs stuck before running for over 1h listed first
  tracker ui --host 0.0.0.0 --allowed-host tracker.example.internal   # behind an ingress
  open http://127.0.0.1:{DEFAULT_PORT}/?namespace=team-a&status=pending&sort-by=age
"""


def add_ui_command(sub: Any) -> None:
    """Add ``ui`` to the ``tracker`` sub-parsers ``sub``."""
    u = sub.add_parser(
        "ui", help="serve a read-only web view of the experiment index (runs, timelines)",
        description="A read-only web view of the experiment index: the runs table with the filters of `tracker runs`\n"
                    "(as a query string: ?namespace=team-a&status=pending&selector=project%3Dllm&sort-by=age),\n"
                    "stuck runs first, and each run's timeline, GPU figures and attempts. GET and HEAD only, no\n"
                    "script, no login: bound to localhost unless --host says otherwise.", epilog=UI_EPILOG)
    u.add_argument("--index", type=Path, metavar="PATH",
                   help=f"experiment index to read (default: ${INDEX_ENV}, else {DEFAULT_INDEX})")
    u.add_argument("--host", default=DEFAULT_HOST, metavar="ADDRESS",
                   help=f"address to listen on (default: {DEFAULT_HOST}, this machine only; 0.0.0.0 or :: for every "
                        "interface, e.g. in a pod behind an ingress)")
    u.add_argument("--port", type=_port, default=DEFAULT_PORT, metavar="PORT",
                   help=f"port to listen on (default: {DEFAULT_PORT}; 0: any free port)")
    u.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a host name clients may reach the view by (the Host header; repeatable). Always allowed: "
                        "localhost, 127.0.0.1, ::1 and the --host address; any other name is refused (DNS rebinding)")
    u.add_argument("--stuck-after", default=DEFAULT_STUCK_AFTER, metavar="DURATION",
                   help=f"runs stuck before running (Admission, Scheduling, Runtime) for longer than this are listed "
                        f"first (default: {DEFAULT_STUCK_AFTER})")
    u.add_argument("--now", metavar="TIME",
                   help="the reference time of every page (ISO-8601; default: the current time; a page's now=TIME "
                        "overrides it)")
    u.add_argument("--workers", type=_bounded(1, MAX_WORKERS), default=DEFAULT_WORKERS, metavar="N",
                   help=f"threads answering requests (default: {DEFAULT_WORKERS}, at most {MAX_WORKERS}); a request "
                        "waits in a queue of 256 when all are busy, a 503 with Retry-After when it is full")
    u.add_argument("--max-connections", type=_bounded(1, MAX_CONNECTIONS), default=DEFAULT_MAX_CONNECTIONS,
                   metavar="N",
                   help=f"connections open at once (default: {DEFAULT_MAX_CONNECTIONS:,}); more are answered 503 at "
                        "once. The soft limit of open files is raised to fit, up to the hard limit")
    u.add_argument("--log-format", choices=("console", "json"), default="console",
                   help="the request log on stderr: console (default) or json lines")
    u.set_defaults(func=cmd_ui, needs_console=False)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return int(text)


def _bounded(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high:,}, got {text[:32]!r}")
        return int(text)
    return parse


def _fit_open_files(wanted: int) -> int:
    """Raise the soft limit of open files to ``wanted`` (up to the hard limit); the limit it has then."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else soft


def cmd_ui(args: argparse.Namespace, console: object) -> int:
    import sqlite3

    import structlog

    from tracker import errors
    from tracker.read.filters import RunFilter
    from tracker.read.store import IndexReader
    from tracker.runtime.ops import configure_logging
    from tracker.ui.connections import Limits
    from tracker.ui.server import App, UiServer, allowed_hosts, serve_until

    path = index_path(args)
    parse_duration(args.stuck_after)  # a bad duration: one line, exit 2
    now = parse_now(args.now) or recorded_now(path)  # a recording is read as of the latest time it holds
    try:
        with IndexReader(path) as reader:
            reader.runs(RunFilter(limit=1), ("run_id",), phase_since=False)
    except errors.Fatal:
        raise
    except (OSError, sqlite3.Error) as exc:
        raise UsageError(f"cannot read the experiment index {path}: {exc}") from None
    configure_logging("INFO", args.log_format)
    log = structlog.get_logger("tracker.ui")
    hosts = allowed_hosts(args.host, args.allowed_host)
    app = App(index=path, hosts=hosts, stuck_after=args.stuck_after, clock=lambda: datetime.now(UTC), now=now)
    open_files = _fit_open_files(args.max_connections + args.workers + SPARE_FDS)
    max_connections = min(args.max_connections, open_files - args.workers - SPARE_FDS)
    if max_connections < 1:
        raise UsageError(f"too few open files allowed ({open_files}, ulimit -n) for {args.workers} workers")
    if max_connections < args.max_connections:
        log.warning("ui_max_connections_lowered", max_connections=max_connections, open_files_limit=open_files)
    limits = Limits(workers=args.workers, max_connections=max_connections)
    try:
        server = UiServer(args.host, args.port, app, limits=limits)
    except OSError as exc:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if received:  # a second signal: stop now, by the signal's default action
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    log.info("ui_serving", url=server.url, index=str(path), allowed_hosts=sorted(hosts), workers=limits.workers,
             max_connections=limits.max_connections)
    try:
        serve_until(server, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("ui_stopped", signal=signal.Signals(received[0]).name if received else None)
    return 0
