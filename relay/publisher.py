"""Handing records to Kafka in per-partition batches, in order, with per-record results.

The relay builds record batches itself (aiokafka's BatchBuilder) instead of calling
``send()`` once per record: it already holds a whole fetch in memory, and one future per
partition batch instead of one per record is most of the producer's CPU cost. Partitions
are chosen exactly as Kafka's default partitioner does (murmur2 of the key), so a key
lands where any other Kafka producer would put it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from relay.records import KafkaRecord, RecordRejected

_PARTITION_CACHE_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class PendingAck:
    """A record inside a submitted batch: its offset is the batch's base + ``index``."""

    future: asyncio.Future[Any]
    index: int

    def offset(self) -> int:
        return int(self.future.result().offset) + self.index


class BatchPublisher:
    """Submits records grouped by topic-partition, preserving order within a partition."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[tuple[str, int, bytes], int] = {}

    async def _partition(self, topic: str, key: bytes) -> int:
        known = sorted(await self._producer.partitions_for(topic))
        cache_key = (topic, len(known), key)
        partition = self._partitions.get(cache_key)
        if partition is None:
            if len(self._partitions) > _PARTITION_CACHE_LIMIT:
                self._partitions.clear()
            partition = self._partitioner(key, known, known)
            self._partitions[cache_key] = partition
        return partition

    async def submit(
        self, records: list[KafkaRecord | BaseException | None]
    ) -> list[PendingAck | BaseException | None]:
        """Queue every record; entries that are already failures (or None) pass through."""
        outcomes: list[PendingAck | BaseException | None] = [None] * len(records)
        open_batches: dict[tuple[str, int], tuple[Any, list[int]]] = {}
        submitted: list[tuple[str, int, Any, list[int]]] = []
        for index, record in enumerate(records):
            if not isinstance(record, KafkaRecord):
                outcomes[index] = record
                continue
            try:
                partition = await self._partition(record.topic, record.key)
            except Exception as exc:  # metadata failures are classified by the caller
                outcomes[index] = exc
                continue
            slot = (record.topic, partition)
            current = open_batches.get(slot)
            if current is None:
                current = (self._producer.create_batch(), [])
                open_batches[slot] = current
            builder, members = current
            if not self._append(builder, record):
                # Full: hand this one over and start the next batch for the partition.
                submitted.append((record.topic, partition, builder, members))
                builder, members = self._producer.create_batch(), []
                open_batches[slot] = (builder, members)
                if not self._append(builder, record):
                    outcomes[index] = RecordRejected(
                        "record_too_large", "the record does not fit an empty batch"
                    )
                    continue
            members.append(index)
        submitted.extend((t, p, b, m) for (t, p), (b, m) in open_batches.items() if m)
        for topic, partition, builder, members in submitted:
            try:
                future = await self._producer.send_batch(builder, topic, partition=partition)
            except Exception as exc:  # classified by the caller, per record
                for index in members:
                    outcomes[index] = exc
                continue
            for position, index in enumerate(members):
                outcomes[index] = PendingAck(future, position)
        return outcomes

    @staticmethod
    def _append(builder: Any, record: KafkaRecord) -> bool:
        return (
            builder.append(
                timestamp=None, key=record.key, value=record.value, headers=record.headers
            )
            is not None
        )
