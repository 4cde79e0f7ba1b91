"""``tracker.shell.changes``: the one producer of ``changes`` resends from the first failed delivery, on a new
producer, in order, at most ``source.max_retries`` times in a row. No Kafka: fake producers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaError

from tracker.core import wire
from tracker.settings import KafkaSettings, SourceSettings
from tracker.shell.changes import ChangesProducer


class Producer:
    """Acknowledges every send, except the ``fail``-th (0-based), which fails."""

    def __init__(self, log: list[tuple[int, bytes | None, bytes]], number: int, fail: int | None) -> None:
        self.log, self.number, self.fail, self.sent = log, number, fail, 0

    async def send(self, topic: str, *, value: bytes, key: bytes | None = None, headers: Any = None
                   ) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.sent == self.fail:
            fut.set_exception(KafkaError("broker restarted"))
        else:
            self.log.append((self.number, key, value))
            fut.set_result(None)
        self.sent += 1
        return fut

    async def stop(self) -> None:
        return None


def producer(fails: list[int | None], *, max_retries: int = 3) -> tuple[ChangesProducer, list[Any]]:
    log: list[tuple[int, bytes | None, bytes]] = []
    made = iter(range(len(fails)))
    out = ChangesProducer(ks=KafkaSettings(), source=SourceSettings(max_in_flight=100, max_retries=max_retries,
                                                                     retry_backoff_max_s=0.01))
    first = next(made)
    out.producer = Producer(log, first, fails[first])  # type: ignore[assignment]

    async def new_producer() -> Any:
        n = next(made)
        return Producer(log, n, fails[n])

    out._new_producer = new_producer  # type: ignore[method-assign]
    return out, log


async def test_a_failed_delivery_is_sent_again_from_the_first_failure_on_a_new_producer() -> None:
    out, log = producer([1, None])
    for i in range(4):
        await out.publish(f"run-{i}", {"i": i}, source=f"test:{i}")
    await out.flush()
    # the first producer acknowledged record 0 and failed record 1; the second got 1, 2 and 3 again, in order
    assert [(n, key) for n, key, _ in log] == [(0, b"run-0"), (0, b"run-2"), (0, b"run-3"),
                                               (1, b"run-1"), (1, b"run-2"), (1, b"run-3")]


async def test_the_retries_are_capped() -> None:
    out, _ = producer([0, 0, 0], max_retries=2)
    await out.publish("run-0", {}, source="test")
    with pytest.raises(KafkaError, match="broker restarted"):
        await out.flush()


async def test_the_keys_and_headers_are_the_wire_formats() -> None:
    sent: list[tuple[str, bytes | None, Any]] = []

    class Recording(Producer):
        async def send(self, topic: str, *, value: bytes, key: bytes | None = None, headers: Any = None
                       ) -> asyncio.Future[None]:
            sent.append((topic, key, headers))
            return await super().send(topic, value=value, key=key, headers=headers)

    ks = KafkaSettings()
    out = ChangesProducer(ks=ks, source=SourceSettings(), producer=Recording([], 0, None))  # type: ignore[arg-type]
    await out.publish("run-1", {"type": "ADDED"}, source="watch:jobs")
    await out.publish(None, {"type": "ADDED"}, source="x.jsonl:3")
    await out.flush()
    assert sent == [(ks.topics.changes, wire.change_key("run-1"), wire.change_headers("watch:jobs")),
                    (ks.topics.changes, None, [(wire.SOURCE_HEADER, b"x.jsonl:3")])]
