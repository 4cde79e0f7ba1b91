"""Operability: structured logs, Prometheus metrics, health endpoints and signal-driven shutdown.

Logs are JSON lines on stderr (structlog), with whatever the code bound through ``structlog.contextvars``
(``partition``, ``offset``, ``run_id``...) merged into each line; library logs (aiokafka) go through the same
renderer, and every line through ``redact_log`` first: each string value in it (the event, the fields, nested
values, a formatted traceback) has its secrets redacted as everything else the tracker writes (README "What is
redacted"). Metrics live in one registry per process and are served with ``/healthz`` (the process runs) and
``/readyz`` (every component reports ready: partitions assigned and restored) on a small asyncio HTTP server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tracker.core.redact import redact_value
from tracker.settings import OpsSettings, Settings

T = TypeVar("T")
log = structlog.get_logger("tracker.ops")

_MAX_REQUEST_BYTES = 8_192


# ------------------------------------------------------------------------------------------ logging


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    """structlog (and stdlib logging) to stderr: JSON lines, or a console format for people."""
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (structlog.processors.JSONRenderer() if fmt == "json"
                     else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info,
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, structlog.processors.format_exc_info,
                    redact_log, renderer],
        foreign_pre_chain=shared))
    handler.addFilter(_Repeats("aiokafka", window_s=10.0))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def redact_log(_logger: Any, _method: str, event_dict: Any) -> Any:
    """structlog processor: every string value of a log line (at any depth of lists and dicts, tuples read as
    lists) with its secrets redacted (``tracker.core.redact.redact_value``); other values as they are."""
    for key, value in event_dict.items():
        if value.__class__ is tuple:
            value = list(value)
        if isinstance(value, str | dict | list):
            event_dict[key] = redact_value(value)
    return event_dict


def log_deprecated_env(settings: Settings) -> None:
    """One ``settings_deprecated_env`` warning for each deprecated variable the settings were read from (its
    name and its new name, never its value)."""
    for old, new in settings.deprecated_env:
        log.warning("settings_deprecated_env", variable=old, use_instead=new)


class _Repeats(logging.Filter):
    """Drops a message of the ``library`` loggers already logged within ``window_s`` (aiokafka logs a failed
    connection attempt thousands of times a second while a broker is down)."""

    _MAX_KEPT = 1_000

    def __init__(self, library: str, window_s: float) -> None:
        super().__init__()
        self.library = library
        self.window_s = window_s
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.library):
            return True
        now = time.monotonic()
        key = f"{record.name}:{record.levelno}:{record.getMessage()}"
        if now - self._last.get(key, -self.window_s) < self.window_s:
            return False
        if len(self._last) >= self._MAX_KEPT:
            self._last.clear()
        self._last[key] = now
        return True


# ------------------------------------------------------------------------------------------ metrics


# The metric families of each process: a process exports only its own (and the common ones). ``all``: every
# family (tests and benchmarks). ``serve`` embeds the reducer and the index sink; without Kafka it runs the
# embedded pipeline, which has no transactions, partitions or consumer lag (``serve-embedded``).
_COMMON = ("build_info", "errors")
_REDUCER = ("changes_consumed", "records_produced", "fold_seconds", "transaction_seconds", "transactions",
            "consumer_lag", "dead_letters", "transitions", "oldest_pending", "alerts", "oldest_stuck", "stuck_alerts",
            "runs", "runs_finished", "partitions", "restore_seconds", "pending_seconds", "pending_open", "packed_runs",
            "packed_bytes", "derivations")
_SINK = ("sink_rows", "sink_histories", "sink_bad_records", "sink_write_seconds", "consumer_lag")
_EMBEDDED = ("changes_consumed", "dead_letters", "dead_letters_dropped", "transitions",
             "oldest_pending", "oldest_stuck", "runs", "runs_finished", "pending_seconds", "pending_open",
             "packed_runs", "packed_bytes", "derivations")
PROCESS_FAMILIES: dict[str, tuple[str, ...]] = {
    "reduce": _REDUCER,
    "sink-index": _SINK,
    "sink-adx": _SINK,  # and the ADX sink's own collector (tracker_adx_*), registered by the sink
    "serve": (*_REDUCER, *_SINK),
    "serve-embedded": _EMBEDDED,
    "watch": (),  # the watcher's collector (tracker_watch_*), registered by the watcher
}


def build_version() -> str:
    """The installed package's version ('unknown' when it runs from a tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("taugrid-tracker")
    except PackageNotFoundError:
        return "unknown"


