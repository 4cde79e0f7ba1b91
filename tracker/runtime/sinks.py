"""History sinks fed from the ``transitions`` topic: ``tracker sink index`` and a runner for any other sink.

Each sink is its own consumer group, so a slow or failed sink never stalls the reducer or another sink: it only
falls behind (``tracker_consumer_lag``) and catches up from where it stopped. Transitions records carry the parts of
a run (its history, its metric points, each of its pods: ``tracker.shell.transitions``), so a batch is combined
into one update per run before it is written, and writing one again is harmless (rows are upserted).

Where a sink stores its consumer offsets decides the guarantee:

- a sink that can keep offsets with its data (``OffsetStoringSink``, e.g. the SQLite experiment index) gets them
  in the same transaction as the rows, and on start the runner seeks to the offsets the sink holds, never to the
  Kafka-committed ones: the sink reflects every transaction of the reducer exactly once;
- any other ``HistorySink`` (e.g. Azure Data Explorer) is written first and the offsets are committed to Kafka
  after: at least once, which upserts keyed by each part make idempotent.

The sink object is opened, used and closed on one dedicated thread (SQLite connections belong to their thread),
so a slow write never blocks the event loop's heartbeats. A failing write is retried (capped, with backoff); an
``errors.InvalidInput`` is the sink refusing data, not a transient failure: the batch is then written run by run and
only the refused updates are skipped (``tracker_sink_bad_records_total``), so one bad update cannot stall a sink. A
record that does not decode (``transitions.BadTransition``) is skipped the same way. Any other error, a builtin
``ValueError`` or ``TypeError`` included, is a bug or a fault: it is retried, then stops the sink (``SinkFatal``),
and the offset of what it was writing is not committed.

Kueue's queues travel on the same topic (a queue's newest state, a pending run's newest position:
``tracker.shell.transitions.decode_queue``). A sink that keeps them (``QueueStore``: the index, ADX) gets a batch's
newest of each through ``write_queues`` before its histories; a sink that does not skips them. Their rows are
newest-wins upserts (the index) or newest by revision (ADX), so writing them again after a restart changes nothing.
The Nodes' newest states travel and are written the same way (``decode_node``; ``NodeStore.write_nodes``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tracker import errors
from tracker.core.model import HistoryUpdate
from tracker.core.nodes import NodeState
from tracker.core.queues import QueuePosition, QueueState
from tracker.runtime.ops import Health, Metrics
from tracker.runtime.pipeline import HistorySink, NodeStore, QueueStore
from tracker.settings import Settings
from tracker.shell import kafka, transitions
from tracker.shell.index_lock import WaitStopped

if TYPE_CHECKING:
    from tracker.shell.adx import AdxSink

T = TypeVar("T")
log = structlog.get_logger("tracker.sinks")

OffsetKey = tuple[str, str, int]  # (consumer group, topic, partition)


@runtime_checkable
class OffsetStoringSink(Protocol):
    """A sink that stores consumer offsets atomically with the histories (``ExperimentIndex`` is one)."""

    def write(self, updates: Sequence[HistoryUpdate], offsets: Mapping[OffsetKey, int] | None = None) -> int: ...

    def offsets(self, group: str) -> dict[tuple[str, int], int]: ...


SinkOpener = Callable[[], AbstractContextManager[HistorySink | OffsetStoringSink]]


class SinkFatal(errors.GaveUp):
    """A sink failed more often in a row than ``sink.max_retries``."""


class SinkRunner:
    """Consumes ``transitions`` in consumer group ``group`` and writes the histories to one sink."""

    def __init__(self, name: str, *, open_sink: SinkOpener, group: str, settings: Settings, metrics: Metrics,
                 health: Health, group_instance_id: str | None = None) -> None:
        self.name = name
        self.open_sink = open_sink
        self.group = group
        self.group_instance_id = group_instance_id
        self.s = settings
        self.ks = settings.kafka
        self.metrics = metrics
        self._sink: HistorySink | OffsetStoringSink | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sink-{name}")
        self._positions: dict[TopicPartition, int] = {}
        self._pending: set[TopicPartition] = set()
        self._joined = False
        self._lock = asyncio.Lock()
        self._drain = kafka.Drain()
        self.stopping = threading.Event()  # set by ``stop_connecting``: ends a wait of ``open_sink`` (index_lock)
        self._consumer: AIOKafkaConsumer | None = None
        self._setup_failures = 0
        self._retry_at = 0.0
        self._last_tick = 0.0
        health.register(f"sink-{name}", self.ready)

    def ready(self) -> bool:
        return self._joined and not self._pending

    def request_stop(self, drain: bool = False) -> None:
        """Stop after the batch in hand (``drain``: once caught up with the transitions written so far); asked to
        stop now (not to drain), a sink still waiting to open (for the index's writer role) stops waiting."""
        self._drain.request(drain)
        if not drain:
            self.stop_connecting()

    def stop_connecting(self) -> None:
        """Give up opening the sink and connecting to Kafka if neither is done yet (a signal): ``run`` returns."""
        self._drain.give_up_connecting.set()
        self.stopping.set()

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    # ------------------------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        stack = ExitStack()
        try:
            self._sink = await self._call(lambda: stack.enter_context(self.open_sink()))
        except WaitStopped as exc:  # a stop request while it stood by for the index's writer role
            self._thread.shutdown(wait=True)
            log.info("sink_stopped", sink=self.name, detail=str(exc))
            return
        try:
            consumer = await kafka.retrying("connecting to Kafka", self._connect, retries=self.s.sink.max_retries,
                                            backoff_max_s=self.s.sink.retry_backoff_max_s,
                                            stop=self._drain.give_up_connecting)
            if consumer is None:  # asked to stop while Kafka did not answer yet
                log.info("sink_stopped", sink=self.name, before="connecting to Kafka")
                return
            try:
                consumer.subscribe([self.ks.topics.transitions], listener=kafka.Rebalance(self))
                log.info("sink_started", sink=self.name, group=self.group,
                         offsets="stored with the data" if self._stores_offsets else "committed to Kafka")
                await self._loop(consumer)
            finally:
                await kafka.stop(consumer, self.ks, what=f"{self.name} sink consumer")
        finally:
            await self._call(stack.close)
            self._thread.shutdown(wait=True)
        log.info("sink_stopped", sink=self.name)

    async def _connect(self) -> AIOKafkaConsumer:
        await kafka.verify_topics(self.ks, ("transitions",))
        consumer = self._consumer = kafka.make_consumer(
            self.ks, group_id=self.group, group_instance_id=self.group_instance_id,
            max_poll_records=self.s.sink.max_batch_records)
        await kafka.start(consumer, self.ks, what=f"{self.name} sink consumer")
        return consumer

    @property
    def _stores_offsets(self) -> bool:
        return isinstance(self._sink, OffsetStoringSink)

    async def _loop(self, consumer: AIOKafkaConsumer) -> None:
        cfg = self.s.sink
        poller = kafka.Poller(consumer, self.ks, what="polling transitions", timeout_ms=cfg.poll_timeout_ms,
                              max_records=cfg.max_batch_records, retries=cfg.max_retries,
                              backoff_max_s=cfg.retry_backoff_max_s,
                              on_failure=self.metrics.errors.labels(f"sink-{self.name}", "poll").inc,
                              fatal=SinkFatal, sink=self.name)
        while not await self._drain.done(consumer, self.ks, joined=self._joined,
                                         settled=lambda _targets: not self._pending):
            await self._set_up_pending(consumer)
            batches = await poller.poll()
            if batches is None:
                continue
            if batches:
                async with self._lock:
                    await self._write(consumer, batches)
            await self._tick(consumer)

    def _backoff(self, attempt: int) -> float:
        return kafka.backoff_s(attempt, self.s.sink.retry_backoff_max_s)

    # ------------------------------------------------------------------------------------ rebalance
    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self._lock:  # waits for the write in flight
            self._pending |= revoked

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        async with self._lock:
            self._positions = {tp: p for tp, p in self._positions.items() if tp in assigned}
            self._pending = set(assigned)
            if self._consumer is not None and assigned:
                self._consumer.pause(*assigned)
            self._joined = True
        log.info("partitions_assigned", sink=self.name, partitions=sorted(tp.partition for tp in assigned))

    async def _set_up_pending(self, consumer: AIOKafkaConsumer) -> None:
        if not self._pending or time.monotonic() < self._retry_at:
            return
        async with self._lock:
            pending = sorted(self._pending)
            if not pending:
                return
            try:
                starts = await self._start_offsets(consumer, pending)
            except (KafkaError, TimeoutError, OSError) as exc:
                self._setup_failures += 1
                self.metrics.errors.labels(f"sink-{self.name}", "offsets").inc()
                if self._setup_failures > self.s.sink.max_retries:
                    raise SinkFatal(f"{self.name} sink: reading start offsets failed {self._setup_failures} times "
                                    f"in a row: {exc!r}") from exc
                self._retry_at = time.monotonic() + self._backoff(self._setup_failures)
                log.warning("start_offsets_read_failed", sink=self.name, error=str(exc))
                return
            self._setup_failures = 0
            for tp in pending:
                consumer.seek(tp, starts[tp])
                self._positions[tp] = starts[tp]
            self._pending.clear()
            consumer.resume(*pending)
        log.info("positioned", sink=self.name, offsets={tp.partition: starts[tp] for tp in pending})

    async def _start_offsets(self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        sink = self._sink
        if isinstance(sink, OffsetStoringSink):
            stored = await self._call(lambda: sink.offsets(self.group))
            found = {tp: stored.get((tp.topic, tp.partition)) for tp in tps}
        else:
            found = {tp: await kafka.bounded(consumer.committed(tp), self.ks.call_timeout_s, what=f"committed {tp}")
                     for tp in tps}
        missing = [tp for tp, off in found.items() if off is None]
        begin: dict[TopicPartition, int] = (await kafka.bounded(
            consumer.beginning_offsets(missing), self.ks.call_timeout_s, what="beginning offsets")) if missing else {}
        return {tp: off if off is not None else begin[tp] for tp, off in found.items()}

    # ------------------------------------------------------------------------------------ writing
    async def _write(self, consumer: AIOKafkaConsumer, batches: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        updates: list[HistoryUpdate] = []
        queues: dict[str, QueueState] = {}  # the newest of each queue and position in the batch (partition order)
        positions: dict[str, QueuePosition] = {}
        nodes: dict[str, NodeState] = {}  # likewise, of each Node
        offsets: dict[TopicPartition, int] = {}
        for tp, records in batches.items():
            if tp in self._pending or tp not in self._positions:
                continue
            fresh = [r for r in records if r.offset >= self._positions[tp]]
            for rec in fresh:
                try:
                    if transitions.is_node_record(rec.headers):
                        node = transitions.decode_node(rec.key, rec.value, rec.headers)
                        nodes[node.key] = node
                        continue
                    if transitions.is_queue_record(rec.headers):
                        item = transitions.decode_queue(rec.key, rec.value, rec.headers)
                        if isinstance(item, QueueState):
                            queues[item.key] = item
                        else:
                            positions[item.run_id] = item
                        continue
                    updates.append(transitions.decode(rec.key, rec.value, rec.headers))
                except errors.InvalidInput as exc:  # a record that is not one: skipped; a bug is not
                    self.metrics.sink_bad_records.labels(self.name).inc()
                    log.error("transitions_record_undecodable", sink=self.name, partition=tp.partition,
                              offset=rec.offset, error=str(exc)[:500])
            if fresh:
                offsets[tp] = fresh[-1].offset + 1
        if not offsets:
            return
        stored = {(self.group, tp.topic, tp.partition): off for tp, off in offsets.items()}
        combined = transitions.combine(updates)
        changed = await self._write_queues(list(queues.values()), list(positions.values()), list(nodes.values()))
        changed += await self._write_with_retries(combined, stored if self._stores_offsets else {})
        if not self._stores_offsets:
            try:
                await kafka.bounded(consumer.commit(offsets), self.ks.call_timeout_s, what="committing sink offsets")
            except (KafkaError, TimeoutError) as exc:  # written already; the next owner rewrites (idempotent)
                self.metrics.errors.labels(f"sink-{self.name}", "commit").inc()
                log.warning("offsets_commit_failed", sink=self.name,
                            error=str(exc))
        self._positions.update(offsets)
        self.metrics.sink_rows.labels(self.name).inc(changed)
        self.metrics.sink_histories.labels(self.name).inc(sum(1 for u in combined if u.history is not None))

    async def _write_with_retries(self, updates: list[HistoryUpdate], stored: dict[OffsetKey, int]) -> int:
        """Write with capped retries. An ``errors.InvalidInput`` is the sink refusing the data (not a transient
        failure): the batch is written run by run and only the refused updates are skipped, so one bad update cannot
        stall the sink."""
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            try:
                changed = await self._write_once(updates, stored)
            except errors.InvalidInput as exc:
                if len(updates) > 1:
                    return await self._isolate(updates, stored)
                self.metrics.sink_bad_records.labels(self.name).inc()
                log.error("history_refused", sink=self.name,
                          run_id=updates[0].run_id if updates else None, error=str(exc)[:500])
                return await self._write_with_retries([], stored) if updates else 0
            except Exception as exc:  # any sink's failure (SQLite, network, service): retried, then fatal
                self.metrics.errors.labels(f"sink-{self.name}", "write").inc()
                if attempt > self.s.sink.max_retries:
                    raise SinkFatal(f"{self.name} sink: write failed {attempt} times in a row: {exc!r}") from exc
                log.warning("sink_write_retrying", sink=self.name, attempt=attempt, error=repr(exc))
                await asyncio.sleep(self._backoff(attempt))
                continue
            self.metrics.sink_write_seconds.labels(self.name).observe(time.perf_counter() - started)
            return changed

    async def _write_queues(self, queues: list[QueueState], positions: list[QueuePosition],
                            nodes: list[NodeState]) -> int:
        """Queues, positions and Nodes to a sink that keeps them (before the histories and offsets: a repeat after a
        crash is a newest-wins upsert), with the retries of histories; an ``errors.InvalidInput`` skips them (counted
        as bad records)."""
        sink = self._sink
        keeps_queues = bool(queues or positions) and isinstance(sink, QueueStore)
        keeps_nodes = bool(nodes) and isinstance(sink, NodeStore)
        if not (keeps_queues or keeps_nodes):
            return 0

        def write() -> int:
            n = sink.write_queues(queues, positions) if keeps_queues and isinstance(sink, QueueStore) else 0
            return n + (sink.write_nodes(nodes) if keeps_nodes and isinstance(sink, NodeStore) else 0)

        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._call(write)
            except errors.InvalidInput as exc:
                self.metrics.sink_bad_records.labels(self.name).inc(len(queues) + len(positions) + len(nodes))
                log.error("queues_refused", sink=self.name, error=str(exc)[:500])
                return 0
            except Exception as exc:
                self.metrics.errors.labels(f"sink-{self.name}", "write").inc()
                if attempt > self.s.sink.max_retries:
                    raise SinkFatal(f"{self.name} sink: writing queues failed {attempt} times in a row: {exc!r}") \
                        from exc
                log.warning("sink_write_retrying", sink=self.name, attempt=attempt, error=repr(exc))
                await asyncio.sleep(self._backoff(attempt))

    async def _isolate(self, updates: list[HistoryUpdate], stored: dict[OffsetKey, int]) -> int:
        changed = sum([await self._write_with_retries([u], {}) for u in updates])
        return changed + await self._write_with_retries([], stored)

    async def _write_once(self, updates: list[HistoryUpdate], stored: dict[OffsetKey, int]) -> int:
        sink = self._sink
        if isinstance(sink, OffsetStoringSink):
            return await self._call(lambda: sink.write(updates, stored))
        assert sink is not None
        return await self._call(lambda: sink.write(updates)) if updates else 0

    async def _tick(self, consumer: AIOKafkaConsumer) -> None:
        now = time.monotonic()
        if now - self._last_tick < self.s.ops.metrics_interval_s:
            return
        self._last_tick = now
        for tp in self._positions:
            end = consumer.last_stable_offset(tp)
            if end is not None and tp not in self._pending:
                position = await kafka.bounded(consumer.position(tp), self.ks.call_timeout_s, what=f"position of {tp}")
                self.metrics.consumer_lag.labels(self.group, tp.topic, str(tp.partition)).set(max(0, end - position))


def index_sink_runner(settings: Settings, *, metrics: Metrics, health: Health,
                      index_path: Path | None = None) -> SinkRunner:
    """The experiment-index sink of ``tracker sink index``."""
    from tracker.shell.index import ExperimentIndex

    path = index_path or settings.sink.index_path
    if path is None:
        raise errors.ConfigError("no experiment index path (--index, or TRACKER_SINK__INDEX_PATH)")
    identity = settings.index.identity(default_cluster=settings.adx.source_cluster)
    # one writer per index; a second sink on the same file stands by (waits without a bound) until the first exits,
    # or until it is asked to stop (``runner.stopping``: the first SIGTERM)
    def open_sink() -> ExperimentIndex:
        index = ExperimentIndex(path, identity=identity, writer_wait_s=None, on_wait=_standing_by,
                                stop_waiting=runner.stopping).open()
        try:
            index.set_clock(recorded=False)  # a live writer: readers read it at the wall clock
        except BaseException:
            index.close()
            raise
        return index

    runner = SinkRunner("index", open_sink=open_sink,
                        group=settings.sink.index_group,
                        settings=settings, metrics=metrics, health=health,
                        group_instance_id=settings.sink.group_instance_id)
    return runner


def _standing_by(line: str) -> None:
    log.warning("sink_index_waits_for_writer", detail=line)


ADX_SINK_GROUP = "tracker-sink-adx"


def adx_sink_runner(settings: Settings, *, metrics: Metrics, health: Health, group: str | None = None
                    ) -> SinkRunner:
    """The Azure Data Explorer sink of ``tracker sink adx`` (settings: ``adx``); Kafka commits its
    offsets after each write, and the Dedup views absorb the repeats of an at-least-once delivery."""
    from tracker.shell.adx import AdxSink

    adx = settings.adx
    collector = AdxCollector()
    metrics.registry.register(collector)

    def open_sink() -> AdxSink:
        sink = collector.sink = AdxSink(adx)
        return sink

    return SinkRunner("adx", open_sink=open_sink, group=group or ADX_SINK_GROUP, settings=settings,
                      metrics=metrics, health=health, group_instance_id=settings.sink.group_instance_id)


class AdxCollector:
    """The ADX sink's own families, read from its statistics at scrape time: rows sent, retried and rejected,
    and its spool (files, bytes, age of the oldest file), so that an alert sees an outage the sink rides out."""

    def __init__(self) -> None:
        self.sink: AdxSink | None = None

    def collect(self) -> Iterator[Metric]:
        sink = self.sink
        if sink is None:
            return
        st = sink.stats
        for name, value, text in (("rows_sent", st.rows_sent, "Rows Kusto accepted."),
                                  ("ingestion_retries", st.retries, "Failed ingestion calls that were retried."),
                                  ("rows_spooled", st.spooled_rows, "Rows that went through the spool."),
                                  ("rows_rejected", st.rejected_rows, "Rows Kusto refused as permanently invalid "
                                   "(kept in the spool's rejected/ directory).")):
            yield CounterMetricFamily(f"tracker_adx_{name}", text, value=value)
        yield GaugeMetricFamily("tracker_adx_spool_files", "Files in the spool (chunks waiting for Kusto).",
                                value=st.spool_files)
        yield GaugeMetricFamily("tracker_adx_spool_bytes", "Bytes in the spool.", value=st.spool_bytes)
        yield GaugeMetricFamily("tracker_adx_spool_oldest_age_seconds",
                                "Age of the oldest chunk in the spool (0 when it is empty).",
                                value=sink.spool_oldest_age_s())
