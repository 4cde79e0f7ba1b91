"""Where the watcher's keyed records go: the ``Publisher`` protocol and its implementations (an in-process bus, a
JSON-lines capture; the Kafka changes topic's is ``tracker.shell.changes.ChangesProducer``, the one producer of
``changes``, shared with ``tracker serve``'s intake), and the bounded ``Outbox`` between the streams and the
publishing task."""

from __future__ import annotations

import asyncio
import json
import os
from collections import deque
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tracker import errors
from tracker.core.model import DeadLetter
from tracker.shell.bus import InProcessBus
from tracker.shell.capture import Record

Change = dict[str, Any]  # a published record: {"type": ADDED|MODIFIED|DELETED, "object": slimmed object}


class Publisher(Protocol):
    """Where keyed records go. ``publish`` may return before delivery; ``flush`` waits for all of it."""

    async def publish(self, key: str, record: Change, *, source: str) -> None: ...

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

    async def publish(self, key: str, record: Change, *, source: str) -> None:
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

    async def publish(self, key: str, record: Change, *, source: str) -> None:
        self.fh.write(json.dumps({**record, "key": key}, separators=(",", ":")) + "\n")

    async def flush(self) -> None:
        self.fh.flush()
        await asyncio.to_thread(os.fsync, self.fh.fileno())

    def close(self) -> None:
        self.fh.close()


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
            raise errors.ConfigError("the outbox must be bounded (maxsize > 0)")
        self.maxsize = maxsize
        self.items: deque[OutItem] = deque()
        self.enqueued = 0
        self.delivered = 0
        self._room = asyncio.Event()
        self._room.set()
        self._nonempty = asyncio.Event()
        self._progress = asyncio.Condition()

    def put_nowait(self, key: str, record: Change, *, source: str) -> None:
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
