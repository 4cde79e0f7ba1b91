"""One watch stream: LIST+WATCH of one resource in one namespace (or all), with the objects it knows; the loop of
``tracker.shell.watch``'s theory of operation, steps 1 to 4. A stream is given what it needs (the API, the
settings, the statistics to count in, and where handled changes and dead letters go); it knows no watcher."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog
from aiohttp.http_exceptions import HttpProcessingError

from tracker import errors
from tracker.settings import WatchSettings
from tracker.shell import jsonio
from tracker.shell.kube import ApiError, Backoff, KubeApi, Resource, discover
from tracker.shell.slim import SHAPES, slim
from tracker.shell.typed import slim_line, slim_list
from tracker.shell.watch.checkpoint import Entry
from tracker.shell.watch.packed import pack, unpack

log = structlog.get_logger("tracker.watch")

Emit = Callable[[str, dict[str, Any], str], None]  # (type, slimmed object, source): key and queue a change
DeadLetterSink = Callable[[str, str, str, Any], None]  # (source, reason, detail, excerpt): queue a dead letter


class Gone(errors.Retryable):
    """410: the resourceVersion to resume from is older than the history the apiserver keeps."""


class BrokenStream(errors.Retryable):
    """The watch stream sent a line that is not JSON or not a watch event: the connection is dropped and the watch
    resumed from the last resourceVersion seen."""


class WatchFatal(errors.GaveUp):
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

    def __init__(self, res: Resource, namespace: str | None, *, api: KubeApi, config: WatchSettings,
                 stats: WatchStats, rng: random.Random, emit: Emit, dead_letter: DeadLetterSink,
                 wait_room: Callable[[], Awaitable[None]]) -> None:
        """``emit`` keys and queues a handled change, ``dead_letter`` a record that cannot be handled; the stream
        awaits ``wait_room`` between changes (the outbox's back-pressure)."""
        self.api = api
        self.config = config
        self.stats = stats
        self.rng = rng
        self.emit = emit
        self.dead_letter = dead_letter
        self.wait_room = wait_room
        self.res = res
        self.namespace = namespace
        self.key = f"{res.name}@{namespace or '*'}"
        self.source = f"watch:{self.key}"
        self.version: str | None = None
        self.rv: str | None = None
        # uid -> (resourceVersion, slimmed object packed: ``packed``); what changed since the last checkpoint
        self.known: dict[str, Entry] = {}
        self.changed: dict[str, Entry | None] = {}
        self.synced = asyncio.Event()
        self.log = log.bind(stream=self.key)

    # ------------------------------------------------------------ state (synchronous: one whole change)

    def handle(self, etype: str, obj: dict[str, Any], *, slimmed: bool = False) -> None:
        """One ADDED/MODIFIED/DELETED change: remember it, and publish it unless it is an exact repeat. A change
        that cannot be handled (a bug in slimming or keying an unexpected object) becomes a dead letter: it costs
        this record only, and the stream goes on. ``slimmed``: ``obj`` is slimmed already (``slim.slim``)."""
        try:
            self._handle(etype, obj, slimmed)
        except Exception as exc:
            self.log.exception("watch_record_failed", type=etype, kind=obj.get("kind"), name=name_of(obj))
            self.dead_letter(self.source, "watcher error", f"{type(exc).__name__}: {exc}", _identity(obj))

    def _handle(self, etype: str, obj: dict[str, Any], slimmed: bool) -> None:
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        stats = self.stats
        if not isinstance(uid, str) or not uid or not isinstance(rv, str):
            stats.malformed += 1
            self.log.warning("watch_object_malformed", detail="no metadata.uid or metadata.resourceVersion")
            self.dead_letter(self.source, f"malformed {obj.get('kind') or self.res.kind}",
                                     "metadata.uid or metadata.resourceVersion is missing", _identity(obj))
            return
        if etype == "DELETED":
            self.forget(uid)
        else:
            old = self.known.get(uid)
            if old is not None and old[0] == rv:
                stats.unchanged += 1
                return
        small = obj if slimmed else slim(obj)
        blob = jsonio.dumps(small)
        stats.changes += 1
        stats.record_bytes += len(blob)
        stats.largest_record = max(stats.largest_record, len(blob))
        if etype != "DELETED":
            self.remember(uid, (rv, pack(blob)))
        self.emit(etype, small, self.source)

    def remember(self, uid: str, entry: Entry) -> None:
        known = self.known
        if known.pop(uid, None) is None and len(known) >= self.config.max_known:
            old = next(iter(known))
            del known[old]
            self.changed[old] = None
            self.stats.known_evicted += 1
            if self.stats.known_evicted == 1:
                self.log.warning("watch_known_full", max_known=self.config.max_known)
        known[uid] = entry
        self.changed[uid] = entry

    def forget(self, uid: str) -> None:
        if self.known.pop(uid, None) is not None:
            self.changed[uid] = None

    def reconcile_item(self, obj: dict[str, Any], seen: set[str], *, slimmed: bool = False) -> None:
        meta = obj.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        if isinstance(uid, str):
            seen.add(uid)
        self.handle("MODIFIED" if uid in self.known else "ADDED", obj, slimmed=slimmed)

    def reconcile_end(self, seen: set[str], list_rv: str) -> None:
        """After a full LIST: what was known and is gone was deleted while nobody watched."""
        for uid in [u for u in self.known if u not in seen]:
            _rv, packed = self.known[uid]
            self.forget(uid)
            self.stats.synthetic_deletes += 1
            self.emit("DELETED", jsonio.loads(unpack(packed)), self.source)
        self.rv = list_rv

    # ------------------------------------------------------------ I/O

    async def run(self, lower_tiers: Sequence[Stream]) -> None:
        cfg = self.config
        backoff = Backoff(base_s=cfg.backoff_base_s, cap_s=cfg.backoff_cap_s, rng=self.rng)
        rarely = Backoff(base_s=cfg.backoff_base_s, cap_s=cfg.unavailable_retry_cap_s, rng=self.rng)
        if self.rv is None:
            for s in lower_tiers:
                await s.synced.wait()
        unavailable = False
        while True:
            try:
                if self.version is None:
                    self.version = await discover(self.api, self.res)
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
                self.stats.relists += 1
                self.log.info("watch_expired", detail=str(exc))
                self.rv = None
                delay = backoff.next()
            except ApiError as exc:
                if exc.status in (403, 404):  # CRD not installed (or removed), or RBAC does not allow it
                    if not unavailable:
                        self.stats.unavailable += 1
                        self.log.warning("watch_resource_unavailable", status=exc.status, detail=str(exc))
                    unavailable = True
                    self.version = None
                    self.synced.set()  # nothing to wait for: do not hold the higher tiers back
                    delay = rarely.next()
                else:
                    self.stats.reconnects += 1
                    delay = backoff.next()
                    self.log.warning("watch_failed", status=exc.status, detail=str(exc), retry_in_s=round(delay, 2))
            except (aiohttp.ClientError, HttpProcessingError, TimeoutError, OSError, BrokenStream) as exc:
                # HttpProcessingError: a broken chunked stream, or a line longer than MAX_EVENT_BYTES;
                # BrokenStream: a line that is not JSON or not a watch event
                self.stats.reconnects += 1
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
        api, cfg = self.api, self.config
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
                status, data = await api.request_bytes("GET", path, params=params)
            except ApiError as exc:
                if exc.status == 410 and cont:
                    # the continue token outlived the compaction window: start over from a fresh snapshot
                    self.log.info("watch_list_restarted", detail=str(exc))
                    seen, cont = set(), ""
                    continue
                raise
            # the items decoded into their slimmed shape (``typed``); else the page decoded whole, its items slimmed
            # one by one as they are handled (a slimming bug is then that item's dead letter)
            try:
                page = slim_list(data, self.res.kind, api_version)
            except Exception:  # slimming failed: each item is slimmed again as it is handled
                page = None
            slimmed = page is not None
            if page is None:
                page = api.decoded(status, data)
            for item in page.get("items") or []:
                if isinstance(item, dict):
                    if not slimmed:
                        item["kind"], item["apiVersion"] = self.res.kind, api_version
                    self.reconcile_item(item, seen, slimmed=slimmed)
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
            await self.wait_room()

    async def watch(self) -> bool:
        """WATCH from ``rv`` until the server ends it; True if any line arrived. Raises Gone on 410."""
        assert self.version is not None and self.rv is not None
        cfg, stats = self.config, self.stats
        params = [("watch", "1"), ("resourceVersion", self.rv), ("allowWatchBookmarks", "true"),
                  ("timeoutSeconds", str(cfg.watch_timeout_s))]
        if self.res.label_selector:
            params.append(("labelSelector", self.res.label_selector))
        got = False
        try:
            async with self.api.lines(self.res.collection_path(self.version, self.namespace), params,
                                              read_timeout_s=cfg.read_timeout_s) as lines:
                async for line in lines:
                    got = True
                    stats.received_bytes += len(line)
                    try:  # the fields slimming keeps only, slimmed (``typed``)
                        ev, slimmed = slim_line(line), True
                    except Exception:  # not JSON, or slimming failed: ``handle`` slims it again (a dead letter)
                        try:
                            ev, slimmed = jsonio.loads(line), False
                        except ValueError as exc:
                            raise BrokenStream(f"a watch line that is not JSON: {exc}: {line[:200]!r}") from exc
                    self.event(ev, slimmed=slimmed)
                    await self.wait_room()
        except ApiError as exc:
            if exc.status == 410:
                raise Gone(str(exc)) from exc
            raise
        return got

    def event(self, ev: Any, *, slimmed: bool = False) -> None:
        """One watch event; ``slimmed``: it is ``slim.slim_event``'s (its object slimmed if its kind has a shape)."""
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
            kind = obj.get("kind")  # an object without its kind is slimmed once it has one
            slimmed = slimmed and isinstance(kind, str) and kind in SHAPES
            obj.setdefault("kind", self.res.kind)
            self.handle(etype, obj, slimmed=slimmed)
        elif etype != "BOOKMARK":
            raise BrokenStream(f"unknown watch event type {etype!r}")
        if isinstance(rv, str) and rv:
            self.rv = rv


def name_of(obj: dict[str, Any]) -> Any:
    """The object's metadata.name, if it has one (for a log line)."""
    meta = obj.get("metadata")
    return meta.get("name") if isinstance(meta, dict) else None


def _identity(obj: dict[str, Any]) -> dict[str, Any]:
    """What identifies a raw object, and nothing of its spec or status."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"),
            "metadata": {k: meta[k] for k in ("namespace", "name", "uid", "resourceVersion") if k in meta}}