class Metrics:
    """The metric families of one process (``process``: a key of ``PROCESS_FAMILIES``, or ``all``), in their own
    registry (so tests and benchmarks can hold several). Every family exists as an attribute; those not of the
    process are simply not registered, so a process never exports families that stay zero in it. Every process
    also exports ``tracker_build_info`` and the standard ``process_*`` families (CPU, memory, file descriptors)."""

    def __init__(self, process: str = "all") -> None:
        if process != "all" and process not in PROCESS_FAMILIES:
            raise ValueError(f"unknown process {process!r} (one of: all, {', '.join(PROCESS_FAMILIES)})")
        self.process = process
        r = self.registry = CollectorRegistry()
        self.build_info = Gauge("tracker_build_info", "The running tracker: 1, with its version, Python version and "
                                "process kind as labels.", ["version", "python", "process"], registry=None)
        self.build_info.labels(build_version(), platform.python_version(), process).set(1)
        self.changes_consumed = Counter("tracker_changes_consumed_total", "Change records folded by the reducer.",
                                        ["partition"], registry=None)
        self.records_produced = Counter("tracker_records_produced_total",
                                        "Records committed to Kafka, by topic.", ["topic"], registry=None)
        self.fold_seconds = Histogram("tracker_fold_seconds", "Time to fold and flush one batch of changes.",
                                      buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5),
                                      registry=None)
        self.transaction_seconds = Histogram("tracker_transaction_seconds",
                                             "One consume-transform-produce transaction, begin to commit.",
                                             buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30),
                                             registry=None)
        self.transactions = Counter("tracker_transactions_total", "Transactions by outcome.", ["outcome"],
                                    registry=None)
        self.consumer_lag = Gauge("tracker_consumer_lag", "Records not yet processed, per partition.",
                                  ["group", "topic", "partition"], registry=None)
        self.dead_letters = Counter("tracker_dead_letters_total", "Inputs that could not be used.", ["reason"],
                                    registry=None)
        self.dead_letters_dropped = Counter(
            "tracker_dead_letters_dropped_total",
            "Dead letters deleted with the oldest dead-letter file when the files were rotated.", registry=None)
        self.transitions = Counter("tracker_transitions_total", "Phase entries added to run histories.",
                                   ["phase"], registry=None)
        self.oldest_pending = Gauge("tracker_oldest_pending_admission_seconds",
                                    "Age of the oldest run waiting for admission, per LocalQueue (namespace/name).",
                                    ["queue"], registry=None)
        self.alerts = Counter("tracker_stalled_admission_alerts_total", "Stalled-admission alerts emitted "
                              "(stuck-run alerts of phase Admission).", ["queue"], registry=None)
        self.oldest_stuck = Gauge("tracker_oldest_stuck_seconds",
                                  "Time in the current phase of the oldest live run whose application has not "
                                  "started, per phase (Admission, Scheduling, Runtime) and LocalQueue "
                                  "(namespace/name), on alerts.metrics_clock.", ["phase", "queue"], registry=None)
        self.stuck_alerts = Counter("tracker_stuck_run_alerts_total", "Stuck-run alerts emitted, per phase and "
                                    "LocalQueue.", ["phase", "queue"], registry=None)
        self.pending_seconds = Counter("tracker_pending_seconds", "Seconds live runs' attempts spent before their "
                                       "application started, by category (README \"Every pending second\"): the "
                                       "ended pending spans, counted when a history shows them.", ["category"],
                                       registry=None)
        self.pending_open = Gauge("tracker_pending_open_seconds", "Summed age of the pending spans still going on, by "
                                  "category, on alerts.metrics_clock (with tracker_pending_seconds_total: every "
                                  "pending second up to now).", ["category"], registry=None)
        self.runs = Gauge("tracker_runs", "Runs held in memory by the reducer, by status.", ["status"], registry=None)
        self.packed_runs = Gauge("tracker_reducer_packed_runs", "Finished runs whose facts the reducer holds packed "
                                 "(compressed until a record changes them or they retire).", registry=None)
        self.packed_bytes = Gauge("tracker_reducer_packed_bytes", "Bytes of the reducer's packed facts.",
                                  registry=None)
        self.derivations = Gauge("tracker_reducer_derivations", "Runs whose derivation the reducer keeps between "
                                 "flushes: live runs, and finished ones wider than reduce.finished_derivation_rows.",
                                 registry=None)
        self.runs_finished = Counter("tracker_runs_finished_total", "Runs retired after a final status.",
                                     ["status"], registry=None)
        self.partitions = Gauge("tracker_partitions_assigned", "Partitions assigned and restored.", ["group"],
                                registry=None)
        self.restore_seconds = Histogram("tracker_restore_seconds", "Restoring one partition's runs.",
                                         buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=None)
        self.sink_rows = Counter("tracker_sink_rows_changed_total", "Rows changed by a sink.", ["sink"],
                                 registry=None)
        self.sink_histories = Counter("tracker_sink_histories_total", "Run histories written by a sink.",
                                      ["sink"], registry=None)
        self.sink_bad_records = Counter("tracker_sink_bad_records_total",
                                        "Transitions records a sink could not decode (skipped).", ["sink"],
                                        registry=None)
        self.sink_write_seconds = Histogram("tracker_sink_write_seconds", "One sink write, offsets included.",
                                            ["sink"], registry=None)
        self.errors = Counter("tracker_errors_total", "Recovered errors, by component and kind.",
                              ["component", "kind"], registry=None)
        families = ({name for names in PROCESS_FAMILIES.values() for name in names} if process == "all"
                    else set(PROCESS_FAMILIES[process]))
        for name in dict.fromkeys([*_COMMON, *sorted(families)]):
            r.register(getattr(self, name))
        ProcessCollector(registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# ------------------------------------------------------------------------------------------ health


class Health:
    """Readiness of the process's components; ``/readyz`` answers 200 only when all are ready."""

    def __init__(self) -> None:
        self._checks: dict[str, Callable[[], bool]] = {}

    def register(self, name: str, ready: Callable[[], bool]) -> None:
        self._checks[name] = ready

    def not_ready(self) -> list[str]:
        return sorted(name for name, ready in self._checks.items() if not ready())


class OpsServer:
    """GET /metrics, /healthz and /readyz on ``host:port`` (loopback by default); nothing else."""

    def __init__(self, settings: OpsSettings, *, metrics: Metrics, health: Health) -> None:
        self.settings = settings
        self.metrics = metrics
        self.health = health
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int | None:
        if self._server is None or not self._server.sockets:
            return None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        if self.settings.metrics_port is None:
            return
        self._server = await asyncio.start_server(self._handle, self.settings.metrics_host, self.settings.metrics_port,
                                                  limit=_MAX_REQUEST_BYTES)
        log.info("ops_endpoint_listening", host=self.settings.metrics_host, port=self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.http_timeout_s):
                    await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.settings.http_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b"\r\n", 1)[0].split()
            method, path = (parts[0], parts[1].split(b"?", 1)[0]) if len(parts) >= 2 else (b"", b"")
            status, ctype, body = self._respond(method, path)
            writer.write(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                         % (status, ctype.encode(), len(body)) + body)
            async with asyncio.timeout(self.settings.http_timeout_s):
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    def _respond(self, method: bytes, path: bytes) -> tuple[bytes, str, bytes]:
        text = "text/plain; charset=utf-8"
        if method != b"GET":
            return b"405 Method Not Allowed", text, b"GET only\n"
        if path == b"/metrics":
            return b"200 OK", CONTENT_TYPE_LATEST, self.metrics.exposition()
        if path == b"/healthz":
            return b"200 OK", text, b"ok\n"
        if path == b"/readyz":
            waiting = self.health.not_ready()
            if waiting:
                return b"503 Service Unavailable", text, ("not ready: " + ", ".join(waiting) + "\n").encode()
            return b"200 OK", text, b"ready\n"
        return b"404 Not Found", text, b"try /metrics, /healthz or /readyz\n"


