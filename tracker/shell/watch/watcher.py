"""The watcher: all streams of one watcher process, their run keying, outbox, publishing and checkpoint; and its
Prometheus view (see ``tracker.shell.watch`` for the theory of operation)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tracker.core import extract as x
from tracker.core import redact
from tracker.core.correlate import Link, link
from tracker.core.model import EXCERPT_MAX, DeadLetter
from tracker.core.nodes import NODE_KINDS, node_key
from tracker.core.queues import QUEUE_KINDS, queue_key
from tracker.settings import WatchSettings
from tracker.shell import jsonio
from tracker.shell.kube import KubeApi
from tracker.shell.leader import Leadership, LeadershipLost
from tracker.shell.watch.checkpoint import CheckpointStore, Entry, Saved, Snapshot, SqliteCheckpoint
from tracker.shell.watch.keying import RunKeyer
from tracker.shell.watch.packed import pack, unpack
from tracker.shell.watch.publish import DeadLetterPublisher, Outbox, Publisher
from tracker.shell.watch.resources import all_resources
from tracker.shell.watch.stream import Stream, WatchStats, name_of
from tracker.shell.watch.visibility import VisibilityPoller

log = structlog.get_logger("tracker.watch")
#: Checkpointed objects restored between two turns of the event loop (about 30 ms of unpacking and packing)
RESTORE_YIELD_EVERY = 2_000


class Watcher:
    """All streams of one watcher process, their keying, outbox, publishing and checkpoint."""

    def __init__(self, api: KubeApi, publisher: Publisher, config: WatchSettings | None = None, *,
                 checkpoint: Path | CheckpointStore | None = None, leadership: Leadership | None = None,
                 rng: random.Random | None = None) -> None:
        """``checkpoint``: a SQLite file, or any ``CheckpointStore`` (loaded by ``run``, closed when it ends)."""
        self.api = api
        self.publisher = publisher
        self.letters: DeadLetterPublisher | None = publisher if isinstance(publisher, DeadLetterPublisher) else None
        self.config = config or WatchSettings()
        self.leadership = leadership
        self.rng = rng or random.Random()
        self.stats = WatchStats()
        self.keys = RunKeyer(self.config.max_held, self.config.max_runs)
        self.outbox = Outbox(self.config.outbox_size)
        namespaces = self.config.namespaces or (None,)
        self.streams = [Stream(res, ns, api=api, config=self.config, stats=self.stats, rng=self.rng, emit=self.emit,
                               dead_letter=self.dead_letter, wait_room=self.outbox.wait_room)
                        for res in all_resources(self.config.events_api, queues=self.config.queues,
                                               nodes=self.config.nodes)
                        for ns in ((None,) if res.cluster_scoped else namespaces)]
        # for the visibility poller: each ClusterQueue's pending count, each Workload's run (bounded by max_known)
        self.cq_pending: dict[str, int] = {}
        self.workload_runs: dict[tuple[str, str], str] = {}
        self.visibility = VisibilityPoller(api, self.config, publish=self.outbox.put_nowait,
                                           pending=lambda: dict(self.cq_pending), run_of=self.run_of_workload) \
            if self.config.queues and self.config.visibility else None
        self.store: CheckpointStore | None = (SqliteCheckpoint(checkpoint) if isinstance(checkpoint, Path)
                                              else checkpoint)
        self.saving = asyncio.Lock()
        self.started = asyncio.Event()  # state loaded, streams running

    # ------------------------------------------------------------ keyed emission (synchronous)

    def emit(self, etype: str, obj: dict[str, Any], source: str) -> None:
        if etype == "DELETED" and obj.get("kind") == "Event":
            return  # an Event's expiry is no lifecycle fact, and the reducer ignores it
        if isinstance(obj.get("kind"), str) and obj["kind"] in QUEUE_KINDS:
            self.emit_queue(etype, obj, source)
            return
        if isinstance(obj.get("kind"), str) and obj["kind"] in NODE_KINDS:
            self.emit_node(etype, obj, source)
            return
        try:
            keyed = self.keys.key(etype, obj, source=source)
        except x.Malformed as exc:
            self.stats.malformed += 1
            log.warning("watch_object_uncorrelatable", source=source, detail=str(exc), kind=obj.get("kind"),
                        name=name_of(obj))
            self.dead_letter(source, f"malformed {obj.get('kind')}", str(exc), obj)
            return
        except Exception as exc:  # a bug in keying this object: it costs this record only
            log.exception("watch_record_failed", source=source, type=etype, kind=obj.get("kind"), name=name_of(obj))
            self.dead_letter(source, "watcher error", f"{type(exc).__name__}: {exc}", obj)
            return
        for run, k_etype, k_obj, k_source in keyed:
            self.outbox.put_nowait(run, {"type": k_etype, "object": k_obj}, source=k_source)
            if k_obj.get("kind") == "Workload":
                self.note_workload(k_etype, k_obj, run)
        if self.keys.just_dropped:
            for owner, (d_etype, d_obj, d_source) in self.keys.just_dropped:
                log.warning("watch_record_dropped", reason="owner not seen while max_held records were held",
                            owner_uid=owner, type=d_etype, kind=d_obj.get("kind"), source=d_source,
                            max_held=self.config.max_held)
            self.keys.just_dropped.clear()

    def emit_queue(self, etype: str, obj: dict[str, Any], source: str) -> None:
        """A ClusterQueue or LocalQueue: keyed by queue (one key, one partition, one writer per queue)."""
        if not self._emit_keyed(queue_key, etype, obj, source):
            return
        if obj.get("kind") == "ClusterQueue":
            name = str(obj["metadata"]["name"])
            status = obj.get("status")
            pending = status.get("pendingWorkloads") if isinstance(status, dict) else None
            if etype == "DELETED":
                self.cq_pending.pop(name, None)
            elif isinstance(pending, int) and not isinstance(pending, bool):
                self.cq_pending[name] = pending

    def emit_node(self, etype: str, obj: dict[str, Any], source: str) -> None:
        """A Node: keyed by node (``node:<name>``), no part of a run."""
        self._emit_keyed(node_key, etype, obj, source)

    def _emit_keyed(self, key_of: Callable[[dict[str, Any]], str], etype: str, obj: dict[str, Any],
                    source: str) -> bool:
        """Publish an object that is no part of a run under its own key (``key_of``); a dead letter when it has none
        (False)."""
        try:
            key = key_of(obj)
        except x.Malformed as exc:
            self.stats.malformed += 1
            self.dead_letter(source, f"malformed {obj.get('kind')}", str(exc), obj)
            return False
        self.outbox.put_nowait(key, {"type": etype, "object": obj}, source=source)
        return True

    def note_workload(self, etype: str, obj: dict[str, Any], run: str) -> None:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return
        ns, name = meta.get("namespace"), meta.get("name")
        if not isinstance(ns, str) or not isinstance(name, str):
            return
        if etype == "DELETED":
            self.workload_runs.pop((ns, name), None)
            return
        self.workload_runs.pop((ns, name), None)
        self.workload_runs[(ns, name)] = run
        while len(self.workload_runs) > self.config.max_known:
            del self.workload_runs[next(iter(self.workload_runs))]

    def run_of_workload(self, namespace: str, name: str) -> str | None:
        return self.workload_runs.get((namespace, name))

    def dead_letter(self, source: str, reason: str, detail: str, obj: Any) -> None:
        """Queue a dead letter for a record that is not published, in order with the records around it. ``obj``
        is its excerpt: a slimmed object, or only the identity of a raw one (whose spec may hold secrets); the
        DeadLetter redacts what may still be secret in it."""
        try:
            excerpt = jsonio.dumps(obj).decode(errors="replace")[:2 * EXCERPT_MAX]
        except (TypeError, ValueError):
            excerpt = repr(obj)[:2 * EXCERPT_MAX]
        self.stats.dead_letters += 1
        self.outbox.put_item(DeadLetter(source=source, reason=reason, detail=detail[:1024],
                                        identity=redact.identity(obj), excerpt=excerpt))

    # ------------------------------------------------------------ lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Watch until ``stop`` is set, then drain, checkpoint and return. Raises ``LeadershipLost``
        (wrapped in an ExceptionGroup, like any failure of its tasks, such as ``WatchFatal``) without a final
        checkpoint; so does a save that a newer leader's store fenced."""
        try:
            if self.store is not None:
                await self.restore(await self.store.load())
            async with asyncio.TaskGroup() as tg:
                publishing = tg.create_task(self.publish_forever())
                housekeeping = tg.create_task(self.housekeep_forever())
                polling = tg.create_task(self.visibility.run()) if self.visibility is not None else None
                watching = [tg.create_task(s.run([t for t in self.streams if t.res.tier < s.res.tier]))
                            for s in self.streams]
                self.started.set()
                await stop.wait()
                for task in watching:
                    task.cancel()
                await asyncio.wait(watching)
                await self.outbox.wait_delivered(self.outbox.enqueued)
                await self.save()
                publishing.cancel()
                housekeeping.cancel()
                if polling is not None:
                    polling.cancel()
        finally:
            if self.store is not None:
                await self.store.close()

    async def restore(self, saved: Saved) -> None:
        """Take up a checkpoint: each stream's resourceVersion and known objects (packed: ``packed``), the owners'
        bindings, the visibility poller's queues and Workloads, the held records. Yields to the event loop every
        ``RESTORE_YIELD_EVERY`` objects: a checkpoint of a million objects takes seconds to unpack and pack, during
        which the lease is renewed and the metrics are served."""
        links: list[Link] = []
        done = 0
        for s in self.streams:
            s.rv = saved.rvs.get(s.key)
            known: dict[str, Entry] = {}
            for uid, (rv, blob) in saved.known.get(s.key, {}).items():
                known[uid] = (rv, pack(blob))
                if s.res.kind != "Event" and (ln := RunKeyer.link_of(jsonio.loads(blob))) is not None:
                    links.append(ln)
                done += 1
                if done % RESTORE_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            s.known = known
        self.keys.rebind(links)
        for s in self.streams:  # what the visibility poller reads: pending ClusterQueues, Workloads' runs
            if s.res.kind not in ("ClusterQueue", "Workload"):
                continue
            for n, (_rv, blob) in enumerate(saved.known.get(s.key, {}).values(), 1):
                obj = jsonio.loads(blob)
                if s.res.kind == "ClusterQueue":
                    self.emit_queue_state(obj)
                else:
                    self.restore_workload(obj)
                if n % RESTORE_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        for etype, obj, source in saved.held:  # what waited for an owner waits again (or is released)
            self.emit(etype, obj, source)
        log.info("watch_resumed", streams={s.key: s.rv for s in self.streams if s.rv},
                 objects=sum(len(s.known) for s in self.streams), held=len(saved.held))

    def emit_queue_state(self, obj: dict[str, Any]) -> None:
        meta, status = obj.get("metadata"), obj.get("status")
        if isinstance(meta, dict) and isinstance(meta.get("name"), str) and isinstance(status, dict):
            pending = status.get("pendingWorkloads")
            if isinstance(pending, int) and not isinstance(pending, bool):
                self.cq_pending[meta["name"]] = pending

    def restore_workload(self, obj: dict[str, Any]) -> None:
        try:
            ln = link(obj)
        except x.Malformed:
            return
        run = self.keys.corr.run_of(ln) if ln is not None else None
        if run is not None:
            self.note_workload("MODIFIED", obj, run)

    async def publish_forever(self) -> None:
        stats, outbox, leadership = self.stats, self.outbox, self.leadership
        while True:
            batch = await outbox.get_batch(1024)
            for item in batch:
                if leadership is not None and not leadership.valid():
                    raise LeadershipLost("the lease was not renewed in time; publishing stopped")
                if isinstance(item, DeadLetter):
                    if self.letters is not None:
                        await self.letters.dead_letter(item)
                    else:
                        log.error("watch_dead_letter", **item.model_dump())
                    continue
                key, record, source = item
                await self.publisher.publish(key, record, source=source)
                stats.published += 1
            await outbox.mark_delivered(len(batch))

    async def housekeep_forever(self) -> None:
        cfg = self.config
        last_log = time.monotonic()
        while True:
            await asyncio.sleep(cfg.checkpoint_interval_s)
            await self.save()
            if time.monotonic() - last_log >= cfg.log_interval_s:
                last_log = time.monotonic()
                log.info("watch_progress", held=len(self.keys.corr.held), outbox=len(self.outbox.items),
                         **self.stats.as_dict())

    def snapshot(self) -> Snapshot:
        changed = {}
        for s in self.streams:  # the checkpoint's increment, its objects as JSON
            changed[s.key] = {uid: None if e is None else (e[0], unpack(e[1])) for uid, e in s.changed.items()}
            s.changed = {}
        return Snapshot({s.key: s.rv for s in self.streams}, changed, self.keys.held_records())

    async def save(self) -> None:
        """Checkpoint what has been handled, once all of it is published and flushed."""
        async with self.saving:  # one at a time, in snapshot order
            if self.store is None:
                await self.publisher.flush()
                return
            snap = self.snapshot()
            await self.outbox.wait_delivered(self.outbox.enqueued)
            await self.publisher.flush()
            await self.store.save(snap)

    async def wait_synced(self) -> None:
        """Until every stream has listed (or resumed) once, or found its resource unavailable."""
        await self.started.wait()
        for s in self.streams:
            await s.synced.wait()


