"""Running a relay inside the test's event loop, and reading what reached Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from prometheus_client import CollectorRegistry

from relay import sql
from relay.config import RelayConfig
from relay.engine import Relay
from relay.metrics import RelayMetrics
from relay.store import RelayStore, StoreFactory

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, $3, $4::jsonb)
"""


def fast_config(database_url: str, bootstrap: str, namespace: str, **overrides: Any) -> RelayConfig:
    """Short leases and polls so tests move quickly; the namespace isolates topics."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "kafka_bootstrap": bootstrap,
        "topic_template": f"{namespace}.{{aggregatetype}}",
        "lease_ttl_ms": 3_000,
        "lease_renew_ms": 500,
        "send_timeout_ms": 1_500,
        "poll_interval_ms": 200,
        "retry_base_ms": 100,
        "retry_cap_ms": 1_000,
        "linger_ms": 1,
    }
    values.update(overrides)
    return RelayConfig(**values)


@dataclasses.dataclass
class RunningRelay:
    relay: Relay
    stop: anyio.Event
    task: asyncio.Task[None]
    registry: CollectorRegistry

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    async def holds_every_lane(self, timeout: float = 30.0) -> None:
        """Wait until this relay owns every lane (what a lone instance claims)."""
        await wait_until(
            lambda: self.metric("outbox_relay_lanes_owned") == sql.LANE_COUNT, timeout=timeout
        )


@contextlib.asynccontextmanager
async def running_relay(
    config: RelayConfig, *, store_factory: StoreFactory = RelayStore, tracer_provider: Any = None
) -> AsyncIterator[RunningRelay]:
    """A relay running in this event loop; ``store_factory`` lets a test hand it a store
    that pauses or fails at a named step (a subclass of RelayStore)."""
    registry = CollectorRegistry()
    relay = Relay(
        config,
        RelayMetrics.register(registry),
        store_factory=store_factory,
        tracer_provider=tracer_provider,
    )
    stop = anyio.Event()
    task = asyncio.create_task(relay.run(stop), name=f"relay {config.instance_id}")
    running = RunningRelay(relay, stop, task, registry)
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def consume(
    bootstrap: str,
    topics: list[str],
    *,
    count: int,
    timeout: float = 30.0,
    settle: float = 0.0,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read every record of ``topics`` from the beginning until ``count`` arrived."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=500,
    )
    await consumer.start()
    try:
        partitions: list[TopicPartition] = []
        deadline = time.monotonic() + timeout
        while not partitions and time.monotonic() < deadline:
            for topic in topics:
                found = consumer.partitions_for_topic(topic)
                if found is None:
                    await consumer._client.force_metadata_update()  # topic may be new
                    found = consumer.partitions_for_topic(topic) or set()
                partitions.extend(TopicPartition(topic, p) for p in sorted(found))
            if not partitions:
                await asyncio.sleep(0.2)
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        records: list[ConsumerRecord[bytes, bytes]] = []
        while time.monotonic() < deadline and len(records) < count:
            batch = await consumer.getmany(timeout_ms=200)
            for chunk in batch.values():
                records.extend(chunk)
        if settle:
            end = time.monotonic() + settle
            while time.monotonic() < end:
                batch = await consumer.getmany(timeout_ms=100)
                for chunk in batch.values():
                    records.extend(chunk)
        return records
    finally:
        await consumer.stop()


async def wait_until(
    predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.1
) -> None:
    """Poll an (async or sync) predicate until it is truthy or fail."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)


async def outbox_count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM outbox WHERE quarantined_at IS NULL"))
