"""Kubernetes watchers: list+watch every run object, survive restarts and 410s, publish keyed changes.

Theory of operation
-------------------
One *stream* per watched resource (times each configured namespace, or cluster-wide) runs the loop of
shared/reference/lifecycle.md §5:

1. LIST with ``limit``/``continue`` (a consistent read) and keep the *list's* resourceVersion;
2. WATCH from it with ``allowWatchBookmarks``, a server-side ``timeoutSeconds`` and a client socket read
   timeout, so that a half-open connection is detected instead of hanging for ever;
3. when the watch ends (server timeout, broken or silent connection), WATCH again from the last
   resourceVersion seen (an event's or a bookmark's), after a jittered, capped backoff if it failed;
4. on ``410 Gone`` (the history was compacted while the stream was away), LIST again and *reconcile* with
   what the stream knew: objects whose resourceVersion is unchanged are not published again, changed ones
   are published as MODIFIED, new ones as ADDED, and objects that vanished become synthetic DELETED
   changes carrying their last known state.

Each stream keeps the last resourceVersion and slimmed state of every object it handled (``known``,
bounded): that is what step 4 reconciles against, and what drops exact repeats (same uid and
resourceVersion). resourceVersions are opaque: they are compared for equality only, never ordered.

A handled change is slimmed (``tracker.shell.slim``), keyed by run id with the reducer's own
``Correlator`` (an object whose owner has not been seen is held, bounded, and released when the owner is)
and put on one bounded outbox, in the order handled; one task drains the outbox into the ``Publisher``.
A change that cannot be handled (malformed, or a bug in slimming or keying it) becomes a ``DeadLetter`` on the
same outbox, for a ``DeadLetterPublisher`` (Kafka: the dead-letters topic) or the log; the stream goes on.
Only a broken connection or stream (a line that is not JSON or not a watch event) makes a stream reconnect;
any other error of a stream's loop stops the watcher (``WatchFatal``) rather than reconnecting for ever.
Changes are handled synchronously, never across an await, so a snapshot of the watcher's state always
falls between two whole changes.

At start, streams list in tiers (Jobs and RayJobs, then Workloads and RayClusters, then Pods, then Events)
so that owners are usually bound before their dependents arrive and little has to be held.

What is watched (``resources()``), cluster-wide or per configured namespace:

- ``batch/v1`` Jobs, all of them (any Job may be a run's root; a KubeRay submitter Job joins its RayJob's run);
- ``v1`` Pods, narrowed by label selector to the two kinds a run has. Selectors cannot express "or", so there
  are two disjoint streams: ``batch.kubernetes.io/controller-uid`` (pods of a Job, set by the Job controller since
  Kubernetes 1.27) and ``ray.io/cluster,!batch.kubernetes.io/controller-uid`` (KubeRay head and worker pods);
- Events from ``events.k8s.io/v1`` (default) or ``v1``: both APIs serve the same objects, so only one is
  watched. Every Event is captured as it happens, including MODIFIED updates of ``count``/``series``, because
  Events expire after an hour; an Event's DELETED (its expiry) is not published;
- Kueue ``Workloads`` at the served version found by discovery (the group's preferred one of v1beta2/v1beta1),
  KubeRay ``RayJobs`` and ``RayClusters`` (``ray.io/v1``). A resource that is not served (CRD not installed)
  or not allowed (RBAC) is reported once and looked for again with a capped backoff; the other streams run.

Checkpoint
----------
Stream resourceVersions, ``known`` sets and held records are checkpointed in one transaction, to a
``CheckpointStore``: a local SQLite file (``Checkpoint``, saved in a worker thread: one replica, or a capture), or
the compacted watch-state topic (``tracker.shell.watch_state.KafkaCheckpoint``), which leader-elected replicas
share, so that a new leader resumes from where the previous one checkpointed, not from its own stale state (a
re-list would publish only the latest state of what changed during the handover, and no DELETED for what the
new leader never knew). A deposed leader's save is fenced by the new leader's and ends its term
(``LeadershipLost``). A checkpoint is written only after every record enqueued before its snapshot has been
published and the publisher flushed, so it never claims an undelivered record. A restart resumes each watch from its
checkpointed resourceVersion; if that is too old the server answers 410 and step 4 reconciles against the
checkpointed ``known`` set, so objects deleted while the watcher was down still produce a DELETED. Owner
bindings are rebuilt from the checkpointed objects. Delivery is at-least-once: after a crash, the changes
handled since the last checkpoint are published again (the reducer is idempotent).

HTTP goes through kubernetes_asyncio's ``ApiClient`` (configuration, authentication, TLS, connection pool)
with ``_preload_content=False``: events are decoded once into plain dicts (the camelCase JSON the reducer
reads), never into the generated models, and ERROR events and 410s are handled here rather than by
``kubernetes_asyncio.watch.Watch`` (which retries a 410 once with the same, still too old, version).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import aiohttp
import structlog
from aiohttp.http_exceptions import HttpProcessingError
from kubernetes_asyncio.client import ApiClient
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tracker.core import extract as x
from tracker.core import redact
from tracker.core.correlate import Correlator, Held, link
from tracker.core.model import EXCERPT_MAX, LABEL_CONTROLLER_UID, LABEL_RAY_CLUSTER, DeadLetter
from tracker.shell import jsonio
from tracker.shell.bus import InProcessBus
from tracker.shell.capture import Record
from tracker.shell.slim import slim

log = structlog.get_logger("tracker.watch")

MAX_EVENT_BYTES = 4 * 1024 * 1024  # an object is at most ~1.5 MiB in etcd; a watch line adds little
CHECKPOINT_VERSION = 1

Change = dict[str, Any]  # a published record: {"type": ADDED|MODIFIED|DELETED, "object": slimmed object}


# ------------------------------------------------------------------------------------------ resources


@dataclass(frozen=True, slots=True)
class Resource:
    """One collection the watcher lists and watches."""

    name: str  # stream name, also the checkpoint key's first part
    group: str  # "" for the core group
    versions: tuple[str, ...]  # acceptable served versions; the group's preferred one wins, else the first
    plural: str
    kind: str
    tier: int  # initial-sync order: a stream lists after every stream of a lower tier has
    label_selector: str = ""

    def version_path(self, version: str) -> str:
        return f"/apis/{self.group}/{version}" if self.group else f"/api/{version}"

    def collection_path(self, version: str, namespace: str | None) -> str:
        scope = f"/namespaces/{namespace}" if namespace else ""
        return f"{self.version_path(version)}{scope}/{self.plural}"

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version


JOBS = Resource("jobs", "batch", ("v1",), "jobs", "Job", tier=0)
RAYJOBS = Resource("rayjobs", "ray.io", ("v1",), "rayjobs", "RayJob", tier=0)
WORKLOADS = Resource("workloads", "kueue.x-k8s.io", ("v1beta2", "v1beta1"), "workloads", "Workload", tier=1)
RAYCLUSTERS = Resource("rayclusters", "ray.io", ("v1",), "rayclusters", "RayCluster", tier=1)
# Pods are narrowed to the two kinds a run has; label selectors cannot express OR, hence two disjoint
# streams: Job pods carry the Job controller's uid label, KubeRay pods their cluster's name.
JOB_PODS = Resource("pods-job", "", ("v1",), "pods", "Pod", tier=2, label_selector=LABEL_CONTROLLER_UID)
RAY_PODS = Resource("pods-ray", "", ("v1",), "pods", "Pod", tier=2,
                    label_selector=f"{LABEL_RAY_CLUSTER},!{LABEL_CONTROLLER_UID}")
# Both Event APIs serve the same objects; watching both would publish every change twice.
EVENTS_V1 = Resource("events", "events.k8s.io", ("v1",), "events", "Event", tier=3)
CORE_EVENTS = Resource("events-core", "", ("v1",), "events", "Event", tier=3)
EVENTS_APIS = {"events.k8s.io/v1": EVENTS_V1, "v1": CORE_EVENTS}


def resources(events_api: str = "events.k8s.io/v1") -> tuple[Resource, ...]:
    """Everything a run is made of, with Events from ``events_api`` (``events.k8s.io/v1`` or ``v1``)."""
    if events_api not in EVENTS_APIS:
        raise ValueError(f"events_api must be one of {sorted(EVENTS_APIS)}, got {events_api!r}")
    return (JOBS, RAYJOBS, WORKLOADS, RAYCLUSTERS, JOB_PODS, RAY_PODS, EVENTS_APIS[events_api])


@dataclass(frozen=True, slots=True)
class WatchConfig:
    """How the watcher talks to the apiserver and how much it may remember. Durations in seconds."""

    namespaces: tuple[str, ...] = ()  # empty: cluster-wide (one stream per resource)
    events_api: str = "events.k8s.io/v1"
    page_size: int = 500  # LIST limit: bounds one response's memory
    watch_timeout_s: int = 240  # server-side timeoutSeconds: the apiserver ends the watch cleanly
    read_timeout_s: float = 90.0  # silence on a watch longer than this = dead connection (bookmarks ~1/min)
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 60.0  # one LIST page or discovery request, in total
    backoff_base_s: float = 0.5  # reconnect backoff: doubles per failure, jittered, capped
    backoff_cap_s: float = 30.0
    unavailable_retry_cap_s: float = 300.0  # a missing CRD or a forbidden resource is retried this rarely
    max_held: int = 100_000  # records waiting for their owner
    max_runs: int = 200_000  # runs whose owner bindings are kept (least recently seen forgotten first)
    max_known: int = 1_000_000  # objects remembered per stream (resourceVersion and last state)
    outbox_size: int = 10_000  # records handled but not yet published
    checkpoint_interval_s: float = 2.0
    log_interval_s: float = 60.0  # one progress line per interval


# ------------------------------------------------------------------------------------------ HTTP


class ApiError(Exception):
    """A non-2xx answer or an ERROR watch event; ``status`` is the HTTP code (410 means Gone)."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class KubeApi:
    """JSON requests and line streams over a kubernetes_asyncio ``ApiClient`` (which it does not own)."""

    def __init__(self, client: ApiClient, *, connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0
                 ) -> None:
        self.client = client
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s

    async def request(self, method: str, path: str, params: Sequence[tuple[str, str]] = (),
                      body: dict[str, Any] | None = None) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=self.connect_timeout_s)
        resp = await self._call(method, path, params, body, timeout)
        try:
            data = await resp.read()
        finally:
            resp.release()
        try:
            out = jsonio.loads(data)
        except ValueError as exc:  # a proxy's error page, a cut body
            raise ApiError(resp.status, "response is not JSON", f"{exc}: {data[:200]!r}") from exc
        if not isinstance(out, dict):
            raise ApiError(resp.status, "unexpected response", repr(out)[:200])
        return out

    async def get(self, path: str, params: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        return await self.request("GET", path, params)

    @asynccontextmanager
    async def lines(self, path: str, params: Sequence[tuple[str, str]], *, read_timeout_s: float
                    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """A streaming GET; yields its body line by line. Silence longer than ``read_timeout_s`` raises."""
        # connect: establishing the connection including the TLS handshake, which a half-open peer can stall
        timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s, sock_connect=self.connect_timeout_s,
                                        sock_read=read_timeout_s)
        resp = await self._call("GET", path, params, None, timeout)

        async def read() -> AsyncIterator[bytes]:
            while True:
                line = await resp.content.readline(max_line_length=MAX_EVENT_BYTES)
                if not line:
                    return
                yield line

        try:
            yield read()
        finally:
            resp.close()

    async def _call(self, method: str, path: str, params: Sequence[tuple[str, str]], body: dict[str, Any] | None,
                    client_timeout: aiohttp.ClientTimeout) -> aiohttp.ClientResponse:
        resp: aiohttp.ClientResponse = await self.client.call_api(
            path, method, query_params=list(params), body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=client_timeout)
        if 200 <= resp.status < 300:
            return resp
        try:
            status = json.loads(await resp.read())
        except ValueError:
            status = {}
        finally:
            resp.release()
        if not isinstance(status, dict):
            status = {}
        raise ApiError(resp.status, str(status.get("reason") or resp.reason), str(status.get("message") or ""))


async def discover(api: KubeApi, res: Resource) -> str | None:
    """The version ``res`` is served at, or None if it is not served (a CRD that is not installed)."""
    candidates = list(res.versions)
    if res.group:
        try:
            group = await api.get(f"/apis/{res.group}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        served = {v.get("version") for v in group.get("versions") or [] if isinstance(v, dict)}
        preferred = (group.get("preferredVersion") or {}).get("version")
        candidates = sorted((v for v in candidates if v in served), key=lambda v: v != preferred)
    for version in candidates:
        try:
            listing = await api.get(res.version_path(version))
        except ApiError as exc:
            if exc.status == 404:
                continue
            raise
        if any(isinstance(r, dict) and r.get("name") == res.plural for r in listing.get("resources") or []):
            return version
    return None


class Backoff:
    """Capped exponential backoff with jitter: the n-th delay is uniform in [d/2, d], d = min(cap, base·2ⁿ)."""

    def __init__(self, base_s: float, cap_s: float, rng: random.Random) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self.rng = rng
        self.failures = 0

    def next(self) -> float:
        d = min(self.cap_s, self.base_s * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return d / 2 + self.rng.random() * d / 2

    def reset(self) -> None:
        self.failures = 0


# ------------------------------------------------------------------------------------------ publishing


class Publisher(Protocol):
    """Where keyed records go. ``publish`` may return before delivery; ``flush`` waits for all of it."""

    async def publish(self, key: str, record: Change, source: str) -> None: ...

    async def flush(self) -> None: ...


@runtime_checkable
class DeadLetterPublisher(Publisher, Protocol):
    """A publisher that also takes dead letters: records the watcher could not handle (``dead_letter`` may
    return before delivery too; ``flush`` waits for them as well). A watcher whose publisher is not one logs its
    dead letters instead."""

    async def dead_letter(self, letter: DeadLetter) -> None: ...


class BusPublisher:
    """Changes as ``(capture Record, run key)`` on an in-process bus: iterated, the bus is a source for
    ``tracker serve`` (``tracker.runtime.service.Source``) or any embedded pipeline.

    ``flush`` cannot know whether the consumer has committed what it took, so an embedded watcher should
    run without a checkpoint (it lists again at start; the reducer's own snapshot is the durable state).
    """

    def __init__(self, bus: InProcessBus[tuple[Record, str]]) -> None:
        self.bus = bus

    async def publish(self, key: str, record: Change, source: str) -> None:
        await self.bus.put((Record(source, record), key))

    async def flush(self) -> None:
        return None


class JsonlCapture:
    """Records appended as JSON lines ``{"type", "object", "key"}``, which ``tracker replay`` reads
    (``key`` is the run id a Kafka record would be keyed by; the reducer ignores it)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fh = path.open("a", encoding="utf-8")

    async def publish(self, key: str, record: Change, source: str) -> None:
        self.fh.write(json.dumps({**record, "key": key}, separators=(",", ":")) + "\n")

    async def flush(self) -> None:
        self.fh.flush()
        await asyncio.to_thread(os.fsync, self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


class LeadershipLost(Exception):
    """The lease this watcher published under is no longer certainly held: stop publishing now."""


class Leadership(Protocol):
    def valid(self) -> bool: ...


Keyed = tuple[str, Change, str]  # (run key, record, source)
OutItem = Keyed | DeadLetter


class Outbox:
    """The bounded queue between the streams and the publishing task, counting what went through: keyed records
    and dead letters, in the order handled.

    ``put_nowait`` never blocks (a change's records, and what it releases, are enqueued whole); streams call
    ``wait_room`` between changes, which is where back-pressure reaches the apiserver connection.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize <= 0:
            raise ValueError("the outbox must be bounded (maxsize > 0)")
        self.maxsize = maxsize
        self.items: deque[OutItem] = deque()
        self.enqueued = 0
        self.delivered = 0
        self._room = asyncio.Event()
        self._room.set()
        self._nonempty = asyncio.Event()
        self._progress = asyncio.Condition()

    def put_nowait(self, key: str, record: Change, source: str) -> None:
        self.put_item((key, record, source))

    def put_item(self, item: OutItem) -> None:
        self.items.append(item)
        self.enqueued += 1
        self._nonempty.set()
        if len(self.items) >= self.maxsize:
            self._room.clear()

    async def wait_room(self) -> None:
        while len(self.items) >= self.maxsize:
            await self._room.wait()

    async def get_batch(self, limit: int) -> list[OutItem]:
        while not self.items:
            self._nonempty.clear()
            await self._nonempty.wait()
        batch = [self.items.popleft() for _ in range(min(limit, len(self.items)))]
        if len(self.items) < self.maxsize:
            self._room.set()
        return batch

    async def mark_delivered(self, n: int) -> None:
        async with self._progress:
            self.delivered += n
            self._progress.notify_all()

    async def wait_delivered(self, seq: int) -> None:
        async with self._progress:
            await self._progress.wait_for(lambda: self.delivered >= seq)


# ------------------------------------------------------------------------------------------ keying


class RunKeys:
    """Key records by run id with the reducer's ``Correlator``, bounded in held records and in runs.

    Owner bindings are kept for the ``max_runs`` most recently seen runs; older runs are forgotten (a
    late record of a forgotten run is held, then dropped as uncorrelated, like a record whose owner was
    never seen).
    """

    def __init__(self, *, max_held: int, max_runs: int) -> None:
        self.corr = Correlator(max_held)
        self.max_runs = max_runs
        self.runs: OrderedDict[str, None] = OrderedDict()
        self.ignored = 0  # records of no run (a bare pod, an Event about a Node)
        self.held = 0
        self.released = 0
        self.dropped = 0
        self.just_dropped: list[tuple[str, Held]] = []  # for the caller to report, then clear

    def key(self, etype: str, obj: dict[str, Any], source: str) -> list[tuple[str, str, dict[str, Any], str]]:
        """``(run, type, object, source)`` for ``obj`` and every record its binding released, in order;
        empty if ``obj`` is held or belongs to no run. Raises ``Malformed``."""
        ln = link(obj)
        if ln is None:
            self.ignored += 1
            return []
        run = self.corr.run_of(ln)
        if run is None:
            assert ln.owner is not None
            self.held += 1
            dropped = self.corr.hold(ln.owner, (etype, obj, source))
            self.dropped += len(dropped)
            self.just_dropped.extend(dropped)
            return []
        self._touch(run)
        out = [(run, etype, obj, source)]
        if ln.uid:
            for held_etype, held_obj, held_source in self.corr.bind(ln.uid, run):
                self.released += 1
                out.extend(self.key(held_etype, held_obj, held_source))
        return out

    def restore(self, objects: Iterable[dict[str, Any]]) -> None:
        """Rebind the owners of checkpointed live objects: roots first, then their dependents by depth."""
        links = []
        for obj in objects:
            try:
                ln = link(obj)
            except x.Malformed:
                continue
            if ln is not None and ln.uid:
                links.append(ln)
        depth = {"RayCluster": 1, "Job": 1, "Workload": 1, "Pod": 2}
        for ln in sorted(links, key=lambda ln: 0 if ln.run_id is not None else depth.get(ln.kind, 3)):
            run = self.corr.run_of(ln)
            if run is not None:
                self._touch(run)
                self.corr.bind(ln.uid, run)

    def held_records(self) -> list[tuple[str, Held]]:
        """(owner uid, record) of everything waiting, oldest first."""
        return [(owner, item) for (owner, _seq), item in self.corr.held.items()]

    def _touch(self, run: str) -> None:
        self.runs[run] = None
        self.runs.move_to_end(run)
        while len(self.runs) > self.max_runs:
            old, _ = self.runs.popitem(last=False)
            self.corr.forget_run(old)


# ------------------------------------------------------------------------------------------ checkpoint

Entry = tuple[str, bytes]  # (resourceVersion, slimmed object as compact JSON)


@dataclass(slots=True)
class Snapshot:
    rvs: dict[str, str | None]  # stream key -> resourceVersion to resume from (None: list first)
    changed: dict[str, dict[str, Entry | None]]  # stream key -> uid -> entry (None: forgotten)
    held: list[tuple[str, Held]]


@dataclass(slots=True)
class Saved:
    rvs: dict[str, str | None] = field(default_factory=dict)
    known: dict[str, dict[str, Entry]] = field(default_factory=dict)
    held: list[Held] = field(default_factory=list)


class CheckpointStore(Protocol):
    """Where a watcher keeps its resumable state: ``load`` once at the start of a run (for a shared store, after
    fencing whoever saved before), ``save`` every increment (one transaction; raises ``LeadershipLost`` if a newer
    owner took the store over), ``close`` at the end."""

    async def load(self) -> Saved: ...

    async def save(self, snap: Snapshot) -> None: ...

    async def close(self) -> None: ...


class SqliteCheckpoint:
    """The ``CheckpointStore`` of one local SQLite file: opened, loaded and saved in a worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db: Checkpoint | None = None

    async def load(self) -> Saved:
        self.db = await asyncio.to_thread(Checkpoint, self.path)
        return await asyncio.to_thread(self.db.load)

    async def save(self, snap: Snapshot) -> None:
        assert self.db is not None, "load first"
        await asyncio.to_thread(self.db.save, snap)

    async def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


class Checkpoint:
    """The watcher's resumable state in one SQLite file; every save is one transaction."""

    SCHEMA = """
        CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS streams (stream TEXT PRIMARY KEY, rv TEXT);
        CREATE TABLE IF NOT EXISTS objects (stream TEXT NOT NULL, uid TEXT NOT NULL, rv TEXT NOT NULL,
                                            obj BLOB NOT NULL, PRIMARY KEY (stream, uid)) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS held (seq INTEGER PRIMARY KEY, type TEXT NOT NULL, obj BLOB NOT NULL,
                                         source TEXT NOT NULL);
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.lock = threading.Lock()  # one user at a time: saves run in a worker thread
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(self.SCHEMA)
        row = self.db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('version', ?)", (str(CHECKPOINT_VERSION),))
        elif row[0] != str(CHECKPOINT_VERSION):
            raise ValueError(f"{path}: unsupported watch checkpoint version {row[0]}")

    def load(self) -> Saved:
        with self.lock:
            return self._load()

    def _load(self) -> Saved:
        saved = Saved()
        for stream, rv in self.db.execute("SELECT stream, rv FROM streams"):
            saved.rvs[stream] = rv
        for stream, uid, rv, obj in self.db.execute("SELECT stream, uid, rv, obj FROM objects"):
            saved.known.setdefault(stream, {})[uid] = (rv, bytes(obj))
        for etype, obj, source in self.db.execute("SELECT type, obj, source FROM held ORDER BY seq"):
            saved.held.append((etype, json.loads(obj), source))
        return saved

    def save(self, snap: Snapshot) -> None:
        with self.lock:
            self._save(snap)

    def _save(self, snap: Snapshot) -> None:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT OR REPLACE INTO streams VALUES (?, ?)", snap.rvs.items())
            for stream, changed in snap.changed.items():
                db.executemany("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?)",
                               [(stream, uid, e[0], e[1]) for uid, e in changed.items() if e is not None])
                db.executemany("DELETE FROM objects WHERE stream = ? AND uid = ?",
                               [(stream, uid) for uid, e in changed.items() if e is None])
            db.execute("DELETE FROM held")
            db.executemany("INSERT INTO held (type, obj, source) VALUES (?, ?, ?)",
                           [(etype, json.dumps(obj, separators=(",", ":")), source)
                            for _owner, (etype, obj, source) in snap.held])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self.lock:
            self.db.close()


# ------------------------------------------------------------------------------------------ streams


class Gone(Exception):
    """410: the resourceVersion to resume from is older than the history the apiserver keeps."""


class BrokenStream(Exception):
    """The watch stream sent a line that is not JSON or not a watch event: the connection is dropped and the watch
    resumed from the last resourceVersion seen."""


class WatchFatal(RuntimeError):
    """A stream's loop failed in a way no reconnect can mend (a bug outside the handling of any one record)."""


@dataclass(slots=True)
class WatchStats:
    published: int = 0
    changes: int = 0  # ADDED/MODIFIED/DELETED changes handled (watch events, reconciled list items)
    record_bytes: int = 0  # their slimmed size (record size = record_bytes / changes)
    received_bytes: int = 0  # raw watch lines, before slimming
    unchanged: int = 0  # same uid and resourceVersion as already handled: not published again
    synthetic_deletes: int = 0
    relists: int = 0  # LISTs after the first (410 Gone)
    reconnects: int = 0  # watches that failed and were retried
    unavailable: int = 0  # times a resource was found not served or forbidden (each reported once)
    malformed: int = 0  # objects without uid/resourceVersion, or that correlation rejects
    dead_letters: int = 0  # records not published: malformed, or the watcher failed handling them
    known_evicted: int = 0
    largest_record: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class Stream:
    """LIST+WATCH of one resource in one namespace (or all), with the objects it knows."""

    def __init__(self, watcher: Watcher, res: Resource, namespace: str | None) -> None:
        self.watcher = watcher
        self.res = res
        self.namespace = namespace
        self.key = f"{res.name}@{namespace or '*'}"
        self.source = f"watch:{self.key}"
        self.version: str | None = None
        self.rv: str | None = None
        self.known: dict[str, Entry] = {}
        self.changed: dict[str, Entry | None] = {}
        self.synced = asyncio.Event()
        self.log = log.bind(stream=self.key)

    # ------------------------------------------------------------ state (synchronous: one whole change)

    def handle(self, etype: str, obj: dict[str, Any]) -> None:
        """One ADDED/MODIFIED/DELETED change: remember it, and publish it unless it is an exact repeat. A change
        that cannot be handled (a bug in slimming or keying an unexpected object) becomes a dead letter: it costs
        this record only, and the stream goes on."""
        try:
            self._handle(etype, obj)
        except Exception as exc:
            self.log.exception("watch_record_failed", type=etype, kind=obj.get("kind"), name=_name(obj))
            self.watcher.dead_letter(self.source, "watcher error", f"{type(exc).__name__}: {exc}", _identity(obj))

    def _handle(self, etype: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        stats = self.watcher.stats
        if not isinstance(uid, str) or not uid or not isinstance(rv, str):
            stats.malformed += 1
            self.log.warning("watch_object_malformed", detail="no metadata.uid or metadata.resourceVersion")
            self.watcher.dead_letter(self.source, f"malformed {obj.get('kind') or self.res.kind}",
                                     "metadata.uid or metadata.resourceVersion is missing", _identity(obj))
            return
        if etype == "DELETED":
            self.forget(uid)
        else:
            old = self.known.get(uid)
            if old is not None and old[0] == rv:
                stats.unchanged += 1
                return
        small = slim(obj)
        blob = jsonio.dumps(small)
        stats.changes += 1
        stats.record_bytes += len(blob)
        stats.largest_record = max(stats.largest_record, len(blob))
        if etype != "DELETED":
            self.remember(uid, (rv, blob))
        self.watcher.emit(etype, small, self.source)

    def remember(self, uid: str, entry: Entry) -> None:
        known = self.known
        if known.pop(uid, None) is None and len(known) >= self.watcher.config.max_known:
            old = next(iter(known))
            del known[old]
            self.changed[old] = None
            self.watcher.stats.known_evicted += 1
            if self.watcher.stats.known_evicted == 1:
                self.log.warning("watch_known_full", max_known=self.watcher.config.max_known)
        known[uid] = entry
        self.changed[uid] = entry

    def forget(self, uid: str) -> None:
        if self.known.pop(uid, None) is not None:
            self.changed[uid] = None

    def reconcile_item(self, obj: dict[str, Any], seen: set[str]) -> None:
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if isinstance(uid, str):
            seen.add(uid)
        self.handle("MODIFIED" if uid in self.known else "ADDED", obj)

    def reconcile_end(self, seen: set[str], list_rv: str) -> None:
        """After a full LIST: what was known and is gone was deleted while nobody watched."""
        for uid in [u for u in self.known if u not in seen]:
            _rv, blob = self.known[uid]
            self.forget(uid)
            self.watcher.stats.synthetic_deletes += 1
            self.watcher.emit("DELETED", jsonio.loads(blob), self.source)
        self.rv = list_rv

    # ------------------------------------------------------------ I/O

    async def run(self, lower_tiers: Sequence[Stream]) -> None:
        cfg = self.watcher.config
        backoff = Backoff(cfg.backoff_base_s, cfg.backoff_cap_s, self.watcher.rng)
        rarely = Backoff(cfg.backoff_base_s, cfg.unavailable_retry_cap_s, self.watcher.rng)
        if self.rv is None:
            for s in lower_tiers:
                await s.synced.wait()
        unavailable = False
        while True:
            try:
                if self.version is None:
                    self.version = await discover(self.watcher.api, self.res)
                    if self.version is None:
                        raise ApiError(404, "NotFound", f"{self.res.plural}.{self.res.group or 'core'} is not served")
                if self.rv is None:
                    await self.list()
                if unavailable:
                    self.log.info("watch_resource_available", version=self.version)
                    unavailable = False
                    rarely.reset()
                self.synced.set()
                if await self.watch():
                    backoff.reset()
                    continue
                delay = backoff.next()  # ended without a single line: do not spin
            except Gone as exc:
                self.watcher.stats.relists += 1
                self.log.info("watch_expired", detail=str(exc))
                self.rv = None
                delay = backoff.next()
            except ApiError as exc:
                if exc.status in (403, 404):  # CRD not installed (or removed), or RBAC does not allow it
                    if not unavailable:
                        self.watcher.stats.unavailable += 1
                        self.log.warning("watch_resource_unavailable", status=exc.status, detail=str(exc))
                    unavailable = True
                    self.version = None
                    self.synced.set()  # nothing to wait for: do not hold the higher tiers back
                    delay = rarely.next()
                else:
                    self.watcher.stats.reconnects += 1
                    delay = backoff.next()
                    self.log.warning("watch_failed", status=exc.status, detail=str(exc), retry_in_s=round(delay, 2))
            except (aiohttp.ClientError, HttpProcessingError, TimeoutError, OSError, BrokenStream) as exc:
                # HttpProcessingError: a broken chunked stream, or a line longer than MAX_EVENT_BYTES;
                # BrokenStream: a line that is not JSON or not a watch event
                self.watcher.stats.reconnects += 1
                delay = backoff.next()
                self.log.info("watch_reconnecting", error=type(exc).__name__, detail=str(exc)[:200],
                              retry_in_s=round(delay, 2))
            except Exception as exc:
                # not the connection, not one record (``handle`` dead-letters those): a bug of the loop, which
                # reconnecting would only repeat
                self.log.exception("watch_stream_failed")
                raise WatchFatal(f"the watch of {self.key} failed: {type(exc).__name__}: {exc}") from exc
            await asyncio.sleep(delay)

    async def list(self) -> None:
        """A paginated LIST, reconciled against ``known``; leaves ``rv`` at the list's resourceVersion."""
        assert self.version is not None
        api, cfg = self.watcher.api, self.watcher.config
        path = self.res.collection_path(self.version, self.namespace)
        api_version = self.res.api_version(self.version)
        seen: set[str] = set()
        cont = ""
        while True:
            params = [("limit", str(cfg.page_size))]
            if cont:
                params.append(("continue", cont))
            if self.res.label_selector:
                params.append(("labelSelector", self.res.label_selector))
            try:
                page = await api.get(path, params)
            except ApiError as exc:
                if exc.status == 410 and cont:
                    # the continue token outlived the compaction window: start over from a fresh snapshot
                    self.log.info("watch_list_restarted", detail=str(exc))
                    seen, cont = set(), ""
                    continue
                raise
            for item in page.get("items") or []:
                if isinstance(item, dict):
                    item["kind"], item["apiVersion"] = self.res.kind, api_version
                    self.reconcile_item(item, seen)
            meta = page.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            cont = meta.get("continue") or ""
            if not cont:
                list_rv = meta.get("resourceVersion")
                if not isinstance(list_rv, str) or not list_rv:
                    raise ApiError(200, "list without metadata.resourceVersion")
                self.reconcile_end(seen, list_rv)
                self.log.info("watch_listed", objects=len(seen), rv=list_rv)
                return
            await self.watcher.outbox.wait_room()

    async def watch(self) -> bool:
        """WATCH from ``rv`` until the server ends it; True if any line arrived. Raises Gone on 410."""
        assert self.version is not None and self.rv is not None
        cfg, stats = self.watcher.config, self.watcher.stats
        params = [("watch", "1"), ("resourceVersion", self.rv), ("allowWatchBookmarks", "true"),
                  ("timeoutSeconds", str(cfg.watch_timeout_s))]
        if self.res.label_selector:
            params.append(("labelSelector", self.res.label_selector))
        got = False
        try:
            async with self.watcher.api.lines(self.res.collection_path(self.version, self.namespace), params,
                                              read_timeout_s=cfg.read_timeout_s) as lines:
                async for line in lines:
                    got = True
                    stats.received_bytes += len(line)
                    try:
                        ev = jsonio.loads(line)
                    except ValueError as exc:
                        raise BrokenStream(f"a watch line that is not JSON: {exc}: {line[:200]!r}") from exc
                    self.event(ev)
                    await self.watcher.outbox.wait_room()
        except ApiError as exc:
            if exc.status == 410:
                raise Gone(str(exc)) from exc
            raise
        return got

    def event(self, ev: Any) -> None:
        if not isinstance(ev, dict) or not isinstance(ev.get("object"), dict):
            raise BrokenStream(f"not a watch event: {str(ev)[:200]}")
        etype, obj = ev.get("type"), ev["object"]
        if etype == "ERROR":
            code = obj.get("code")
            status = code if isinstance(code, int) else 500
            if status == 410:
                raise Gone(str(obj.get("message") or "Expired"))
            raise ApiError(status, str(obj.get("reason") or "watch error"), str(obj.get("message") or ""))
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            obj.setdefault("kind", self.res.kind)
            self.handle(etype, obj)
        elif etype != "BOOKMARK":
            raise BrokenStream(f"unknown watch event type {etype!r}")
        if isinstance(rv, str) and rv:
            self.rv = rv


# ------------------------------------------------------------------------------------------ watcher


class Watcher:
    """All streams of one watcher process, their keying, outbox, publishing and checkpoint."""

    def __init__(self, api: KubeApi, publisher: Publisher, config: WatchConfig | None = None, *,
                 checkpoint: Path | CheckpointStore | None = None, leadership: Leadership | None = None,
                 rng: random.Random | None = None) -> None:
        """``checkpoint``: a SQLite file, or any ``CheckpointStore`` (loaded by ``run``, closed when it ends)."""
        self.api = api
        self.publisher = publisher
        self.letters: DeadLetterPublisher | None = publisher if isinstance(publisher, DeadLetterPublisher) else None
        self.config = config or WatchConfig()
        self.leadership = leadership
        self.rng = rng or random.Random()
        self.stats = WatchStats()
        self.keys = RunKeys(max_held=self.config.max_held, max_runs=self.config.max_runs)
        self.outbox = Outbox(self.config.outbox_size)
        self.streams = [Stream(self, res, ns) for res in resources(self.config.events_api)
                        for ns in (self.config.namespaces or (None,))]
        self.store: CheckpointStore | None = (SqliteCheckpoint(checkpoint) if isinstance(checkpoint, Path)
                                              else checkpoint)
        self.saving = asyncio.Lock()
        self.started = asyncio.Event()  # state loaded, streams running

    # ------------------------------------------------------------ keyed emission (synchronous)

    def emit(self, etype: str, obj: dict[str, Any], source: str) -> None:
        if etype == "DELETED" and obj.get("kind") == "Event":
            return  # an Event's expiry is no lifecycle fact, and the reducer ignores it
        try:
            keyed = self.keys.key(etype, obj, source)
        except x.Malformed as exc:
            self.stats.malformed += 1
            log.warning("watch_object_uncorrelatable", source=source, detail=str(exc), kind=obj.get("kind"),
                        name=_name(obj))
            self.dead_letter(source, f"malformed {obj.get('kind')}", str(exc), obj)
            return
        except Exception as exc:  # a bug in keying this object: it costs this record only
            log.exception("watch_record_failed", source=source, type=etype, kind=obj.get("kind"), name=_name(obj))
            self.dead_letter(source, "watcher error", f"{type(exc).__name__}: {exc}", obj)
            return
        for run, k_etype, k_obj, k_source in keyed:
            self.outbox.put_nowait(run, {"type": k_etype, "object": k_obj}, k_source)
        if self.keys.just_dropped:
            for owner, (d_etype, d_obj, d_source) in self.keys.just_dropped:
                log.warning("watch_record_dropped", reason="owner not seen while max_held records were held",
                            owner_uid=owner, type=d_etype, kind=d_obj.get("kind"), source=d_source,
                            max_held=self.config.max_held)
            self.keys.just_dropped.clear()

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
                self.restore(await self.store.load())
            async with asyncio.TaskGroup() as tg:
                publishing = tg.create_task(self.publish_forever())
                housekeeping = tg.create_task(self.housekeep_forever())
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
        finally:
            if self.store is not None:
                await self.store.close()

    def restore(self, saved: Saved) -> None:
        for s in self.streams:
            s.rv = saved.rvs.get(s.key)
            s.known = saved.known.get(s.key, {})
        self.keys.restore(jsonio.loads(blob) for s in self.streams if s.res.kind != "Event"
                          for _rv, blob in s.known.values())
        for etype, obj, source in saved.held:  # what waited for an owner waits again (or is released)
            self.emit(etype, obj, source)
        log.info("watch_resumed", streams={s.key: s.rv for s in self.streams if s.rv},
                 objects=sum(len(s.known) for s in self.streams), held=len(saved.held))

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
                await self.publisher.publish(key, record, source)
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
        for s in self.streams:
            changed[s.key], s.changed = s.changed, {}
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


def _name(obj: dict[str, Any]) -> Any:
    meta = obj.get("metadata")
    return meta.get("name") if isinstance(meta, dict) else None


def _identity(obj: dict[str, Any]) -> dict[str, Any]:
    """What identifies a raw object, and nothing of its spec or status."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"),
            "metadata": {k: meta[k] for k in ("namespace", "name", "uid", "resourceVersion") if k in meta}}


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
