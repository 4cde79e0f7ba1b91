"""Positions of pending runs from Kueue's visibility API (``visibility.kueue.x-k8s.io``), where it is served.

Every ``visibility_interval_s`` the poller asks, for each ClusterQueue the watcher has seen with pending workloads
(at most ``visibility_max_cluster_queues``, the most pending first), for its pending workloads
(``clusterqueues/<name>/pendingworkloads``, at most ``visibility_page_limit`` of them, each request bounded by
``visibility_timeout_s``), and publishes one position record per pending workload whose run the watcher knows
(``tracker.core.queues.position_record``, keyed by the run, with the poll's time). A run listed at the previous poll
of its ClusterQueue and no longer is published once with null positions (admitted, deleted, or moved).

Where the API is not served (no such group, a 404, or 403: not allowed) the poller says so once
(``visibility_api_unavailable``, with the reason) and looks again every ``unavailable_retry_cap_s`` without saying
it again; the watch goes on either way. A failed poll of one ClusterQueue is logged and retried at the next round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import structlog

from tracker.core.queues import position_record
from tracker.settings import WatchSettings
from tracker.shell.kube import ApiError, KubeApi

log = structlog.get_logger("tracker.watch")

GROUP = "visibility.kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # preferred first, as the Workloads' versions
Publish = Callable[..., None]  # (key, record, *, source): the outbox's put_nowait
Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


class Unavailable(Exception):
    """The visibility API is not served here, or not allowed."""


class VisibilityPoller:
    """Polls the pending workloads of pending ClusterQueues and publishes the positions of their runs."""

    def __init__(self, api: KubeApi, config: WatchSettings, *, publish: Publish, pending: Callable[[], dict[str, int]],
                 run_of: Callable[[str, str], str | None], clock: Clock = _now) -> None:
        self.api = api
        self.config = config
        self.publish = publish
        self.pending = pending
        self.run_of = run_of
        self.clock = clock
        self.version: str | None = None
        self.unavailable: str | None = None  # the reason, once said
        self.listed: dict[str, dict[str, tuple[str, str, str | None]]] = {}  # cq -> run -> (ns, workload, lq)
        self.polls = 0
        self.published = 0
        self.failures = 0

    async def run(self) -> None:
        cfg = self.config
        while True:
            try:
                await self.poll_once()
                delay = cfg.visibility_interval_s
            except Unavailable as exc:
                if self.unavailable is None:
                    log.warning("visibility_api_unavailable", reason=str(exc),
                                detail="positions in queue are not recorded; pending counts and quota still are")
                self.unavailable = str(exc)
                self.version = None
                delay = max(cfg.visibility_interval_s, cfg.unavailable_retry_cap_s)
            await asyncio.sleep(delay)

    async def discover(self) -> str:
        """The served version of the visibility API; Unavailable when there is none (or it is not allowed)."""
        try:
            group = await self._get(f"/apis/{GROUP}")
        except ApiError as exc:
            if exc.status in (403, 404):
                raise Unavailable(f"{GROUP} is not served ({exc})") from exc
            raise
        served = {v.get("version") for v in group.get("versions") or [] if isinstance(v, dict)}
        for version in VERSIONS:
            if version in served:
                return version
        raise Unavailable(f"{GROUP} serves none of {', '.join(VERSIONS)} (served: {sorted(map(str, served))})")

    async def poll_once(self) -> int:
        """One round over the pending ClusterQueues; the number of position records published."""
        if self.version is None:
            self.version = await self.discover()
            if self.unavailable is not None:
                log.info("visibility_api_available", version=self.version)
                self.unavailable = None
        pending = sorted(((n, cq) for cq, n in self.pending().items()), key=lambda p: (-p[0], p[1]))
        chosen = [cq for n, cq in pending if n > 0][:self.config.visibility_max_cluster_queues]
        published = 0
        for cq in sorted(set(self.listed) - set(chosen)):  # nothing pending any more: their runs left the queue
            published += self._publish(cq, {}, self.clock())
        for cq in chosen:
            try:
                items = await self._pending_workloads(cq)
            except ApiError as exc:
                if exc.status == 403:
                    raise Unavailable(f"pending workloads of ClusterQueue {cq} are not allowed ({exc})") from exc
                self.failures += 1
                log.warning("visibility_poll_failed", cluster_queue=cq, status=exc.status, detail=str(exc)[:200])
                continue
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self.failures += 1
                log.warning("visibility_poll_failed", cluster_queue=cq, error=type(exc).__name__,
                            detail=str(exc)[:200])
                continue
            published += self._publish(cq, items, self.clock())
        self.polls += 1
        self.published += published
        return published

    async def _pending_workloads(self, cq: str) -> dict[str, tuple[str, str, str | None, int | None, int | None]]:
        assert self.version is not None
        path = f"/apis/{GROUP}/{self.version}/clusterqueues/{cq}/pendingworkloads"
        page = await self._get(path, [("limit", str(self.config.visibility_page_limit)), ("offset", "0")])
        out: dict[str, tuple[str, str, str | None, int | None, int | None]] = {}
        for item in (page.get("items") or [])[:self.config.visibility_page_limit]:
            if not isinstance(item, dict):
                continue
            meta = item.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            ns, name = meta.get("namespace"), meta.get("name")
            if not isinstance(ns, str) or not isinstance(name, str):
                continue
            run = self.run_of(ns, name)
            if run is None:
                continue  # a Workload of no run the watcher knows (yet): the next poll may know it
            lq = item.get("localQueueName")
            out[run] = (ns, name, lq if isinstance(lq, str) and lq else None,
                        _int(item.get("positionInClusterQueue")), _int(item.get("positionInLocalQueue")))
        return out

    def _publish(self, cq: str, items: dict[str, tuple[str, str, str | None, int | None, int | None]],
                 now: datetime) -> int:
        polled_at = now.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        before = self.listed.pop(cq, {})
        n = 0
        for run in sorted(before):
            if run not in items:  # left the queue since the last poll: its position is no more
                ns, name, lq = before[run]
                self.publish(run, position_record(run_id=run, namespace=ns, workload=name, cluster_queue=cq,
                                                  local_queue=lq, position_in_cluster_queue=None,
                                                  position_in_local_queue=None, polled_at=polled_at),
                             source=f"visibility:{cq}")
                n += 1
        for run in sorted(items):
            ns, name, lq, in_cq, in_lq = items[run]
            self.publish(run, position_record(run_id=run, namespace=ns, workload=name, cluster_queue=cq,
                                              local_queue=lq, position_in_cluster_queue=in_cq,
                                              position_in_local_queue=in_lq, polled_at=polled_at),
                         source=f"visibility:{cq}")
            n += 1
        if items:
            self.listed[cq] = {run: (ns, name, lq) for run, (ns, name, lq, _c, _l) in items.items()}
        return n

    async def _get(self, path: str, params: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        return await asyncio.wait_for(self.api.get(path, params or []), self.config.visibility_timeout_s)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None
