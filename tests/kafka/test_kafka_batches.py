"""``tracker.shell.kafka_batches.send_all`` against the real broker: in one transaction, records of several partitions
(and one without a partition, one larger than a batch, batches that fill up) arrive committed, each partition's in
the order given."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tracker.shell.kafka_batches import Out, send_all


@pytest.mark.kafka
async def test_a_transactions_records_arrive_in_order_per_partition(kafka_bootstrap: str) -> None:
    topic = f"batches-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 3, 1, topic_configs={"max.message.bytes": str(4 << 20)})])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"t-{topic}", acks="all",
                                enable_idempotence=True, max_batch_size=16_384, max_request_size=4 << 20)
    await producer.start()
    records = [Out(topic, i % 2, f"k{i}".encode(), f"v{i}".encode() * 40, (("kind", b"point"),)) for i in range(900)]
    records.insert(300, Out(topic, 1, b"big", b"x" * 100_000))  # larger than a batch: a send of its own
    records.insert(10, Out(topic, None, None, b"dead letter"))  # the partitioner's
    records.append(Out(topic, 0, b"k0", None))  # a tombstone
    try:
        await producer.begin_transaction()
        futures = await send_all(producer, records)
        for f in futures:
            await f
        await producer.commit_transaction()
    finally:
        await producer.stop()
    assert len(futures) < len(records) / 10, "records go a batch at a time"

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                isolation_level="read_committed", enable_auto_commit=False,
                                max_partition_fetch_bytes=4 << 20, fetch_max_bytes=8 << 20)
    await consumer.start()
    got: list[tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]] = []
    try:
        while len(got) < len(records):
            batch = await consumer.getmany(timeout_ms=10_000)
            assert batch, f"{len(got)} of {len(records)} records read"
            for tp_records in batch.values():
                got.extend((r.partition, r.key, r.value, tuple(r.headers)) for r in tp_records)
    finally:
        await consumer.stop()
    for partition in (0, 1):
        want = [(r.key, r.value, r.headers) for r in records if r.partition == partition]
        assert [(k, v, h) for p, k, v, h in got if p == partition and k is not None] == want
    assert sum(1 for _p, k, v, _h in got if k is None and v == b"dead letter") == 1
