"""Smoke test: the Kafka broker supports what the tracker relies on (transactions, read_committed, groups)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

pytestmark = pytest.mark.kafka


async def _drain(consumer: AIOKafkaConsumer, *, expected: int) -> list[ConsumerRecord]:
    """Poll until `expected` records arrived, then poll once more to catch anything unexpected."""
    records: list[ConsumerRecord] = []
    async with asyncio.timeout(30):
        while len(records) < expected:
            batches = await consumer.getmany(timeout_ms=500)
            records += [record for batch in batches.values() for record in batch]
    batches = await consumer.getmany(timeout_ms=1000)
    return records + [record for batch in batches.values() for record in batch]


async def test_transactional_round_trip_hides_aborted_records(kafka_bootstrap: str) -> None:
    topic = f"infra-smoke-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{topic}-tx")
    await producer.start()
    try:
        async with producer.transaction():
            for partition in (0, 1):
                await producer.send_and_wait(topic, f"committed-{partition}".encode(), partition=partition)
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted", partition=0)
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"after-abort", partition=1)
    finally:
        await producer.stop()

    group = f"{topic}-group"
    committed_reader = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await committed_reader.start()
    try:
        records = await _drain(committed_reader, expected=3)
        assert sorted(r.value for r in records) == [b"after-abort", b"committed-0", b"committed-1"]
        assert {r.partition for r in records} == {0, 1}
        assert committed_reader.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        await committed_reader.commit()
        # Partition 0: committed-0, its commit marker, the aborted record, its abort marker.
        assert await committed_reader.committed(TopicPartition(topic, 0)) == 4
    finally:
        await committed_reader.stop()

    # The aborted record was really written; only read_committed filtering hid it.
    raw_reader = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, isolation_level="read_uncommitted", auto_offset_reset="earliest"
    )
    await raw_reader.start()
    try:
        assert b"aborted" in {r.value for r in await _drain(raw_reader, expected=4)}
    finally:
        await raw_reader.stop()
