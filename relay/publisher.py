"""Handing records to Kafka in per-partition batches, in order, with per-record results.

The relay builds record batches itself (aiokafka's BatchBuilder) instead of calling
``send()`` once per record: it already holds a whole fetch in memory, and one future per
partition batch instead of one per record is most of the producer's CPU cost. Partitions
are chosen exactly as Kafka's default partitioner does (murmur2 of the key), so a key
lands where any other Kafka producer would put it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from relay.outcome import Acknowledgement, Landed
from relay.records import KafkaRecord, RecordRejected

_PARTITION_CACHE_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class SubmittedBatch:
    """One partition batch handed to the producer: the records at ``members`` (indices
    into the submitted list) have offsets base + 0, 1, 2, … in that order."""

    future: asyncio.Future[Any]
    members: list[int]


@dataclass(slots=True)
class Submission:
    """What became of a list of records: batches in flight and records that failed early."""

    batches: list[SubmittedBatch] = field(default_factory=list)
    failures: dict[int, BaseException] = field(default_factory=dict)

    async def acknowledgements(self, within_s: float) -> list[Acknowledgement]:
        """Each batch's answer, in submission order; one not answered within ``within_s``
        counts as timed out."""
        if self.batches:
            with anyio.move_on_after(within_s):
                # aiokafka answers with asyncio futures, which only asyncio can wait for.
                await asyncio.wait([sent.future for sent in self.batches])
        return [Acknowledgement(sent.members, _answer(sent.future)) for sent in self.batches]


def _answer(future: asyncio.Future[Any]) -> Landed | BaseException:
    if not future.done() or future.cancelled():
        return TimeoutError()
    exc = future.exception()
    if exc is not None:
        return exc
    meta = future.result()
    return Landed(meta.topic, meta.partition, meta.offset)


class BatchPublisher:
    """Submits records grouped by topic-partition, preserving order within a partition."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[tuple[str, int, bytes], int] = {}

    def _partition(self, topic: str, known: list[int], key: bytes) -> int:
        cache_key = (topic, len(known), key)
        partition = self._partitions.get(cache_key)
        if partition is None:
            if len(self._partitions) > _PARTITION_CACHE_LIMIT:
                self._partitions.clear()
            partition = self._partitioner(key, known, known)
            self._partitions[cache_key] = partition
        return partition

    async def submit(self, records: list[KafkaRecord | None]) -> Submission:
        """Queue every record; None entries (held back by the caller) are skipped."""
        submission = Submission()
        topics: dict[str, list[int]] = {}
        open_batches: dict[tuple[str, int], tuple[Any, list[int]]] = {}
        full: list[tuple[str, int, Any, list[int]]] = []
        for index, record in enumerate(records):
            if record is None:
                continue
            known = topics.get(record.topic)
            if known is None:
                try:
                    known = sorted(await self._producer.partitions_for(record.topic))
                except Exception as exc:  # metadata failures are classified by the caller
                    submission.failures[index] = exc
                    continue
                topics[record.topic] = known
            partition = self._partition(record.topic, known, record.key)
            slot = (record.topic, partition)
            current = open_batches.get(slot)
            if current is None:
                current = open_batches[slot] = (self._producer.create_batch(), [])
            builder, members = current
            if not self._append(builder, record):
                # Full: hand this one over and start the next batch for the partition.
                full.append((record.topic, partition, builder, members))
                builder, members = self._producer.create_batch(), []
                open_batches[slot] = (builder, members)
                if not self._append(builder, record):
                    submission.failures[index] = RecordRejected(
                        "record_too_large", "the record does not fit an empty batch"
                    )
                    continue
            members.append(index)
        # Full batches of a partition come before its open one: order holds per partition.
        full.extend((t, p, b, m) for (t, p), (b, m) in open_batches.items() if m)
        for topic, partition, builder, members in full:
            try:
                future = await self._producer.send_batch(builder, topic, partition=partition)
            except Exception as exc:  # classified by the caller, per record
                for index in members:
                    submission.failures[index] = exc
                continue
            submission.batches.append(SubmittedBatch(future, members))
        return submission

    @staticmethod
    def _append(builder: Any, record: KafkaRecord) -> bool:
        appended = builder.append(
            timestamp=None, key=record.key, value=record.value, headers=record.headers
        )
        return appended is not None
