"""Drain rate of a 200,000-event backlog: the relay vs. a raw idempotent aiokafka producer.

Target (docs/benchmarks.md): 1 KiB payloads, 1,000 keys, 6 partitions; the relay must reach ≥ 0.9 x the
raw producer's rate, both measured in this run on this broker. The relay runs as deployed:
``outbox-relay run`` in a process of its own at its defaults, with the process settings
``run`` makes (outbox_relay/runtime.py), against the server the benchmarks use
(PostgreSQL 18 where it runs); the peer comparison (bench/test_peers.py) judges the same
target on PostgreSQL 15 beside Debezium. Also: the drain rate with two relay processes
against one, reported (on two cores a second process has no core to add). Prints ratios;
asserts nothing about time, only that what was timed was right: after every drain each event
is on the broker and has its receipt (bench.conftest.assert_delivered), and with two
instances both published.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from bench.conftest import Topics, assert_delivered
from bench.deployment import RelayDeployment, start_relay_process
from bench.peers.measure import PARTITIONS, cpu_seconds, records_on
from relay.config import RelayConfig
from relay.producer import make_producer
from relay.records import OutboxRow, RecordMapper
from tests.support.waiting import wait_until

EVENTS = int(os.environ.get("BENCH_EVENTS", "200000"))
KEYS = 1000
PAYLOAD_FILL = "x" * 1000  # with the JSON wrapper: ~1 KiB per value

pytestmark = pytest.mark.bench

# CPU per event: of this process for the raw producer, of the relay processes for the relay.
CPU_US: dict[str, float] = {}

FILL_BACKLOG = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT $1, 'key-' || (g % $3), 'bench.event', jsonb_build_object('n', g, 'fill', $4::text)
FROM generate_series(1, $2) AS g
"""


def _raw_producer(bootstrap: str) -> AIOKafkaProducer:
    """The baseline: the producer the relay makes at its defaults, without the relay."""
    return make_producer(RelayConfig(database_url="", kafka_bootstrap=bootstrap))


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


def _topic(namespace: str) -> str:
    """Where the relay publishes the backlog (its topic template, aggregatetype 'bench')."""
    return f"{namespace}.bench"


@dataclass(frozen=True)
class Drain:
    """One timed drain: its rate, and how many events each relay instance published."""

    rate: float
    published: list[int]


async def _relay_rate(
    database_url: str, bootstrap: str, namespace: str, instances: int, workdir: Path
) -> Drain:
    """Start the relay processes on an empty outbox, commit the backlog, time the drain,
    then check that every event was delivered (not timed).

    Like the raw producer's figure, this leaves out starting and claiming the lanes. Only
    the batch size may be changed (BENCH_BATCH); everything else is the relay's default.
    Each drain needs a topic of its own (``_topic(namespace)``): its delivery is counted there.
    """
    conn = await asyncpg.connect(database_url)
    # The relay's own default unless BENCH_BATCH says otherwise.
    batch_size = os.environ.get("BENCH_BATCH", str(RelayConfig.batch_size))
    processes: list[RelayDeployment] = []
    try:
        for n in range(instances):
            own = workdir / f"relay-{instances}-{n}"
            own.mkdir(parents=True)
            processes.append(
                await start_relay_process(
                    database_url,
                    bootstrap,
                    namespace,
                    own,
                    sidecar=n == 0,  # one sidecar for the deployment, as deploy/ runs it
                    OUTBOX_RELAY_BATCH_SIZE=batch_size,
                )
            )
        await wait_until(lambda: _all_lanes_held(conn, processes, instances), timeout=120)
        owners = [row["owner_id"] for row in await conn.fetch(_OWNERS)]
        pids = [process.pid for process in processes]
        await _fill(database_url, "bench")
        started = time.perf_counter()
        cpu = cpu_seconds(pids)
        while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM outbox)"):  # noqa: ASYNC110 - polling the database is the point
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        CPU_US[f"relay x{instances}"] = (cpu_seconds(pids) - cpu) / EVENTS * 1e6
        # Correctness, not speed: an empty outbox is not delivery.
        await assert_delivered(conn, bootstrap, _topic(namespace), EVENTS)
        # Read while the processes run: an instance leaving deletes its relay_instance row.
        totals = {
            r["instance_id"]: r["published_total"] for r in await conn.fetch(_PUBLISHED, owners)
        }
        published = [int(totals.get(owner, 0)) for owner in owners]
        assert all(published) and sum(published) == EVENTS, (
            f"{EVENTS} events; the {instances} instance(s) recorded {published} published"
        )
        return Drain(EVENTS / elapsed, published)
    finally:
        for process in processes:
            if process.returncode is None:
                process.terminate()
            await process.wait()
        await conn.close()