# ------------------------------------------------------------------------------------------ shutdown


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Shutdown:
    """The first SIGTERM, SIGINT or SIGHUP asks for a graceful stop (the process then exits 0, or with the code of
    the error that stopped it); a second one exits at once with 128 + its number, the timeout
    (``ops.shutdown_timeout_s``) with 1. SIGHUP stops rather than reloads: nothing reloads its settings.

    A signal within ``REPEAT_S`` of the first counts as the same one: ``uv run`` forwards the terminal's Ctrl-C
    to a process that the terminal signals too, and ``timeout`` signals the whole process group."""

    REPEAT_S = 1.0

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.requested = asyncio.Event()
        self._first = 0.0

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self.requested.is_set():
            if time.monotonic() - self._first < self.REPEAT_S:
                return
            log.warning("second_signal_exiting", signal=sig.name)
            _force_exit(128 + sig.value)
        log.info("shutting_down_gracefully", signal=sig.name, timeout_s=self.timeout_s)
        self._first = time.monotonic()
        self.requested.set()

    async def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main``; once a stop is requested, give it ``timeout_s`` to finish, then exit the process. An error
        of ``main`` leaves wrapped in an ExceptionGroup (the task group's)."""
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(main)
            deadline = tg.create_task(self._exit_unless_done(task))
            task.add_done_callback(lambda _: deadline.cancel())
        return task.result()

    async def _exit_unless_done(self, task: asyncio.Task[Any]) -> None:
        await self.requested.wait()
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if not done:
            log.error("shutdown_timed_out", timeout_s=self.timeout_s)
            _force_exit(1)


def _force_exit(code: int) -> None:
    logging.shutdown()
    os._exit(code)
