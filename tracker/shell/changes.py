"""The one producer of the ``changes`` topic: what ``tracker watch`` and ``tracker serve``'s intake send to Kafka.

A change goes to ``changes`` keyed by its run (``tracker.core.wire``: the run key, the ``source`` header), as the
JSON of the watch event; a record that could not be read or keyed goes to ``dead-letters`` instead. The order of a
run's records on its partition is the order the reducer folds them in, so what this producer guarantees is about
order as much as delivery.

**Delivery and the retry rule.** Sends are asynchronous: at most ``source.max_in_flight`` records are
unacknowledged, each send is bounded by ``kafka.call_timeout_s``. ``flush`` (called by the caller, and by
``publish`` itself when the window is full) waits until every record of the window is acknowledged. When a delivery
fails (an error, or no acknowledgement within the call timeout, as when a broker restart outlasts the request
timeout):

1. the producer is replaced: an idempotent producer cannot go on after a failed batch, and its sequence numbers
   would make the broker refuse what follows;
2. every record from the first one that failed is sent again, in order (the records acknowledged before it are not),
   so each object's last state is also the last one sent; the reducer ignores the duplicates this makes (it folds by
   ``resourceVersion``);
3. after a backoff (``kafka.backoff_s``, capped at ``source.retry_backoff_max_s``), at most ``source.max_retries``
   times in a row for one window; then the last error is raised and the caller stops (the watcher does not
   checkpoint what was not delivered, so a restart sends it again).

Starting the producer is retried the same way (``kafka.retrying``, the same cap and backoff); refused credentials
(``KafkaSecurityError``) are not retried.

Both the watcher (``Publisher``/``DeadLetterPublisher`` in ``tracker.shell.watch.publish``) and ``serve``'s intake
(``tracker.runtime.service.publish``) use this one class, so both follow this one rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from tracker.core import wire
from tracker.core.model import DeadLetter
from tracker.settings import KafkaSettings, SourceSettings
from tracker.shell import jsonio, kafka

log = structlog.get_logger("tracker.changes")


@dataclass(frozen=True, slots=True)
class _Outgoing:
    """One encoded record, kept until acknowledged so it can be sent again as it was."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] | None


class ChangesProducer:
    """Changes to ``changes`` and dead letters to ``dead-letters``, by the retry rule above (module docstring).

    ``producer``: a started producer to begin with (tests); by default one is started by ``start``."""

    def __init__(self, *, ks: KafkaSettings, source: SourceSettings, producer: AIOKafkaProducer | None = None) -> None:
        self.ks = ks
        self.source = source
        self.max_in_flight = source.max_in_flight
        self.producer = producer
        self.window: list[tuple[_Outgoing, asyncio.Future[object]]] = []

    async def start(self) -> None:
        if self.producer is None:
            self.producer = await kafka.retrying("starting the changes producer", self._new_producer,
                                                 retries=self.source.max_retries,
                                                 backoff_max_s=self.source.retry_backoff_max_s)

    async def stop(self) -> None:
        """Stop the producer (which flushes what is sent; ``flush`` first to wait for the acknowledgements)."""
        if self.producer is not None:
            await kafka.stop(self.producer, self.ks, what="changes producer")
            self.producer = None

    async def publish(self, key: str | None, record: dict[str, Any], *, source: str) -> None:
        """Send a change keyed by its run key (None: no key, the reducer dead-letters it)."""
        await self._send(_Outgoing(self.ks.topics.changes, wire.change_key(key), jsonio.dumps(record),
                                   wire.change_headers(source)))

    async def dead_letter(self, letter: DeadLetter) -> None:
        await self._send(_Outgoing(self.ks.topics.dead_letters, None, letter.model_dump_json().encode(), None))

    async def flush(self) -> None:
        """Wait until every record sent so far is acknowledged, sending again from the first failure."""
        window, self.window = self.window, []
        attempt = 0
        while window:
            await asyncio.wait([fut for _, fut in window], timeout=self.ks.call_timeout_s)
            failed = next((i for i, (_, fut) in enumerate(window) if not fut.done() or fut.exception()), None)
            if failed is None:
                return
            fut = window[failed][1]
            error: BaseException = (fut.exception() or KafkaError("delivery failed")) if fut.done() else \
                kafka.KafkaCallTimeout(f"delivering changes did not finish within {self.ks.call_timeout_s:g}s")
            again = [out for out, _ in window[failed:]]
            while True:
                attempt += 1
                if attempt > self.source.max_retries:
                    raise error
                delay = kafka.backoff_s(attempt, self.source.retry_backoff_max_s)
                log.warning("changes_delivery_failed",
                            attempt=attempt, records=len(again), retry_in_s=delay, error=repr(error))
                await asyncio.sleep(delay)
                await self.stop()
                try:
                    self.producer = await self._new_producer()
                    window = [(out, await self._sent(out)) for out in again]
                    break
                except (KafkaError, TimeoutError, OSError) as exc:
                    error = exc

    async def _send(self, out: _Outgoing) -> None:
        self.window.append((out, await self._sent(out)))
        if len(self.window) >= self.max_in_flight:
            await self.flush()

    async def _sent(self, out: _Outgoing) -> asyncio.Future[object]:
        assert self.producer is not None, "ChangesProducer.start() was not called"
        what = "sending a change" if out.topic == self.ks.topics.changes else "sending a dead letter"
        fut: asyncio.Future[object] = await kafka.bounded(
            self.producer.send(out.topic, value=out.value, key=out.key, headers=out.headers),
            self.ks.call_timeout_s, what=what)
        return fut

    async def _new_producer(self) -> AIOKafkaProducer:
        producer = kafka.make_producer(self.ks)
        await kafka.start(producer, self.ks, what="changes producer")
        return producer


@asynccontextmanager
async def changes_producer(*, ks: KafkaSettings, source: SourceSettings) -> AsyncIterator[ChangesProducer]:
    """A started ``ChangesProducer``, stopped at the end (a flush is the caller's: what it has not flushed is
    sent by the producer's stop, unacknowledged)."""
    out = ChangesProducer(ks=ks, source=source)
    await out.start()
    try:
        yield out
    finally:
        await out.stop()
