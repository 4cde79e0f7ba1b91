"""What a produced record costs the reducer's process: aiokafka's ``send`` a record (the baseline) against
``tracker.shell.kafka_batches.send_all`` (a batch per partition), in transactions on one broker.

    uv run python -m tests.infra up --components kafka      # or any broker: --bootstrap HOST:PORT
    uv run python bench/kafka_produce.py [--records 1000] [--transactions 20] [--value-bytes 300] [--rounds 2]

Each round writes ``--transactions`` transactions of ``--records`` records (keys like a metric point's, the header
``kind: point``, spread over 4 partitions as ``tracker reduce`` spreads a transaction over one partition of each
topic) once with each way, alternated, and prints the CPU time of this process per record (the figure that moves
least with the machine's load) and the wall time per record, begin..commit included.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench._common import default_bootstrap, load_average
from tracker.shell.kafka_batches import Out, send_all

PARTITIONS = 4


async def _one_way(producer: AIOKafkaProducer, records: list[Out], transactions: int, batched: bool) -> tuple[float,
                                                                                                          float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(transactions):
        await producer.begin_transaction()
        if batched:
            futures = await send_all(producer, records)
        else:
            futures = [await producer.send(r.topic, value=r.value, key=r.key, partition=r.partition,
                                           headers=list(r.headers)) for r in records]
        await asyncio.gather(*futures)
        await producer.commit_transaction()
    n = transactions * len(records)
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the test environment's broker)")
    parser.add_argument("--records", type=int, default=1000, help="records a transaction (default 1000)")
    parser.add_argument("--transactions", type=int, default=20, help="transactions a way and round (default 20)")
    parser.add_argument("--value-bytes", type=int, default=300, help="bytes a record's value (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each way once a round (default 2)")
    args = parser.parse_args(argv)
    bootstrap = args.bootstrap or default_bootstrap()
    if not bootstrap:
        print("no broker: pass --bootstrap or run `python -m tests.infra up --components kafka`", file=sys.stderr)
        return 2
    topic = f"bench-produce-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=topic, enable_idempotence=True,
                                acks="all", linger_ms=0)
    await producer.start()
    value = b"x" * args.value_bytes
    records = [Out(topic, i % PARTITIONS, f"run-{i % 200}/point/{i}/train/loss".encode(), value,
                   (("kind", b"point"),)) for i in range(args.records)]
    print(f"broker {bootstrap}, topic {topic} ({PARTITIONS} partitions); {args.transactions} transactions of "
          f"{args.records} records of {args.value_bytes} bytes a way and round; {load_average()} before")
    try:
        await _one_way(producer, records, 2, batched=True)  # connections and metadata, not measured
        for n in range(1, args.rounds + 1):
            for batched in (False, True):
                cpu_us, wall_us = await _one_way(producer, records, args.transactions, batched)
                way = "send_all, a batch per partition" if batched else "send, a record at a time (baseline)"
                print(f"  round {n}  {way:38s} {cpu_us:6.1f} us CPU a record  {wall_us:6.1f} us wall a record")
    finally:
        await producer.stop()
    print(f"{load_average()} after")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
