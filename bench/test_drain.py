"""Drain rate of a 200,000-event backlog: the relay vs. a raw idempotent aiokafka producer.

Target (docs/benchmarks.md): 1 KiB payloads, 1,000 keys, 6 partitions; the relay must reach ≥ 0.9 x the
raw producer's rate, both measured in this run on this broker. Also: the drain rate with
two relay instances against one. Prints ratios; asserts nothing about time.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from bench.conftest import Topics
from bench.peers.measure import PARTITIONS
from relay.config import RelayConfig
from relay.records import OutboxRow, RecordMapper
from tests.relay.harness import running_relay, wait_until

EVENTS = int(os.environ.get("BENCH_EVENTS", "200000"))
KEYS = 1000
PAYLOAD_FILL = "x" * 1000  # with the JSON wrapper: ~1 KiB per value

pytestmark = pytest.mark.bench

# Process CPU per event (this process runs the producer or the relays, nothing else).
CPU_US: dict[str, float] = {}

FILL_BACKLOG = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT $1, 'key-' || (g % $3), 'bench.event', jsonb_build_object('n', g, 'fill', $4::text)
FROM generate_series(1, $2) AS g
"""


def _raw_producer(bootstrap: str) -> AIOKafkaProducer:
    """The baseline: the relay's producer settings (relay.producer.make_producer), no relay."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=256 * 1024,
    )


async def _raw_producer_rate(bootstrap: str, records: list) -> float:
    producer = _raw_producer(bootstrap)
    await producer.start()
    try:
        started = time.perf_counter()
        cpu = time.process_time()
        futures = []
        for record in records:
            futures.append(
                await producer.send(
                    record.topic, record.value, key=record.key, headers=record.headers
                )
            )
            if len(futures) >= 4000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
        CPU_US["raw send()"] = (time.process_time() - cpu) / len(records) * 1e6
        return len(records) / (time.perf_counter() - started)
    finally:
        await producer.stop()


async def _raw_batch_rate(bootstrap: str, records: list) -> float:
    """The same producer fed through its batch API, partitioned like Kafka's default."""
    producer = _raw_producer(bootstrap)
    await producer.start()
    partitioner = DefaultPartitioner()
    try:
        started = time.perf_counter()
        topic = records[0].topic
        partitions = sorted(await producer.partitions_for(topic))
        futures = []
        builders: dict[int, object] = {}
        for record in records:
            partition = partitioner(record.key, partitions, partitions)
            builder = builders.get(partition) or producer.create_batch()
            builders[partition] = builder
            if (
                builder.append(
                    timestamp=None, key=record.key, value=record.value, headers=record.headers
                )
                is None
            ):
                futures.append(await producer.send_batch(builder, topic, partition=partition))
                builder = producer.create_batch()
                builders[partition] = builder
                builder.append(
                    timestamp=None, key=record.key, value=record.value, headers=record.headers
                )
        for partition, builder in builders.items():
            futures.append(await producer.send_batch(builder, topic, partition=partition))
        await asyncio.gather(*futures)
        return len(records) / (time.perf_counter() - started)
    finally:
        await producer.stop()


