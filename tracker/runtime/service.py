"""The service processes: `tracker reduce`, `tracker sink index`, `tracker serve`, `tracker topics create`.

``serve`` runs intake, reducer and sinks in one process. Its intake is any async iterator of ``(record, run key)``
(the watcher's, or ``capture_source`` replaying capture files). With Kafka configured the records are published to
``changes`` (keyed by run id) and the Kafka reducer and sinks run as tasks of this process, exactly as they would
as separate processes; without Kafka the embedded bounded pipeline (``tracker.runtime.pipeline``) is used.

Every process logs JSON, serves metrics and health when ``ops.metrics_port`` is set, and shuts down in data-flow
order on SIGTERM: intake stops, the reducer drains and commits, the sinks drain and store their offsets, then the
clients close. A second signal, or ``ops.shutdown_timeout_s`` running out, exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiokafka.errors import KafkaError

from tracker import errors
from tracker.core.model import DeadLetter
from tracker.runtime.embedded_metrics import EmbeddedMetrics
from tracker.runtime.ops import Health, Metrics, OpsServer, Shutdown, configure_logging, log_deprecated_env
from tracker.runtime.pipeline import PipelineReport
from tracker.runtime.reduce import ReduceService
from tracker.runtime.replay import Folded, capture_records, fold
from tracker.runtime.sinks import SinkRunner, adx_sink_runner, index_sink_runner
from tracker.settings import Settings, redacted
from tracker.shell import compiled_core, kafka, tasks
from tracker.shell.capture import BadRecord, Record, capture_files
from tracker.shell.changes import changes_producer
from tracker.shell.watch.keying import KeyedRecord, RunKeyer

log = structlog.get_logger("tracker.service")

SourceItem = KeyedRecord  # a record and its run key (None: not keyed)
Source = AsyncIterator[SourceItem]


# ------------------------------------------------------------------------------------------ intake


async def capture_source(paths: list[Path], max_held: int) -> Source:
    """Replay capture files (interleaved as ``tracker replay`` does), keyed by run, each object slimmed to what the
    reducer reads as the watcher slims it (a capture holds whole objects: managedFields, env values)."""
    files = capture_files(paths)
    if not files:
        raise errors.ConfigError("no capture files given (expected .json or .jsonl files or directories of them)")

    def keyed() -> Iterator[SourceItem]:
        keyer = RunKeyer(max_held)
        for item in capture_records(files):
            yield from keyer.key_record(item)
        yield from keyer.unkeyed()

    # read on a thread of its own: a capture on a pipe (``-``) may stay quiet for hours, and the loop must keep
    # answering probes and signals meanwhile
    async for out in tasks.in_thread(keyed(), name="capture-reader"):
        yield out


async def publish(source: Source, settings: Settings) -> int:
    """Send the source's records to ``changes`` (undecodable ones to ``dead-letters``); returns how many. Delivery,
    its window and its retry rule are ``tracker.shell.changes``'s (the watcher's too)."""
    sent = 0
    async with changes_producer(ks=settings.kafka, source=settings.source) as out:
        async for record, key in source:
            if isinstance(record, BadRecord):
                await out.dead_letter(DeadLetter(source=record.source, reason=record.reason, excerpt=record.excerpt))
            else:
                await out.publish(key, record.value, source=record.source)
            sent += 1
        await out.flush()
    return sent


# ------------------------------------------------------------------------------------------ processes


Body = Callable[[Metrics, Health, Shutdown], Coroutine[Any, Any, None]]
Errors = tuple[type[BaseException], ...]
# faults of the world outside, raised by libraries: they reach the top once a retry loop has given up on them
# (or where none applies), and stop the process as a ``Fatal`` does (tracker/errors.py has the whole tree)
OUTSIDE_FAULTS: Errors = (KafkaError, TimeoutError, OSError, sqlite3.Error)
FATAL: Errors = (errors.Fatal, *OUTSIDE_FAULTS)


async def run_process(settings: Settings, name: str, *, body: Body, fatal: Errors = FATAL) -> int:
    """Logging, metrics and health endpoint, signal handling around ``body``; the process's exit code.

    An error of a ``fatal`` type stops the process with one "stopped_by_an_error" line and exit code 1, also when
    it comes wrapped in exception groups (the ``TaskGroup`` of a body). Anything else (a bug) propagates with its
    traceback (with the fatal errors beside it, if any, logged first)."""
    configure_logging(settings.ops.log_level, settings.ops.log_format)
    log_deprecated_env(settings)
    _PRODUCER_LOG.addFilter(_NO_PAYLOADS)
    metrics, health = Metrics("serve-embedded" if name == "serve" and not settings.kafka.enabled else name), Health()
    server = OpsServer(settings.ops, metrics=metrics, health=health)
    shutdown = Shutdown(settings.ops.shutdown_timeout_s)
    shutdown.install()
    log.info("starting", process=name, core=compiled_core.check().describe(),
             settings=redacted(settings, changed_only=True))
    log.debug("settings", process=name, settings=redacted(settings))
    stopped_by: list[BaseException] = []
    try:
        try:
            await server.start()
            await shutdown.run(body(metrics, health, shutdown))
        except* fatal as group:
            stopped_by.extend(errors.leaves(group))
            log.error("stopped_by_an_error", process=name, error="; ".join(str(e) or repr(e) for e in stopped_by),
                      error_type=", ".join(dict.fromkeys(type(e).__name__ for e in stopped_by)))
    finally:
        await server.stop()
    if stopped_by:
        return 1
    log.info("stopped", process=name)
    return 0


class _NoPayloads(logging.Filter):
    """aiokafka's producer logs every record it sends at DEBUG, value and all; a value is an input record, which
    may hold secrets (a Pod's environment): only its size is logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Sending (key=%s value=%s) to %s" and isinstance(record.args, tuple) \
                and len(record.args) == 3:
            key, value, tp = record.args
            record.args = (key, f"<{len(value) if isinstance(value, (bytes, str)) else 0} bytes>", tp)
        return True


_PRODUCER_LOG = logging.getLogger("aiokafka.producer.producer")
_NO_PAYLOADS = _NoPayloads()


async def _until_stopped(main: Coroutine[Any, Any, None], shutdown: Shutdown, on_stop: Callable[[], None]) -> None:
    """Run ``main``; when a stop is requested before it ends, call ``on_stop`` (and wait for it still)."""
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(main)
        stopper = tg.create_task(_call_when_set(shutdown.requested, on_stop))
        task.add_done_callback(lambda _: stopper.cancel())


async def _call_when_set(event: asyncio.Event, call: Callable[[], None]) -> None:
    await event.wait()
    call()


def reduce_body(settings: Settings) -> Body:
    async def body(metrics: Metrics, health: Health, shutdown: Shutdown) -> None:
        service = ReduceService(settings, metrics=metrics, health=health)
        await _until_stopped(service.run(), shutdown, service.request_stop)
    return body


def sink_body(settings: Settings, *, index_path: Path | None, kind: str = "index", group: str | None = None
              ) -> Body:
    async def body(metrics: Metrics, health: Health, shutdown: Shutdown) -> None:
        runner = (adx_sink_runner(settings, metrics=metrics, health=health, group=group) if kind == "adx"
                  else index_sink_runner(settings, metrics=metrics, health=health, index_path=index_path))
        await _until_stopped(runner.run(), shutdown, runner.request_stop)
    return body


@dataclass(frozen=True, slots=True)
class ServeOptions:
    captures: tuple[Path, ...] = ()
    index_path: Path | None = None
    create_topics: bool = False
    exit_when_done: bool = False  # stop (gracefully) once the intake source is exhausted


def serve_body(settings: Settings, opts: ServeOptions, *, source: Source | None = None) -> Body:
    """``tracker serve``: ``source`` (default: the captures of ``opts``) -> reducer -> sinks."""
    async def body(metrics: Metrics, health: Health, shutdown: Shutdown) -> None:
        intake = source if source is not None else (
            capture_source(list(opts.captures), settings.source.max_held) if opts.captures else None)
        if settings.kafka.enabled:
            await _serve_kafka(settings, opts, intake, metrics, health, shutdown)
        else:
            if intake is None:
                raise errors.ConfigError("serve without Kafka needs an intake source (--from-capture PATH)")
            await _serve_embedded(settings, opts, intake, metrics, health, shutdown)
    return body


async def _serve_kafka(settings: Settings, opts: ServeOptions, intake: Source | None, metrics: Metrics,
                       health: Health, shutdown: Shutdown) -> None:
    ks = settings.kafka
    if opts.create_topics:
        log.info("topics", result=await kafka.create_topics(ks, kafka.topic_specs(ks.topics)))
    reducer = ReduceService(settings, metrics=metrics, health=health)
    runners: list[SinkRunner] = []
    if opts.index_path or settings.sink.index_path:
        runners.append(index_sink_runner(settings, metrics=metrics, health=health, index_path=opts.index_path))
    # Every part runs in this task group, but its error is returned, not raised (``_outcome``): a failing part
    # must not cancel the others, which stop in data-flow order instead (intake; the reducer, drained and
    # committed unless something failed; the sinks, drained and their offsets stored). The first error in that
    # order is raised once all have ended.
    async with asyncio.TaskGroup() as tg:
        reduce_task = tg.create_task(_outcome(reducer.run()))
        sink_tasks = [tg.create_task(_outcome(r.run())) for r in runners]
        intake_task = tg.create_task(_outcome(_intake(settings, intake))) if intake is not None else None
        stop = tg.create_task(shutdown.requested.wait())
        watched: set[asyncio.Future[Any]] = {stop, reduce_task, *sink_tasks}
        if intake_task is not None:
            watched.add(intake_task)
        try:
            while True:
                done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                if intake_task is not None and done == {intake_task} and intake_task.result() is None \
                        and not opts.exit_when_done:
                    watched.discard(intake_task)  # the source ended; keep reducing and sinking until stopped
                    continue
                break
        finally:
            stop.cancel()
        failed = [t for t in (reduce_task, *sink_tasks, intake_task) if t is not None and t.done() and t.result()]
        if intake_task is not None:
            intake_task.cancel()
            await asyncio.wait([intake_task])
        signalled = shutdown.requested.is_set()  # a part still connecting to Kafka gives up: nothing to drain
        reducer.request_stop(drain=not failed)
        if signalled:
            reducer.stop_connecting()
        await asyncio.wait([reduce_task])
        for runner in runners:
            runner.request_stop(drain=not failed)
            if signalled:
                runner.stop_connecting()
        if sink_tasks:
            await asyncio.wait(sink_tasks)
    for task in (intake_task, reduce_task, *sink_tasks):
        error = task.result() if task is not None and not task.cancelled() else None
        if error is not None:
            raise error


async def _outcome(part: Awaitable[None]) -> Exception | None:
    """Await ``part``; its error, returned rather than raised (None if it ended well)."""
    try:
        await part
    except Exception as exc:
        return exc
    return None


async def _intake(settings: Settings, source: Source) -> None:
    sent = await publish(source, settings)
    log.info("intake_source_exhausted", records=sent)


class _Handoff:
    """A bounded queue from the serve loop to the embedded pipeline's loop, on a thread of its own. A side that
    must wait (the getter on an empty queue, the putter on a full one) sleeps on an event of its own loop, which
    the other side sets through that loop: no polling. A waiter registers before it looks again, so no wakeup
    is lost between its look and its sleep."""

    def __init__(self, maxsize: int) -> None:
        self.items: queue.Queue[Record | BadRecord | None] = queue.Queue(maxsize=maxsize)
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._closed = False

    async def get(self) -> Record | BadRecord | None:
        """The next item; None at the end (a None put, or ``close`` and nothing queued)."""
        while True:
            try:
                item = self.items.get_nowait()
            except queue.Empty:
                if self._closed:
                    return None
                await self._wait_until(lambda: self._closed or not self.items.empty())
                continue
            self.wake()
            return item

    def close(self) -> None:
        """Nothing more comes: the getter drains what is queued, then gets None. Needs no room and no await, so it
        ends the pipeline whatever stopped the feeding side (a source that failed, a cancellation)."""
        self._closed = True
        self.wake()

    async def put(self, item: Record | BadRecord | None, *, closed: Callable[[], bool]) -> bool:
        """Put ``item``, waiting for room; False (not put) once ``closed()`` is true."""
        while not closed():
            try:
                self.items.put_nowait(item)
            except queue.Full:
                await self._wait_until(lambda: closed() or not self.items.full())
                continue
            self.wake()
            return True
        return False

    def wake(self) -> None:
        """Wake every waiter to look again (also after ``closed()`` became true)."""
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    async def _wait_until(self, ready: Callable[[], bool]) -> None:
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.append(waiter)
        try:
            if not ready():
                await waiter[1].wait()
        finally:
            with self._lock:
                self._waiters.remove(waiter)


async def _serve_embedded(settings: Settings, opts: ServeOptions, intake: Source, metrics: Metrics, health: Health,
                          shutdown: Shutdown) -> PipelineReport:
    """The embedded pipeline (``replay.fold``, the wiring ``tracker replay`` uses) on its own thread (its sinks are
    synchronous), fed through a bounded queue."""
    index_path = opts.index_path or settings.sink.index_path
    if index_path is None:
        raise errors.ConfigError("serve without Kafka needs an experiment index (--index PATH)")
    changes = _Handoff(settings.embedded.change_queue)

    async def records() -> AsyncIterator[Record | BadRecord]:
        # a live source is slow and bursty: the pipeline's loop awaits the next change (it is not blocked), so
        # the reducer flushes (and the index is written) as soon as the input runs dry
        while (item := await changes.get()) is not None:
            yield item

    gauges = EmbeddedMetrics(metrics, settings)

    def pipeline() -> Folded:
        # continue from the reducer state the index keeps; finished runs retire by ``reduce.retire_after_s``
        return fold(records(), index_path=index_path, settings=settings,
                    retire_after_s=settings.reduce.retire_after_s, on_restored=gauges.restored,
                    on_flush=gauges.flushed, on_dead_letters_dropped=metrics.dead_letters_dropped.inc)

    # the pipeline's error, if any, leaves through the task group; once it has ended nothing more is put
    async with asyncio.TaskGroup() as tg:
        running = tg.create_task(asyncio.to_thread(pipeline))
        running.add_done_callback(lambda _: changes.wake())
        health.register("embedded", lambda: not running.done())

        async def feed() -> None:
            async for item, _key in intake:
                if shutdown.requested.is_set() or not await changes.put(item, closed=running.done):
                    break

        try:  # until the source ends or a stop is asked for, even while the source waits for its next record
            feeding = tg.create_task(feed())
            stop = tg.create_task(shutdown.requested.wait())
            await asyncio.wait([feeding, stop], return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            feeding.cancel()
        finally:
            changes.close()  # the pipeline drains what is queued, flushes, closes (also when the source failed)
    folded = running.result()
    report, dead = folded.report, folded.dead_letters
    log.info("embedded_pipeline_done", records=report.records, runs_written=report.runs_written,
             dead_letters=report.dead_letters, dead_letters_dropped=dead.dropped, dead_letter_file=str(dead.path))
    return report


async def create_topics(settings: Settings) -> dict[str, str]:
    return await kafka.create_topics(settings.kafka, kafka.topic_specs(settings.kafka.topics))
