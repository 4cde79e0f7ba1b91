"""`tracker reduce`: the reducer as a Kafka consumer group, exactly once.

One process (or several, in one consumer group) reads ``changes`` read_committed. Each assigned partition gets
its own ``Reducer`` and its own transactional producer (transactional id ``<prefix>.<changes topic>.<partition>``,
so whoever takes a partition over fences the previous owner and aborts its open transaction). A poll's records of
one partition are folded, and then ONE transaction carries everything they caused and the consumed offset:

- ``transitions``: the complete current RunHistory of each run whose content changed (header ``content-hash``,
  the sha256 of the value); a run folded without any change of content produces nothing;
- ``run-state``: ``Reducer.snapshot_run`` of every run the records touched, plus the shell's own per-run state
  (``shell``: last content hash, alerts already sent, the partition's event-time watermark);
- Kueue's queues and the Nodes: the newest state of each queue, each pending run's newest position and each
  Node's newest state that changed, on ``transitions`` (kinds ``queue``, ``position`` and ``node``) and in
  ``run-state`` (the same keys, with their hash), so a new owner restores the partition's queues and Nodes with its
  runs;
- ``dead-letters`` and ``alerts``;
- the offsets, through ``send_offsets_to_transaction``.

What a transaction carries is decided by ``tracker.core.publish`` (pure, tested without Kafka: the content hash,
the watermark, stuck alerts, retirement); this module turns its decisions into records and runs the transactions.
A crash at any point leaves either all of it or none of it; the next owner restores the partition's runs from
``run-state`` (read to its end) and resumes at the committed offset, so each history is published exactly once.
The outputs go to the input's partition number (one partition count): a run's state is beside its changes.

Runs whose history is final for good are retired by the reducer itself, by the one policy the embedded pipeline
uses too (``ReducerLimits.retire_after_us``, see ``tracker.core.reducer``): once the partition's event-time
watermark (the earliest of its watch streams' latest creationTimestamp) is ``reduce.retire_after_s`` past the
run's last change, decided per record so that where polls cut the stream does not matter. Their run-state record
becomes the reducer's retired marker in the transaction of that batch. When the reducer forgets a retired run
(``max_retired``), its run-state key gets a Kafka tombstone, so compaction removes it.

Stuck runs (``tracker.core.stuck``, as ``tracker runs --stuck``): a live run pending in Admission, Scheduling or
Runtime is stuck for ``clock - since`` (its entry into the phase). The oldest age per phase and LocalQueue is
``tracker_oldest_stuck_seconds`` on ``alerts.metrics_clock`` (wall by default); Admission's, as ``clock -
queued_at`` (the live admission wait), also ``tracker_oldest_pending_admission_seconds`` on ``alerts.clock``. Every
pending second (``tracker.core.pending``): the ended spans' seconds by category are counted in
``tracker_pending_seconds_total`` once the transaction of the history showing them commits, the open spans' summed
age by category is ``tracker_pending_open_seconds`` on ``alerts.metrics_clock``. A ``StuckRunAlert`` goes to the
alerts topic when the age reaches the phase's threshold (``alerts.stalled_admission_s``, ``stuck_scheduling_s``,
``stuck_runtime_s``) by ``alerts.clock``: ``event`` (the default) is the partition's watermark, the latest
transition time of any history it produced, persisted in run-state; it depends on the input only (a replay of last
week alerts as the live run did) but stands still while the partition is quiet. ``wall`` is this host's clock,
checked every ``check_interval_s`` too. Each (run, attempt, phase) is alerted once: the alert and the run-state
record that remembers it share a transaction.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from tracker import errors
from tracker.core import stuck, wire
from tracker.core.limits import ReducerLimits
from tracker.core.model import DeadLetter, Phase, Status
from tracker.core.publish import Decisions, Limits, PartitionPolicy, content_hash
from tracker.core.reducer import Flushed, Reducer
from tracker.core.stuck import STUCK_RUN_SCHEMA, StalledAdmissionAlert, StuckRunAlert
from tracker.core.waits import PENDING_CATEGORIES
from tracker.runtime import run_state
from tracker.runtime.ops import Health, Metrics
from tracker.settings import Settings
from tracker.shell import jsonio, kafka, kafka_batches

log = structlog.get_logger("tracker.reduce")

ALERT_SCHEMA: Literal["taugrid.io/stuck-run-alert/v1"] = STUCK_RUN_SCHEMA
__all__ = ["ALERT_SCHEMA", "ReduceFatal", "ReduceService", "StalledAdmissionAlert", "StuckRunAlert", "content_hash"]
_OUTPUT_MARGIN = 1_024  # bytes kept free under max.message.bytes for the record's key, headers and framing


class ReduceFatal(errors.GaveUp):
    """The reducer cannot go on (a partition failed more often than ``max_retries``)."""


@dataclass(slots=True)
class _Partition:
    tp: TopicPartition
    producer: AIOKafkaProducer
    reducer: Reducer
    position: int = 0  # next offset to fold
    policy: PartitionPolicy = field(default_factory=PartitionPolicy)  # runs' shells, stuck runs, watermark


_Out = kafka_batches.Out  # a record of a transaction


@dataclass(slots=True)
class _Plan:
    """Everything one transaction of a partition writes, and the metrics to count once it is committed."""

    records: list[_Out] = field(default_factory=list)
    phases: Counter[str] = field(default_factory=Counter)
    dead: Counter[str] = field(default_factory=Counter)
    alerts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (phase, queue)
    finished: Counter[str] = field(default_factory=Counter)
    pending: dict[str, float] = field(default_factory=dict)  # ended pending seconds, by category


class ReduceService:
    def __init__(self, settings: Settings, *, metrics: Metrics, health: Health) -> None:
        self.s = settings
        self.ks = settings.kafka
        self.topics = settings.kafka.topics
        self.metrics = metrics
        self.limits: ReducerLimits = settings.reduce.reducer_limits()
        self._parts: dict[TopicPartition, _Partition] = {}
        self._pending: set[TopicPartition] = set()  # assigned, not (yet) set up and verified
        self._fenced: set[TopicPartition] = set()  # taken over by another process; wait for the rebalance
        self._failures: dict[TopicPartition, tuple[int, float]] = {}  # tp -> (failures in a row, retry at)
        self._joined = False
        self._lock = asyncio.Lock()  # one batch, restore or rebalance step at a time
        self._drain = kafka.Drain()
        self._consumer: AIOKafkaConsumer | None = None
        self._restorer: AIOKafkaConsumer | None = None
        self._last_tick = 0.0
        self._last_wall_check = 0.0
        self._queues: set[str] = set()
        self._stuck_keys: set[tuple[str, str]] = set()
        health.register("reduce", self.ready)

    # ------------------------------------------------------------------------------------ lifecycle
    def ready(self) -> bool:
        return self._joined and not self._pending

    def request_stop(self, drain: bool = False) -> None:
        """Stop after the batch in hand (``drain``: once every assigned partition is caught up)."""
        self._drain.request(drain)

    def stop_connecting(self) -> None:
        """Give up a connection to Kafka not made yet (a signal while the broker does not answer): ``run`` returns."""
        self._drain.give_up_connecting.set()

    async def run(self) -> None:
        rs = self.s.reduce
        clients = await kafka.retrying("connecting to Kafka", self._connect, retries=rs.max_retries,
                                       backoff_max_s=rs.retry_backoff_max_s, stop=self._drain.give_up_connecting)
        if clients is None:  # asked to stop while Kafka did not answer yet
            log.info("reducer_stopped", before="connecting to Kafka")
            return
        consumer, restorer = clients
        try:
            consumer.subscribe([self.topics.changes], listener=kafka.Rebalance(self))
            log.info("reducer_started", group=rs.group_id, topic=self.topics.changes)
            await self._loop(consumer)
        finally:
            async with self._lock:
                for tp in list(self._parts):
                    await self._drop(tp)
            await kafka.stop(consumer, self.ks, what="changes consumer")
            await kafka.stop(restorer, self.ks, what="run-state reader")
        log.info("reducer_stopped")

    async def _connect(self) -> tuple[AIOKafkaConsumer, AIOKafkaConsumer]:
        """Check the topic layout; start the group consumer of changes and the run-state reader."""
        await kafka.verify_topics(self.ks, ("changes", "transitions", "run_state", "dead_letters", "alerts"))
        rs = self.s.reduce
        restorer = self._restorer = kafka.make_consumer(self.ks, group_id=None, max_poll_records=10_000)
        await kafka.start(restorer, self.ks, what="run-state reader")
        consumer = self._consumer = kafka.make_consumer(self.ks, group_id=rs.group_id,
                                                        group_instance_id=rs.group_instance_id,
                                                        max_poll_records=rs.batch_records,
                                                        fetch_min_bytes=rs.fetch_min_bytes,
                                                        fetch_max_wait_ms=rs.fetch_max_wait_ms)
        try:
            await kafka.start(consumer, self.ks, what="changes consumer")
        except BaseException:
            await kafka.stop(restorer, self.ks, what="run-state reader")
            raise
        return consumer, restorer

    async def _loop(self, consumer: AIOKafkaConsumer) -> None:
        rs = self.s.reduce
        poller = kafka.Poller(consumer, self.ks, what="polling changes", timeout_ms=rs.poll_timeout_ms,
                              max_records=rs.batch_records, retries=rs.max_retries,
                              backoff_max_s=rs.retry_backoff_max_s,
                              on_failure=self.metrics.errors.labels("reduce", "poll").inc, fatal=ReduceFatal)
        while not await self._drain.done(consumer, self.ks, joined=self._joined, settled=self._settled):
            await self._set_up_pending(consumer)
            batches = await poller.poll()
            if batches is None:
                continue
            async with self._lock:
                work = [(self._parts[tp], recs) for tp, recs in batches.items()
                        if tp in self._parts and tp not in self._pending]
                await self._process_all(work)
            await self._tick(consumer)

    async def _process_all(self, work: list[tuple[_Partition, list[ConsumerRecord]]]) -> None:
        """Each partition's batch in its own task. When one raises (the reducer cannot go on), the others are
        cancelled and awaited before the error leaves, as an ExceptionGroup: no partition's work outlives this
        call, so none goes on with a producer that ``run`` stops on the way out."""
        async with asyncio.TaskGroup() as tg:
            for part, recs in work:
                tg.create_task(self._process(part, recs))

    def _settled(self, targets: dict[TopicPartition, int]) -> bool:
        return not self._pending and all(tp in self._parts for tp in targets)

    # ------------------------------------------------------------------------------------ rebalance
    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self._lock:  # waits for the transaction in flight
            self._pending |= revoked
        log.info("partitions_revoked", partitions=sorted(tp.partition for tp in revoked))

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        async with self._lock:
            for tp in [tp for tp in self._parts if tp not in assigned]:
                await self._drop(tp)
            self._pending = set(assigned)
            self._fenced.clear()
            self._failures = {tp: f for tp, f in self._failures.items() if tp in assigned}
            if self._consumer is not None and assigned:
                self._consumer.pause(*assigned)
            self._joined = True
        log.info("partitions_assigned", partitions=sorted(tp.partition for tp in assigned))

    async def _set_up_pending(self, consumer: AIOKafkaConsumer) -> None:
        now = time.monotonic()
        for tp in sorted(self._pending - self._fenced):
            if self._failures.get(tp, (0, 0.0))[1] > now:
                continue
            async with self._lock:
                if tp not in self._pending:
                    continue
                try:
                    await self._set_up(consumer, tp)
                except (KafkaError, TimeoutError, OSError, ValueError, KeyError) as exc:
                    self._fail(tp, "restore", exc)
                    continue
                self._pending.discard(tp)
                self._failures.pop(tp, None)
                consumer.resume(tp)

    async def _set_up(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        """Make ``tp`` processable: keep its state if nobody committed past it since, else restore it."""
        existing = self._parts.get(tp)
        if existing is not None:
            committed = await kafka.bounded(consumer.committed(tp), self.ks.call_timeout_s,
                                            what=f"committed offset {tp}")
            if committed == existing.position:
                consumer.seek(tp, committed)  # records fetched but skipped while it was revoked come again
                return
            await self._drop(tp)
        started = time.monotonic()
        txn_id = f"{self.s.reduce.transactional_id_prefix}.{tp.topic}.{tp.partition}"
        producer = kafka.make_producer(self.ks, transactional_id=txn_id)
        await kafka.start(producer, self.ks, what=f"producer {txn_id}")  # fences the previous owner, aborts its txn
        try:
            committed = await kafka.bounded(consumer.committed(tp), self.ks.call_timeout_s,
                                            what=f"committed offset {tp}")
            if committed is None:
                begin = await kafka.bounded(consumer.beginning_offsets([tp]), self.ks.call_timeout_s,
                                            what=f"beginning of {tp}")
                committed = begin[tp]
            part = await self._restore(tp, producer)
        except BaseException:
            await kafka.stop(producer, self.ks, what=f"producer {txn_id}")
            raise
        part.position = committed
        consumer.seek(tp, committed)
        self._parts[tp] = part
        self.metrics.restore_seconds.observe(time.monotonic() - started)
        log.info("partition_restored", partition=tp.partition, offset=committed, runs=len(part.policy.runs),
                 retired=len(part.reducer.retired), seconds=round(time.monotonic() - started, 3))

    async def _restore(self, tp: TopicPartition, producer: AIOKafkaProducer) -> _Partition:
        assert self._restorer is not None
        latest = await kafka.read_to_end(self._restorer, TopicPartition(self.topics.run_state, tp.partition),
                                         ks=self.ks, timeout_s=self.s.reduce.restore_timeout_s)
        part = _Partition(tp, producer, Reducer(self.limits))
        kept = run_state.Restored()
        for key, value in latest.items():
            if value is None:
                continue
            text = key.decode(errors="replace")
            if wire.is_queue_key(text):  # a queue's, a position's
                part.reducer.queues.restore(part.policy.restore_queue_record(text, jsonio.loads(value)))
            elif wire.is_node_key(text):  # a Node's
                part.reducer.nodes.restore(part.policy.restore_node_record(text, jsonio.loads(value)))
            else:
                kept.add(text, value)
        for doc in kept.docs:
            shell = doc.pop("shell", {})
            run_id = doc["run_id"]
            part.reducer.restore_run(doc, kept.pods.get(run_id, {}), kept.points.get(run_id),
                                        kept.minutes.get(run_id))
            part.policy.restore_shell(run_id, shell, retired=bool(doc.get("retired")))
        part.policy.restored([h for run_id in part.policy.runs if (h := part.reducer.current(run_id)) is not None])
        return part

    async def _drop(self, tp: TopicPartition) -> None:
        part = self._parts.pop(tp, None)
        if part is not None:
            await kafka.stop(part.producer, self.ks, what=f"producer of {tp}")

    def _fail(self, tp: TopicPartition, stage: str, exc: BaseException) -> None:
        count = self._failures.get(tp, (0, 0.0))[0] + 1
        self.metrics.errors.labels("reduce", stage).inc()
        if count > self.s.reduce.max_retries:
            raise ReduceFatal(f"partition {tp.partition} of {tp.topic}: {stage} failed {count} times in a row; "
                              f"last error: {exc!r}") from exc
        self._failures[tp] = (count, time.monotonic() + kafka.backoff_s(count, self.s.reduce.retry_backoff_max_s))
        log.warning("reduce_partition_failed", stage=stage, action="restore the partition", partition=tp.partition,
                    attempt=count, error=repr(exc))

    # ------------------------------------------------------------------------------------ processing
    async def _process(self, part: _Partition, records: list[ConsumerRecord]) -> None:
        fresh = [r for r in records if r.offset >= part.position]
        if not fresh:
            return
        with structlog.contextvars.bound_contextvars(partition=part.tp.partition, offset=fresh[0].offset):
            started = time.perf_counter()
            extra: list[DeadLetter] = []
            for rec in fresh:
                self._fold(part, rec, extra)
            flushed = part.reducer.flush()
            flushed.dead_letters.extend(extra)
            plan = self._plan(part, flushed, self._wall_clock())
            self.metrics.fold_seconds.observe(time.perf_counter() - started)
            next_offset = fresh[-1].offset + 1
            if await self._commit(part, plan, {part.tp: next_offset}):
                part.position = next_offset
                self.metrics.changes_consumed.labels(str(part.tp.partition)).inc(len(fresh))

    def _fold(self, part: _Partition, rec: ConsumerRecord, extra: list[DeadLetter]) -> None:
        origin = f"{rec.topic}/{rec.partition}@{rec.offset}"
        header = wire.change_source(rec.headers)
        source = f"{origin} {header}" if header else origin
        value: bytes | None = rec.value
        if value is None:
            part.reducer.reject(source, "empty value", "")
            return
        if len(value) > self.s.reduce.max_change_bytes:
            part.reducer.reject(source, "value too large",
                                f"{len(value)} bytes > {self.s.reduce.max_change_bytes}: "
                                + value[:256].decode(errors="replace"))
            return
        try:
            record = jsonio.loads(value)
        except ValueError as exc:
            part.reducer.reject(source, "invalid JSON", f"{exc}: " + value[:1024].decode(errors="replace"))
            return
        key = rec.key.decode(errors="replace") if rec.key else None
        try:
            if key is None:
                extra.extend(_keyless(record, source))
            else:
                part.reducer.apply(record, source, run_hint=key)
        except Exception as exc:  # a reducer bug must not stall the partition on this record forever
            log.exception("reducer_record_failed", offset=rec.offset)
            part.reducer.reject(source, "reducer error", f"{type(exc).__name__}: {exc}: "
                                + value[:1024].decode(errors="replace"))

    def _limits(self) -> Limits:
        return Limits(max_value_bytes=self.topics.max_message_bytes - _OUTPUT_MARGIN,
                      transitions_topic=self.topics.transitions, thresholds_s=self.s.alerts.stuck_thresholds_s(),
                      clock=self.s.alerts.clock)

    def _plan(self, part: _Partition, flushed: Flushed, now_us: int | None) -> _Plan:
        """The records and counts of one transaction, from the policy's decisions (``tracker.core.publish``)."""
        decided = part.policy.decide(flushed, self._limits(), now_us=now_us)
        topics, partition = self.topics, part.tp.partition
        for key, size in decided.oversized:
            log.error("record_too_large_to_publish", key=key, bytes=size, limit=self._limits().max_value_bytes)
        plan = _Plan(phases=decided.phases, finished=decided.finished, pending=decided.pending)
        for p in decided.publish:
            plan.records.append(_Out(topics.transitions, partition, p.key.encode(), p.value,
                                     wire.kind_headers(p.kind, p.digest)))
        self._alert_records(decided, plan)
        dead = decided.dead_letters
        for run_id in decided.touched:
            plan.records.extend(self._state_record(part, run_id, dead))
        plan.records.extend(_Out(topics.run_state, partition, run_id.encode(), None) for run_id in decided.forgotten)
        plan.records.extend(self._queue_state_records(decided, partition, dead))
        for dl in dead:
            plan.dead[dl.reason] += 1
            plan.records.append(_Out(topics.dead_letters, None, None, dl.model_dump_json().encode()))
        return plan

    def _state_record(self, part: _Partition, run_id: str, dead: list[DeadLetter]) -> list[_Out]:
        """The run's run-state records: its own (facts without pods, metric points and progress minutes, and the
        shell), one per pod that changed, per metric point the last flush changed and per progress minute that
        changed, and a tombstone per pod it no longer has, point no longer kept and minute no longer kept
        (``tracker.runtime.run_state``)."""
        snap = part.reducer.snapshot_run(run_id, points_apart=True)
        if snap is None:
            return []
        topic, partition = self.topics.run_state, part.tp.partition
        snap["shell"] = part.policy.shell_doc(run_id)
        tombs, records = run_state.run_records(run_id, snap)
        out = [_Out(topic, partition, key.encode(), None, headers) for key, headers in tombs]
        limit = self.topics.max_message_bytes - _OUTPUT_MARGIN
        for key, value, headers in records:
            if len(value) > limit:
                log.error("run_state_too_large", key=key, bytes=len(value), limit=limit)
                dead.append(DeadLetter(source=f"{topic}:{key}", reason="run state too large to persist",
                                       detail=f"{len(value)} bytes > {limit}"))
                continue
            out.append(_Out(topic, partition, key.encode(), value, headers))
        return out

    def _queue_state_records(self, decided: Decisions, partition: int, dead: list[DeadLetter]) -> list[_Out]:
        """The run-state records of the queues, positions and Nodes published (their state and hash, header
        ``kind``), and a tombstone for each position the reducer forgot (its run retired)."""
        topic = self.topics.run_state
        out = [_Out(topic, partition, key.encode(), None, wire.kind_headers(wire.POSITION))
               for key in decided.queue_state_gone]
        limit = self.topics.max_message_bytes - _OUTPUT_MARGIN
        for key, kind, doc in decided.queue_state:
            value = jsonio.dumps(doc)
            if len(value) > limit:
                log.error("run_state_too_large", key=key, bytes=len(value), limit=limit)
                dead.append(DeadLetter(source=f"{topic}:{key}", reason="run state too large to persist",
                                       detail=f"{len(value)} bytes > {limit}"))
                continue
            out.append(_Out(topic, partition, key.encode(), value, wire.kind_headers(kind)))
        return out

    # ------------------------------------------------------------------------------------ stuck runs
    def _wall_clock(self) -> int | None:
        """The wall clock in microseconds; None for the event clock (the watermark, known after the fold)."""
        return int(time.time() * 1_000_000) if self.s.alerts.clock == "wall" else None

    def _alert_records(self, decided: Decisions, plan: _Plan) -> None:
        for a in decided.alerts:
            s = a.stuck
            plan.records.append(_Out(self.topics.alerts, None, wire.alert_key(s.run_id),
                                     a.record.model_dump_json(by_alias=True).encode()))
            plan.alerts[(s.phase.value, s.queue)] += 1
            with structlog.contextvars.bound_contextvars(run_id=s.run_id):
                log.warning("stuck_run", attempt=s.attempt, phase=s.phase.value, queue=s.queue,
                            age_s=round(a.record.age_s, 1), reason=s.reason)

    async def _wall_alerts(self) -> None:
        now_us = int(time.time() * 1_000_000)
        async with self._lock:
            for tp, part in list(self._parts.items()):
                if tp in self._pending or not part.policy.stuck:
                    continue
                plan = _Plan()
                decided = Decisions(alerts=part.policy.due_alerts(now_us, self._limits()))
                self._alert_records(decided, plan)
                for a in decided.alerts:
                    plan.records.extend(self._state_record(part, a.stuck.run_id, []))
                if plan.records:
                    await self._commit(part, plan, None)

    # ------------------------------------------------------------------------------------ transactions
    async def _commit(self, part: _Partition, plan: _Plan, offsets: dict[TopicPartition, int] | None) -> bool:
        """Write ``plan`` and ``offsets`` in one transaction. On failure the partition is reset (restored from
        Kafka before it is processed again) and False is returned."""
        producer = part.producer
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.ks.call_timeout_s):
                await producer.begin_transaction()
                sent = await kafka_batches.send_all(producer, plan.records)  # a batch per partition
                await asyncio.gather(*sent)  # the batches' delivery futures: no task is spawned
                if offsets:
                    await producer.send_offsets_to_transaction(offsets, self.s.reduce.group_id)
                await producer.commit_transaction()
        except ProducerFenced:
            self.metrics.transactions.labels("fenced").inc()
            log.warning("producer_fenced", partition=part.tp.partition)
            self._fenced.add(part.tp)
            self._pending.add(part.tp)
            await self._drop(part.tp)
            return False
        except (KafkaError, TimeoutError, OSError) as exc:
            self.metrics.transactions.labels("failed").inc()
            self._pending.add(part.tp)
            await self._drop(part.tp)
            self._fail(part.tp, "transaction", exc)
            return False
        self.metrics.transaction_seconds.observe(time.perf_counter() - started)
        self.metrics.transactions.labels("committed").inc()
        self._count(plan)
        return True

    def _count(self, plan: _Plan) -> None:
        m = self.metrics
        for topic, n in Counter(o.topic for o in plan.records).items():
            m.records_produced.labels(topic).inc(n)
        for phase, n in plan.phases.items():
            m.transitions.labels(phase).inc(n)
        for reason, n in plan.dead.items():
            m.dead_letters.labels(reason).inc(n)
        for (phase, queue), n in plan.alerts.items():
            m.stuck_alerts.labels(phase, queue).inc(n)
            if phase == Phase.ADMISSION:
                m.alerts.labels(queue).inc(n)
        for status, n in plan.finished.items():
            m.runs_finished.labels(status).inc(n)
        for category, seconds in plan.pending.items():
            m.pending_seconds.labels(category).inc(seconds)

    # ------------------------------------------------------------------------------------ gauges
    async def _tick(self, consumer: AIOKafkaConsumer) -> None:
        now = time.monotonic()
        if self.s.alerts.clock == "wall" and now - self._last_wall_check >= self.s.alerts.check_interval_s:
            self._last_wall_check = now
            await self._wall_alerts()
        if now - self._last_tick < self.s.ops.metrics_interval_s:
            return
        self._last_tick = now
        m = self.metrics
        group = self.s.reduce.group_id
        statuses: Counter[str] = Counter()
        oldest: dict[str, float] = {}
        oldest_stuck: dict[tuple[str, str], float] = {}
        pending_open: dict[str, float] = {}
        held = [0, 0, 0]  # packed runs, their bytes, derivations kept
        wall_us = int(time.time() * 1_000_000)
        for tp, part in self._parts.items():
            packed, packed_bytes = part.reducer.runs.packed_size()
            held[0] += packed
            held[1] += packed_bytes
            held[2] += len(part.reducer.derivations)
            high = consumer.last_stable_offset(tp)
            if high is not None and tp not in self._pending:
                position = await kafka.bounded(consumer.position(tp), self.ks.call_timeout_s, what=f"position of {tp}")
                m.consumer_lag.labels(group, tp.topic, str(tp.partition)).set(max(0, high - position))
            statuses.update(s.status.value for s in part.policy.runs.values())
            clock = wall_us if self.s.alerts.clock == "wall" else part.policy.watermark_us
            for w in part.policy.stuck.values():
                if w.phase == Phase.ADMISSION and w.queued_at_us is not None:
                    oldest[w.queue] = max(oldest.get(w.queue, 0.0), (clock - w.queued_at_us) / 1e6)
            gauge_clock = wall_us if self.s.alerts.metrics_clock == "wall" else part.policy.watermark_us
            for (phase, queue), age in stuck.oldest(part.policy.stuck.values(), gauge_clock).items():
                key = (phase.value, queue)
                oldest_stuck[key] = max(oldest_stuck.get(key, 0.0), age)
            for category, age in stuck.pending_open(part.policy.stuck.values(), gauge_clock).items():
                pending_open[category] = pending_open.get(category, 0.0) + age
        for status in Status:
            m.runs.labels(status.value).set(statuses.get(status.value, 0))
        m.packed_runs.set(held[0])
        m.packed_bytes.set(held[1])
        m.derivations.set(held[2])
        for queue in self._queues - oldest.keys():
            m.oldest_pending.remove(queue)
        for queue, age in oldest.items():
            m.oldest_pending.labels(queue).set(age)
        self._queues = set(oldest)
        for key in self._stuck_keys - oldest_stuck.keys():
            m.oldest_stuck.remove(*key)
        for key, age in oldest_stuck.items():
            m.oldest_stuck.labels(*key).set(age)
        self._stuck_keys = set(oldest_stuck)
        for category in PENDING_CATEGORIES:  # every category, 0 without an open span
            m.pending_open.labels(category).set(pending_open.get(category, 0.0))
        m.partitions.labels(group).set(sum(1 for tp in self._parts if tp not in self._pending))


def _keyless(record: Any, source: str) -> list[DeadLetter]:
    """A change without a run key: the reason a reducer would give, else 'record without a run key'.

    Records are keyed by run id so that none waits in the reducer's memory for its owner: such a wait would not
    survive a restart. A scratch reducer tells what the record is without touching the partition's state."""
    scratch = Reducer(ReducerLimits(max_held=1, max_dead_letters=1, max_retired=1))
    scratch.apply(record, source)
    if scratch.stats.dead_letters:
        return scratch.flush().dead_letters
    if scratch.stats.held or scratch.runs:
        return [DeadLetter(source=source, reason="record without a run key",
                           detail="changes records must be keyed by run id",
                           excerpt=json.dumps(record, sort_keys=True, default=str)[:2048])]
    return []  # bookmarks, watch errors, objects of no run: nothing to fold