# The relay instances holding the lanes (each process is one instance), and what each of
# them counted as published (relay_instance.published_total, written with its receipts).
_OWNERS = "SELECT DISTINCT owner_id FROM relay_lane WHERE owner_id IS NOT NULL ORDER BY 1"
_PUBLISHED = (
    "SELECT instance_id, published_total FROM relay_instance WHERE instance_id = ANY($1::text[])"
)


async def _all_lanes_held(
    conn: asyncpg.Connection, processes: list[RelayDeployment], instances: int
) -> bool:
    for process in processes:
        assert process.returncode is None, f"a relay process exited ({process.returncode})"
    return bool(
        await conn.fetchval(
            "SELECT count(*) FILTER (WHERE lease_expires_at > clock_timestamp()) = 64 "
            "AND count(DISTINCT owner_id) = $1 FROM relay_lane",
            instances,
        )
    )


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
    bench_database: str, kafka_bootstrap: str, bench_topics: Topics, tmp_path: Path
) -> None:
    namespace = f"b{uuid.uuid4().hex[:8]}"
    raw_topic = await bench_topics.create(f"{namespace}.raw.bench")
    await bench_topics.create(_topic(namespace))
    records = _same_records(namespace)
    # The raw producer runs before and after the relay and counts with the mean of both:
    # on a shared machine the load drifts within a run, and bracketing evens that out.
    raws, raw_batches = [], []
    raws.append(await _raw_producer_rate(kafka_bootstrap, records))
    raw_batches.append(await _raw_batch_rate(kafka_bootstrap, records))
    relay = (await _relay_rate(bench_database, kafka_bootstrap, namespace, 1, tmp_path)).rate
    raws.append(await _raw_producer_rate(kafka_bootstrap, records))
    raw_batches.append(await _raw_batch_rate(kafka_bootstrap, records))
    del records
    # The baseline delivered too: four sends of the backlog, each record once.
    on_raw_topic = await records_on(kafka_bootstrap, raw_topic)
    assert on_raw_topic == 4 * EVENTS, f"raw producer: {on_raw_topic} of {4 * EVENTS} records"
    raw, raw_batch = statistics.fmean(raws), statistics.fmean(raw_batches)
    print(
        f"\nDRAIN {EVENTS} events, 1 KiB, {KEYS} keys, {PARTITIONS} partitions\n"
        f"  raw aiokafka idempotent producer, send():       {raw:10.0f} events/s"
        f"  (before / after the relay: {raws[0]:.0f} / {raws[1]:.0f})\n"
        f"  raw aiokafka idempotent producer, send_batch(): {raw_batch:10.0f} events/s"
        f"  (before / after the relay: {raw_batches[0]:.0f} / {raw_batches[1]:.0f})\n"
        f"  relay (outbox-relay run, from PostgreSQL):      {relay:10.0f} events/s\n"
        f"  ratio relay / raw send():                       {relay / raw:10.2f}  (target >= 0.90)\n"
        f"  ratio relay / raw send_batch():                 {relay / raw_batch:10.2f}\n"
        f"  client CPU per event: raw send() {CPU_US['raw send()']:.1f} us, "
        f"relay {CPU_US['relay x1']:.1f} us in its process (the relay also decodes rows and records receipts;\n"
        f"  on this 2-core machine PostgreSQL and the broker compete with it for the cores)"
    )


async def test_reports_the_scale_out_ratio_of_two_instances(
    bench_database: str, kafka_bootstrap: str, bench_topics: Topics, tmp_path: Path
) -> None:
    """Two instances against one, reported, not judged: on two cores a second process has
    no core to add (docs/benchmarks.md#targets). Asserted: both drains delivered
    every event, and with two instances both published (_relay_rate)."""
    first, second = (f"b{uuid.uuid4().hex[:8]}" for _ in range(2))
    for namespace in (first, second):
        await bench_topics.create(_topic(namespace))
    one = await _relay_rate(bench_database, kafka_bootstrap, first, 1, tmp_path)
    two = await _relay_rate(bench_database, kafka_bootstrap, second, 2, tmp_path)
    print(
        f"\nSCALE-OUT {EVENTS} events, one relay process per instance\n"
        f"  1 instance:  {one.rate:10.0f} events/s  ({CPU_US['relay x1']:.1f} us of relay CPU"
        " per event)\n"
        f"  2 instances: {two.rate:10.0f} events/s  (ratio {two.rate / one.rate:.2f};"
        f" {CPU_US['relay x2']:.1f} us of relay CPU per event; on {os.cpu_count()} cores"
        f" shared with PostgreSQL and the broker)\n"
        f"  published by each of the two: {' / '.join(str(n) for n in two.published)}"
        f" (every event delivered and receipted in both drains)"
    )
