"""The embedded bus: a bounded in-process queue standing where Kafka stands in a scaled-out install.

Put blocks when the queue is full (back-pressure, never unbounded buffering); ``close`` lets the consumer
drain what is queued and then stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

from tracker import errors

T = TypeVar("T")

_CLOSED = object()


class InProcessBus(Generic[T]):
    def __init__(self, maxsize: int) -> None:
        if maxsize <= 0:
            raise errors.ConfigError("an in-process bus must be bounded (maxsize > 0)")
        self._q: asyncio.Queue[object] = asyncio.Queue(maxsize)
        self._closed = False

    async def put(self, item: T) -> None:
        if self._closed:
            raise RuntimeError("bus is closed")
        await self._q.put(item)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._q.put(_CLOSED)

    def qsize(self) -> int:
        return self._q.qsize()

    async def __aiter__(self) -> AsyncIterator[T]:
        while True:
            item = await self._q.get()
            if item is _CLOSED:
                return
            yield item  # type: ignore[misc]

    def drain_nowait(self, limit: int) -> list[T]:
        """Up to ``limit`` items already queued (never the close marker), without waiting."""
        out: list[T] = []
        while len(out) < limit:
            try:
                item = self._q.get_nowait()
            except asyncio.QueueEmpty:
                break
            if item is _CLOSED:
                self._q.put_nowait(_CLOSED)  # leave the marker for the iterator
                break
            out.append(item)  # type: ignore[arg-type]
        return out
