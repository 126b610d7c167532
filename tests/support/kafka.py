"""Topics on the test broker, and reading what reached Kafka."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence

import anyio
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord

Record = ConsumerRecord[bytes, bytes]


@contextlib.asynccontextmanager
async def kafka_admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    """An admin client of the broker at ``bootstrap``, closed on the way out."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def create_topics(
    bootstrap: str,
    topics: Sequence[str],
    *,
    partitions: int = 1,
    configs: Mapping[str, str] | None = None,
) -> None:
    """Create ``topics``, each with ``partitions`` and these topic ``configs``
    (``max.message.bytes``, ...), on the one-node test broker."""
    async with kafka_admin(bootstrap) as admin:
        await admin.create_topics(
            [NewTopic(topic, partitions, 1, topic_configs=dict(configs or {})) for topic in topics]
        )


async def read_topic(
    bootstrap: str,
    topic: str | Sequence[str],
    *,
    count: int | None = None,
    timeout: float = 30.0,
    settle: float = 0.0,
) -> list[Record]:
    """Every record of ``topic`` (or of each of several) from the beginning, in (topic,
    partition, offset) order, read by a plain consumer with the default isolation level
    (read_uncommitted), as the docs tell consumers to read.

    With ``count``: until that many arrived or ``timeout`` passed, waiting for the topics
    to exist (the relay creates them on first use); the caller asserts on what came.
    Without: up to each partition's end as of the call; failing after ``timeout``.
    ``settle`` reads on for that many seconds more, for records that must not come.
    """
    topics = (topic,) if isinstance(topic, str) else tuple(topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=500,
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        partitions = await _partitions(consumer, topics, deadline if count else None)
        consumer.assign(partitions)
        if partitions:
            await consumer.seek_to_beginning(*partitions)
        records: list[Record] = []
        if count is None:
            ends = await consumer.end_offsets(partitions) if partitions else {}
            while not await _caught_up(consumer, ends):
                if time.monotonic() > deadline:
                    raise AssertionError(f"could not read {', '.join(topics)} to its end")
                await _read_into(records, consumer, 200)
        else:
            while len(records) < count and time.monotonic() < deadline:
                await _read_into(records, consumer, 200)
        end = time.monotonic() + settle
        while time.monotonic() < end:
            await _read_into(records, consumer, 100)
        return sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
    finally:
        await consumer.stop()


async def _partitions(
    consumer: AIOKafkaConsumer, topics: tuple[str, ...], wait_until: float | None
) -> list[TopicPartition]:
    """The topics' partitions; while a deadline is given, waiting for the topics to appear."""
    while True:
        found: list[TopicPartition] = []
        for topic in topics:
            numbers = consumer.partitions_for_topic(topic)
            if numbers is None:
                await consumer._client.force_metadata_update()  # the topic may be new to us
                numbers = consumer.partitions_for_topic(topic) or set()
            found.extend(TopicPartition(topic, p) for p in sorted(numbers))
        if found or wait_until is None or time.monotonic() >= wait_until:
            return found
        await anyio.sleep(0.2)


async def _read_into(records: list[Record], consumer: AIOKafkaConsumer, timeout_ms: int) -> None:
    for chunk in (await consumer.getmany(timeout_ms=timeout_ms)).values():
        records.extend(chunk)


async def _caught_up(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    for tp, end in ends.items():
        if int(await consumer.position(tp)) < end:
            return False
    return True
