"""Leader election with a ``coordination.k8s.io/v1`` Lease, so that two watcher replicas never both publish.

The protocol is client-go's (``tools/leaderelection``), with its three durations explicit:

- ``lease_duration_s``: a candidate takes over a lease held by someone else only once it has seen the
  lease unchanged (same resourceVersion) for this long, measured on its own monotonic clock;
- ``renew_deadline_s``: the leader counts as leader only until ``renew_deadline_s`` after the *start* of
  its last successful renewal. Because ``renew_deadline_s < lease_duration_s``, it stops before any
  candidate can have waited out the lease, and the gap covers a publish already under way;
- ``retry_period_s``: between two attempts to acquire or renew.

Every write is an optimistic update (the resourceVersion read is sent back; a 409 means somebody else
wrote first). ``Lease.valid()`` is what the watcher checks before each publish, so publishing stops at
the deadline even if the renewing task is stuck; a renewal that finds another holder ends the lease at
once. Times written into the Lease (``acquireTime``, ``renewTime``) are informational: no decision here
reads another host's wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import aiohttp
import structlog

from tracker import errors
from tracker.settings import LEASE_DURATION_S, LEASE_NAME, RENEW_DEADLINE_S, RETRY_PERIOD_S
from tracker.shell.kube import ApiError, KubeApi

log = structlog.get_logger("tracker.leader")


class LeadershipLost(errors.Retryable):
    """The lease this watcher published under is no longer certainly held: stop publishing now."""


class Leadership(Protocol):
    """What a leader checks before each publish (``Lease``)."""

    def valid(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """One candidate's election, as ``tracker.settings.LeaseSettings`` configures it (with its defaults)."""

    namespace: str
    identity: str
    name: str = LEASE_NAME
    lease_duration_s: float = LEASE_DURATION_S
    renew_deadline_s: float = RENEW_DEADLINE_S
    retry_period_s: float = RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise errors.ConfigError("need 0 < retry_period_s < renew_deadline_s < lease_duration_s, got "
                             f"{self.retry_period_s}, {self.renew_deadline_s}, {self.lease_duration_s}")
        if not self.identity:
            raise errors.ConfigError("a lease holder needs an identity")


class Lease:
    """Leadership held until ``deadline`` (monotonic seconds) unless renewed."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self.deadline = deadline
        self.clock = clock

    def valid(self) -> bool:
        return self.clock() < self.deadline


class LeaseElector:
    def __init__(self, api: KubeApi, config: LeaseConfig, *, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        self.rng = rng or random.Random()
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{config.namespace}/leases/{config.name}"
        self.observed_rv: str | None = None
        self.observed_at = 0.0
        self.holder = ""  # as last observed
        self.last_error = ""

    async def acquire(self, stop: asyncio.Event) -> Lease | None:
        """Try every retry period until the lease is ours (returned) or ``stop`` is set (None)."""
        while not stop.is_set():
            start = self.clock()
            if await self.attempt():
                log.info("lease_acquired", lease=self.config.name, identity=self.config.identity)
                return Lease(start + self.config.renew_deadline_s, self.clock)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._jittered(self.config.retry_period_s))
        return None

    async def keep(self, lease: Lease) -> None:
        """Renew until the lease is lost, then raise ``LeadershipLost`` (``lease.valid()`` is already False)."""
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.retry_period_s)
            start = self.clock()
            remaining = lease.deadline - start
            if remaining > 0:
                try:
                    async with asyncio.timeout(remaining):
                        renewed = await self.attempt()
                except TimeoutError:
                    renewed = False
                if renewed:
                    lease.deadline = start + cfg.renew_deadline_s
                    continue
                if self.holder and self.holder != cfg.identity:
                    lease.deadline = self.clock()  # somebody else holds it: stop now, not at the deadline
            if not lease.valid():
                log.warning("lease_lost", lease=cfg.name, identity=cfg.identity, holder=self.holder,
                            last_error=self.last_error)
                raise LeadershipLost(f"lease {cfg.namespace}/{cfg.name} lost to {self.holder or 'nobody'}")

    async def release(self) -> None:
        """Give the lease up (if still ours) so that a candidate takes over without waiting it out."""
        try:
            current = await self.api.get(self.path)
            spec = current.get("spec") or {}
            if spec.get("holderIdentity") != self.config.identity:
                return
            now = _micro_time()
            await self.api.request("PUT", self.path, body={
                **current, "spec": {**spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                                    "acquireTime": now, "renewTime": now}})
            log.info("lease_released", lease=self.config.name, identity=self.config.identity)
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("lease_release_failed", detail=str(exc))

    async def attempt(self) -> bool:
        """One acquire-or-renew, within the renew deadline: True if the lease is now ours. Never raises for API
        or network errors, or time running out."""
        try:
            async with asyncio.timeout(self.config.renew_deadline_s):
                return await self._attempt()
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            error = str(exc) or type(exc).__name__
            if error != self.last_error:
                log.warning("lease_attempt_failed", lease=self.config.name, detail=error)
            self.last_error = error
            return False

    async def _attempt(self) -> bool:
        cfg = self.config
        now = _micro_time()
        try:
            current = await self.api.get(self.path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            try:
                created = await self.api.request(
                    "POST", self.path.rsplit("/", 1)[0],
                    body={"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                          "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                          "spec": self._spec(now, acquired=now, transitions=0)})
            except ApiError as conflict:
                if conflict.status == 409:
                    return False
                raise
            self._observe(created)
            return True
        self._observe(current)
        spec: dict[str, Any] = current.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        duration_s = duration if isinstance(duration, int) else cfg.lease_duration_s
        if self.holder and self.holder != cfg.identity and self.clock() < self.observed_at + duration_s:
            return False
        count = spec.get("leaseTransitions")
        transitions = count if isinstance(count, int) else 0
        ours = self.holder == cfg.identity
        body = {**current, "spec": self._spec(now, acquired=spec.get("acquireTime") if ours else now,
                                              transitions=transitions if ours else transitions + 1)}
        try:
            updated = await self.api.request("PUT", self.path, body=body)
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        self._observe(updated)
        return True

    def _spec(self, now: str, *, acquired: Any, transitions: int) -> dict[str, Any]:
        return {"holderIdentity": self.config.identity, "leaseDurationSeconds": math.ceil(self.config.lease_duration_s),
                "acquireTime": acquired, "renewTime": now, "leaseTransitions": transitions}

    def _observe(self, lease: dict[str, Any]) -> None:
        rv = (lease.get("metadata") or {}).get("resourceVersion")
        if rv != self.observed_rv:
            self.observed_rv = rv
            self.observed_at = self.clock()
        holder = (lease.get("spec") or {}).get("holderIdentity")
        self.holder = holder if isinstance(holder, str) else ""
        self.last_error = ""

    def _jittered(self, seconds: float) -> float:
        return seconds * (1 + 0.2 * self.rng.random())


async def lead(elector: LeaseElector, stop: asyncio.Event, *, body: Callable[[Lease], Awaitable[None]]) -> None:
    """Run ``body(lease)`` whenever this candidate leads, until ``stop``; a lost lease cancels ``body`` and
    candidacy starts over. ``body`` must return once ``stop`` is set; the lease is then released."""
    while not stop.is_set():
        lease = await elector.acquire(stop)
        if lease is None:
            return
        lost = False
        try:
            async with asyncio.TaskGroup() as tg:
                keeper = tg.create_task(elector.keep(lease))
                await body(lease)
                keeper.cancel()
        except* LeadershipLost:
            lost = True  # body was cancelled or stopped itself; stand as a candidate again
        if not lost:
            await elector.release()


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
