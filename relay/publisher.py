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
failed ones instead of overtaking them. aiokafka already sends one request per partition
at a time, so this costs the hop between an acknowledgement and the next hand-over.
That rule covers the batches submitted before the caller held back the failed keys
(:meth:`Submission.failures_held`); a batch submitted later holds none of those keys
(``submit`` leaves out held keys), so it goes: one failure does not fail its partition
for good.
Inside one submission, a record that fails (metadata, size) holds back the later records
of its key: they are not sent and the caller finds them again on its next pass.

Topics come from :class:`relay.topics.TopicCatalog`, which never makes a submission wait
on a missing topic, and so do batch sizes: a partition batch is at most what its topic
accepts. A batch of several records the broker still refuses as too large fails as
``batch_too_large`` (retriable) and lowers the topic's batch size; only a record that alone
exceeds its topic's ``max.message.bytes`` is ``record_too_large``, and that verdict is the
broker's (a record larger than the cached limit is sent alone): a cached limit may be
stale, and the broker's answer also makes the catalog read the limit again. Batches are built with
aiokafka's ``BatchBuilder`` and the producer's compression (``_message_accumulator``
internals, pinned as for relay/producer_reset.py).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder

from relay.outcome import Acknowledgement, Landed
from relay.records import KafkaRecord, RecordRejected
from relay.retry import BatchTooLarge, PredecessorFailed
from relay.topics import TopicCatalog

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
    on_held: Callable[[], None] = lambda: None

    def failures_held(self) -> None:
        """The caller now holds back the keys of this submission's failed batches: later
        submissions carry none of them, so their batches need not fail behind these."""
        self.on_held()

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

    def __init__(self, producer: AIOKafkaProducer, topics: TopicCatalog) -> None:
        self._producer = producer
        self._topics = topics
        internals: Any = producer
        self._compression = internals._message_accumulator._compression_type
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[tuple[str, int, bytes], int] = {}
        # The last batch handed over per partition; the next one waits for it.
        self._tails: dict[tuple[str, int], asyncio.Future[Any]] = {}
        # Submissions are numbered; a failed batch maps to the latest number handed out
        # when the caller held back its keys (absent: not held yet).
        self._submitted = 0
        self._held_at: weakref.WeakKeyDictionary[asyncio.Future[Any], int] = (
            weakref.WeakKeyDictionary()
        )

    def _partition(self, topic: str, known: list[int], key: bytes) -> int:
        cache_key = (topic, len(known), key)
        partition = self._partitions.get(cache_key)
        if partition is None:
            if len(self._partitions) > _PARTITION_CACHE_LIMIT:
                self._partitions.clear()
            partition = self._partitioner(key, known, known)
            self._partitions[cache_key] = partition
        return partition

    async def submit(
        self, records: list[KafkaRecord | None], held: Container[str] = frozenset()
    ) -> Submission:
        """Queue every record; None entries and records of ``held`` keys (held back by the
        caller) are skipped, and so are the later records of their keys."""
        submission = Submission()
        topics = await self._topics.resolve({r.topic for r in records if r is not None})
        # From here on nothing awaits: the held keys read below are those in force when
        # the batches are handed over.
        self._submitted += 1
        number = self._submitted
        submission.on_held = partial(self._mark_held, submission)
        open_batches: dict[tuple[str, int], tuple[Any, list[int]]] = {}
        full: list[tuple[str, int, Any, list[int]]] = []
        failed_keys: set[bytes] = set()
        for index, record in enumerate(records):
            if record is None or record.key in failed_keys:
                continue  # held back: an earlier record of its key failed here
            if held and record.key.decode() in held:
                failed_keys.add(record.key)  # found again once its key is no longer held
                continue
            known = topics[record.topic]
            if isinstance(known, BaseException):  # classified by the caller
                submission.failures[index] = known
                failed_keys.add(record.key)
                continue
            partition = self._partition(record.topic, known, record.key)
            slot = (record.topic, partition)
            current = open_batches.get(slot)
            if current is None:
                current = open_batches[slot] = (self._new_batch(record.topic), [])
            builder, members = current
            if not self._append(builder, record):
                # Full: hand this one over and start the next batch for the partition.
                full.append((record.topic, partition, builder, members))
                builder, members = self._new_batch(record.topic), []
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
                self._hand_over(self._tails.get(slot), number, builder, topic, partition)
            )
            self._tails[slot] = task
            submission.batches.append(SubmittedBatch(task, members))
        return submission

    def _mark_held(self, submission: Submission) -> None:
        for sent in submission.batches:
            self._held_at[sent.future] = self._submitted

    async def _hand_over(
        self,
        previous: asyncio.Future[Any] | None,
        number: int,
        builder: Any,
        topic: str,
        partition: int,
    ) -> Any:
        """Send the batch once the partition's previous batch is acknowledged; its metadata."""
        if previous is not None:
            await asyncio.wait([previous])  # never cancels or re-raises the previous batch
            if previous.cancelled() or previous.exception() is not None:
                held_at = self._held_at.get(previous)
                # Failed, and its keys were not yet held back when this batch was built:
                # this batch may carry a later record of one of them.
                if held_at is None or held_at >= number:
                    raise PredecessorFailed(f"an earlier batch of {topic}[{partition}] failed")
        size, count = builder.size(), builder.record_count()
        try:
            delivery = await self._producer.send_batch(builder, topic, partition=partition)
            return await delivery
        except (kafka_errors.MessageSizeTooLargeError, kafka_errors.RecordListTooLargeError) as exc:
            # Read the topic's limit again either way: it may have changed (a record that
            # was too large gets through once an operator raised it and redrove it).
            self._topics.refused_as_too_large(topic, size)
            if count < 2:
                raise  # this one record is too large for its topic
            raise BatchTooLarge(f"a batch of {count} records was too large for {topic}") from exc

    def _new_batch(self, topic: str) -> Any:
        """An empty batch no larger than ``topic`` accepts."""
        return BatchBuilder(self._topics.batch_bytes(topic), self._compression)

    def cancel_pending(self) -> None:
        """Cancel every hand-over still waiting (the producer is being reset or stopped)."""
        for task in self._tails.values():
            task.cancel()
        self._tails.clear()

    @staticmethod
    def _append(builder: Any, record: KafkaRecord) -> bool:
        appended = builder.append(
            timestamp=None, key=record.key, value=record.value, headers=record.headers
        )
        return appended is not None