async def _fill(database_url: str, aggregatetype: str) -> None:
    """The whole backlog in one transaction: it becomes visible at once, at commit."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(FILL_BACKLOG, aggregatetype, EVENTS, KEYS, PAYLOAD_FILL)
    finally:
        await conn.close()


async def _relay_rate(database_url: str, bootstrap: str, namespace: str, instances: int) -> float:
    """Start the relays on an empty outbox, commit the backlog, time the drain.

    Like the raw producer's figure, this leaves out connecting and warming up.
    """
    conn = await asyncpg.connect(database_url)
    batch = int(os.environ.get("BENCH_BATCH", "1000"))
    # The relay at its defaults (linger, poll interval, in-flight window); only the batch
    # size may be changed (BENCH_BATCH).
    configs = [
        RelayConfig(
            database_url=database_url,
            kafka_bootstrap=bootstrap,
            topic_template=f"{namespace}.{{aggregatetype}}",
            instance_id=f"bench-{i}",
            batch_size=batch,
        )
        for i in range(instances)
    ]
    try:
        async with contextlib_multi(configs) as relays:
            await wait_until(lambda: _all_lanes_held(conn, relays, instances), timeout=120)
            await _fill(database_url, "bench")
            started = time.perf_counter()
            cpu = time.process_time()
            while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM outbox)"):  # noqa: ASYNC110 - polling the database is the point
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - started
            CPU_US[f"relay x{instances}"] = (time.process_time() - cpu) / EVENTS * 1e6
        return EVENTS / elapsed
    finally:
        await conn.close()


async def _all_lanes_held(conn: asyncpg.Connection, relays: list, instances: int) -> bool:
    if not all(r.relay.ready() for r in relays):
        return False
    return bool(
        await conn.fetchval(
            "SELECT count(*) FILTER (WHERE lease_expires_at > clock_timestamp()) = 64 "
            "AND count(DISTINCT owner_id) = $1 FROM relay_lane",
            instances,
        )
    )


class contextlib_multi:
    def __init__(self, configs: list) -> None:
        self._managers = [running_relay(c) for c in configs]

    async def __aenter__(self) -> list:
        return [await manager.__aenter__() for manager in self._managers]

    async def __aexit__(self, *exc: object) -> None:
        for manager in reversed(self._managers):
            await manager.__aexit__(None, None, None)


def _same_records(namespace: str) -> list:
    """The records the relay would send for the backlog, built once in memory."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    rows = [
        OutboxRow(
            seq=n,
            id=str(uuid.uuid4()),
            aggregatetype="bench",
            aggregateid=f"key-{n % KEYS}",
            type="bench.event",
            payload=f'{{"n": {n}, "fill": "{PAYLOAD_FILL}"}}',
            tenant_ref=None,
            schema_version=None,
            correlation_ref=None,
            causation_ref=None,
            traceparent=None,
            headers=None,
            topic=None,
            created_at=now,
            lane=0,
            attempts=0,
        )
        for n in range(1, EVENTS + 1)
    ]
    mapper = RecordMapper(
        topic_template=f"{namespace}.raw.{{aggregatetype}}", ce_source="urn:bench"
    )
    return [mapper.to_record(row) for row in rows]


async def test_drain_rate_against_raw_producer(
    bench_database: str, kafka_bootstrap: str, bench_topics: Topics
) -> None:
    namespace = f"b{uuid.uuid4().hex[:8]}"
    await bench_topics.create(f"{namespace}.raw.bench")
    await bench_topics.create(f"{namespace}.bench")
    records = _same_records(namespace)
    # The raw producer runs before and after the relay and counts with the mean of both:
    # on a shared machine the load drifts within a run, and bracketing evens that out.
    raws, raw_batches = [], []
    raws.append(await _raw_producer_rate(kafka_bootstrap, records))
    raw_batches.append(await _raw_batch_rate(kafka_bootstrap, records))
    relay = await _relay_rate(bench_database, kafka_bootstrap, namespace, instances=1)
    raws.append(await _raw_producer_rate(kafka_bootstrap, records))
    raw_batches.append(await _raw_batch_rate(kafka_bootstrap, records))
    del records
    raw, raw_batch = statistics.fmean(raws), statistics.fmean(raw_batches)
    print(
        f"\nDRAIN {EVENTS} events, 1 KiB, {KEYS} keys, {PARTITIONS} partitions\n"
        f"  raw aiokafka idempotent producer, send():       {raw:10.0f} events/s"
        f"  (before / after the relay: {raws[0]:.0f} / {raws[1]:.0f})\n"
        f"  raw aiokafka idempotent producer, send_batch(): {raw_batch:10.0f} events/s"
        f"  (before / after the relay: {raw_batches[0]:.0f} / {raw_batches[1]:.0f})\n"
        f"  relay (1 instance, from PostgreSQL):            {relay:10.0f} events/s\n"
        f"  ratio relay / raw send():                       {relay / raw:10.2f}  (target >= 0.90)\n"
        f"  ratio relay / raw send_batch():                 {relay / raw_batch:10.2f}\n"
        f"  client CPU per event: raw send() {CPU_US['raw send()']:.1f} us, "
        f"relay {CPU_US['relay x1']:.1f} us (the relay also decodes rows and records receipts;\n"
        f"  on this 2-core machine PostgreSQL and the broker compete with it for the cores)"
    )


async def test_drain_rate_grows_with_instances(
    bench_database: str, kafka_bootstrap: str, bench_topics: Topics
) -> None:
    namespace = f"b{uuid.uuid4().hex[:8]}"
    await bench_topics.create(f"{namespace}.bench")
    one = await _relay_rate(bench_database, kafka_bootstrap, namespace, instances=1)
    two = await _relay_rate(bench_database, kafka_bootstrap, namespace, instances=2)
    print(
        f"\nSCALE-OUT {EVENTS} events\n"
        f"  1 instance:  {one:10.0f} events/s\n"
        f"  2 instances: {two:10.0f} events/s  (ratio {two / one:.2f})"
    )
