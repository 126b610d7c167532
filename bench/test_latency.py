"""Commit → broker acknowledgement at a steady 1,000 events/s with NOTIFY (target in docs/benchmarks.md: p99 ≤ 25 ms).

The relay runs as ``outbox-relay run`` in its own process. Writers commit single-event
transactions at a paced rate and note the time COMMIT returned; the topic stamps
records with the broker's LogAppendTime, which is when the broker appended (and, with
acks=all on one broker, acknowledged) them. Same machine, same clock.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.conftest import start_relay_process
from tests.relay.harness import consume

pytestmark = pytest.mark.bench

RATE = int(os.environ.get("BENCH_RATE", "1000"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "20"))
WRITERS = 4


async def _writer(
    url: str, index: int, per_second: float, deadline: float, sent: dict[str, float]
) -> None:
    conn = await asyncpg.connect(url)
    interval = 1 / per_second
    next_at = time.perf_counter()
    n = 0
    try:
        while time.perf_counter() < deadline:
            event_id = str(uuid.uuid4())
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                    "VALUES ($1, 'latency', $2, 'bench.latency', '{\"x\": 1}')",
                    event_id,
                    f"w{index}-{n % 50}",
                )
            # The commit point: the row is visible from here on (the COMMIT round trip
            # itself, typically well under a millisecond here, is not counted).
            sent[event_id] = time.time()
            n += 1
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    finally:
        await conn.close()


async def test_commit_to_ack_latency_at_steady_rate(
    bench_database: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = f"l{uuid.uuid4().hex[:8]}"
    topic = f"{namespace}.latency"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, 6, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})]
        )
    finally:
        await admin.close()
    relay = await start_relay_process(
        bench_database, kafka_bootstrap, namespace, tmp_path, OUTBOX_RELAY_LINGER_MS="0"
    )
    try:
        await asyncio.sleep(3)  # lanes claimed, producer connected
        sent: dict[str, float] = {}
        deadline = time.perf_counter() + SECONDS
        await asyncio.gather(
            *(_writer(bench_database, i, RATE / WRITERS, deadline, sent) for i in range(WRITERS))
        )
        records = await consume(kafka_bootstrap, [topic], count=len(sent), timeout=60)
    finally:
        relay.terminate()
        await relay.wait()
    latencies = []
    for record in records:
        event_id = dict(record.headers)["id"].decode()
        if event_id in sent:
            latencies.append(record.timestamp - sent[event_id] * 1000)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    achieved = len(sent) / SECONDS
    print(
        f"\nLATENCY commit -> broker append, {achieved:.0f} events/s for {SECONDS} s with NOTIFY\n"
        f"  events: {len(sent)} written, {len(latencies)} read back\n"
        f"  p50 {p50:6.1f} ms   p99 {p99:6.1f} ms (target <= 25)   max {latencies[-1]:6.1f} ms"
    )
    assert len(latencies) == len(sent)  # completeness, not speed