class WatchCollector:
    """Prometheus view of the current watcher's statistics, read at scrape time (register it in a registry;
    a leader-elected process sets ``watcher`` anew for every term it leads, and ``standby`` while it does not)."""

    def __init__(self, *, standby: bool = False) -> None:
        self.watcher: Watcher | None = None
        self.standby = standby

    def ready(self) -> bool:
        """A replica on standby is ready; a watching one once every stream has listed or resumed."""
        w = self.watcher
        return self.standby or (w is not None and w.started.is_set() and all(st.synced.is_set() for st in w.streams))

    def collect(self) -> Iterator[Metric]:
        w = self.watcher
        yield GaugeMetricFamily("tracker_watch_leading", "1 while this replica watches (it holds the lease, or runs "
                                "without one), 0 on standby.", value=0 if w is None else 1)
        if w is None:
            return
        for name, value in w.stats.as_dict().items():
            if name == "largest_record":
                yield GaugeMetricFamily("tracker_watch_largest_record_bytes", "Largest slimmed record.", value=value)
            else:
                yield CounterMetricFamily(f"tracker_watch_{name}", f"Watcher {name.replace('_', ' ')}.", value=value)
        for name in ("ignored", "held", "released", "dropped"):
            yield CounterMetricFamily(f"tracker_watch_keying_{name}", f"Records {name} by run keying.",
                                      value=getattr(w.keys, name))
        yield GaugeMetricFamily("tracker_watch_waiting", "Records waiting for their owner.",
                                value=len(w.keys.corr.held))
        yield GaugeMetricFamily("tracker_watch_outbox", "Records handled, not yet published.",
                                value=len(w.outbox.items))
        known = GaugeMetricFamily("tracker_watch_known_objects", "Objects remembered, per stream.", labels=["stream"])
        for st in w.streams:
            known.add_metric([st.key], len(st.known))
        yield known

