"""Handing records to Kafka in per-partition batches, in order, with per-record results.

The relay builds record batches itself (aiokafka's BatchBuilder) instead of calling
``send()`` once per record: it already holds a whole fetch in memory, and one future per
partition batch instead of one per record is most of the producer's CPU cost. Partitions
are chosen exactly as Kafka's default partitioner does (murmur2 of the key), so a key
lands where any other Kafka producer would put it.

Order within a partition is kept against broker-side rejections too: a partition batch is
handed to the producer only once the partition's previous batch was acknowledged. If that
one failed (the broker rejected a record, or the producer was reset), the later batch is
never sent and fails with :class:`PredecessorFailed`, so its rows are retried after the
failed ones instead of overtaking them. That lasts until the caller says it has held back
the failed keys (:meth:`BatchPublisher.accounted`); batches handed over after that go out. aiokafka already sends one request per partition
at a time, so this costs the hop between an acknowledgement and the next hand-over.
Inside one submission, a record that fails (metadata, size) holds back the later records
of its key: they are not sent and the caller finds them again on its next pass.
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
from relay.retry import PredecessorFailed

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

    def unanswered(self) -> bool:
        """True while the producer holds a batch of this submission without an answer."""
        return any(not sent.future.done() for sent in self.batches)

    async def acknowledgements(self, within_s: float) -> list[Acknowledgement]:
        """Each batch's answer, in submission order; one not answered within ``within_s``
        counts as timed out."""
        if self.batches:
            with anyio.move_on_after(within_s):
                # aiokafka answers with asyncio futures, which only asyncio can wait for.
                await asyncio.wait([sent.future for sent in self.batches])
        return [Acknowledgement(sent.members, _answer(sent.future)) for sent in self.batches]


def _succeeded(future: asyncio.Future[Any]) -> bool:
    return not future.cancelled() and future.exception() is None


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
        # The last batch handed over per partition; the next one waits for it.
        self._tails: dict[tuple[str, int], asyncio.Future[Any]] = {}
        # Failed tails whose rows the caller has already held back (see accounted()).
        self._accounted: set[asyncio.Future[Any]] = set()

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
        failed_keys: set[bytes] = set()
        for index, record in enumerate(records):
            if record is None or record.key in failed_keys:
                continue  # held back: an earlier record of its key failed here
            known = topics.get(record.topic)
            if known is None:
                try:
                    known = sorted(await self._producer.partitions_for(record.topic))
                except Exception as exc:  # metadata failures are classified by the caller
                    submission.failures[index] = exc
                    failed_keys.add(record.key)
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
                    failed_keys.add(record.key)
                    continue
            members.append(index)
        # Full batches of a partition come before its open one: order holds per partition.
        full.extend((t, p, b, m) for (t, p), (b, m) in open_batches.items() if m)
        for topic, partition, builder, members in full:
            slot = (topic, partition)
            # asyncio, not anyio: the result is aiokafka's delivery future, awaited by the
            # caller like the producer's own; cancel_pending() owns these tasks' lifetime.
            task = asyncio.ensure_future(
                self._hand_over(self._waits_for(slot), builder, topic, partition)
            )
            self._tails[slot] = task
            self._accounted.discard(task)
            submission.batches.append(SubmittedBatch(task, members))
        return submission

    def _waits_for(self, slot: tuple[str, int]) -> asyncio.Future[Any] | None:
        """The batch a new batch of ``slot`` must wait for, if any.

        An unanswered tail: always. A failed tail: until the caller has accounted for it
        (held its keys back), because a batch fetched before that may carry later records
        of a failed key. A succeeded or accounted tail: nothing to wait for.
        """
        tail = self._tails.get(slot)
        if tail is None or (tail.done() and (_succeeded(tail) or tail in self._accounted)):
            return None
        return tail

    def accounted(self, submission: Submission) -> None:
        """The caller has held back the keys of this submission's failed batches: later
        batches of those partitions need not fail behind them any more."""
        for sent in submission.batches:
            if sent.future in self._tails.values():
                self._accounted.add(sent.future)
        self._accounted.intersection_update(self._tails.values())

    async def _hand_over(
        self, previous: asyncio.Future[Any] | None, builder: Any, topic: str, partition: int
    ) -> Any:
        """Send the batch once the partition's previous batch is acknowledged; its metadata."""
        if previous is not None:
            await asyncio.wait([previous])  # never cancels or re-raises the previous batch
            if previous.cancelled() or previous.exception() is not None:
                raise PredecessorFailed(f"an earlier batch of {topic}[{partition}] failed")
        delivery = await self._producer.send_batch(builder, topic, partition=partition)
        return await delivery

    def cancel_pending(self) -> None:
        """Cancel every hand-over still waiting (the producer is being reset or stopped)."""
        for task in self._tails.values():
            task.cancel()
        self._tails.clear()
        self._accounted.clear()

    @staticmethod
    def _append(builder: Any, record: KafkaRecord) -> bool:
        appended = builder.append(
            timestamp=None, key=record.key, value=record.value, headers=record.headers
        )
        return appended is not None
