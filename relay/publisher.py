"""Handing rows to Kafka in per-partition record batches, in order, with per-batch answers.

This module owns the batches: it maps rows to records, groups them by topic-partition,
chooses partitions as Kafka's default partitioner does (murmur2 of the key) and hands each
partition's batches over one after the other. Its invariant: **a partition batch is handed
over only once the partition's previous batch was acknowledged**, and if that one failed,
the later one fails too (:class:`PredecessorFailed`) unless the caller had held the failed
keys back before the later one was built — so no row overtakes an earlier failed row of its
key. Inside one submission, a row that fails (mapping, topic, size) holds back the later
rows of its key. The caller's holds are handed over by construction: the rows that fail
before they are sent are held (:class:`KeyHolds`) before :meth:`BatchPublisher.submit`
returns, and the rows of failed batches when their answers are read
(:meth:`Submission.acknowledgements`), with nothing awaited in between. Why batches are
built here rather than with ``send()``, and how topic limits and refusals are handled:
docs/relay.md, "Publishing" and "Topics".
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder

from relay.errors import BatchTooLarge, PredecessorFailed, RecordRejected
from relay.outcome import Acknowledgement, Landed
from relay.records import Hold, KafkaRecord, OutboxRow
from relay.topics import TopicCatalog

_PARTITION_CACHE_LIMIT = 200_000


class KeyHolds(Protocol):
    """Where the keys of failed rows are held back on their topics until their failures are
    recorded (relay/inflight.py's window)."""

    def hold_of(self, row: OutboxRow) -> Hold | None:
        """What the row holds when it fails, or None."""
        ...

    def held(self) -> Set[Hold]:
        """What is held now."""
        ...

    def hold(self, failed: Iterable[OutboxRow]) -> None:
        """Hold back what these failed rows hold until their failures are recorded."""
        ...


@dataclass(frozen=True, slots=True)
class SubmittedBatch:
    """One partition batch handed to the producer: its ``rows`` have offsets base + 0, 1,
    2, … in that order."""

    future: asyncio.Future[Any]
    rows: list[OutboxRow]


class HoldLedger:
    """When the caller held back the keys of failed batches, counted in submissions.

    A batch whose partition's previous batch failed may carry a later row of one of that
    batch's keys, unless the caller held those keys back before the later batch was built
    (``submit`` leaves held keys out): then it goes.
    """

    def __init__(self) -> None:
        self._submitted = 0
        self._held_at: weakref.WeakKeyDictionary[asyncio.Future[Any], int] = (
            weakref.WeakKeyDictionary()
        )

    def next_number(self) -> int:
        """Number a new submission."""
        self._submitted += 1
        return self._submitted

    def held(self, batches: Iterable[SubmittedBatch]) -> None:
        """The caller holds back the keys of these batches' failed rows from now on."""
        for sent in batches:
            self._held_at[sent.future] = self._submitted

    def held_before(self, future: asyncio.Future[Any], number: int) -> bool:
        """True when the keys of the batch behind ``future`` were held back before the
        submission numbered ``number`` was built."""
        held_at = self._held_at.get(future)
        return held_at is not None and held_at < number


@dataclass(slots=True)
class Submission:
    """What became of a list of rows: batches in flight, and rows that failed before they
    were sent (each row with its error)."""

    ledger: HoldLedger
    holds: KeyHolds
    batches: list[SubmittedBatch] = field(default_factory=list)
    failures: list[tuple[OutboxRow, BaseException]] = field(default_factory=list)

    def unanswered(self) -> bool:
        """True while the producer holds a batch of this submission without an answer."""
        return any(not sent.future.done() for sent in self.batches)

    async def answered(self) -> None:
        """Return once the broker answered every batch of this submission."""
        if self.unanswered():
            # aiokafka answers with asyncio futures, which only asyncio can wait for.
            await asyncio.wait([sent.future for sent in self.batches])

    async def acknowledgements(self, within_s: float) -> list[Acknowledgement]:
        """Each batch's answer, in submission order; one not answered within ``within_s``
        counts as timed out.

        The keys of every row of a batch that failed are held here, before anything is
        submitted again: later submissions then need not fail behind these batches.
        """
        if self.batches:
            with anyio.move_on_after(within_s):
                await asyncio.wait([sent.future for sent in self.batches])
        answers = [Acknowledgement(sent.rows, _answer(sent.future)) for sent in self.batches]
        for sent in self.batches:
            if not sent.future.done():
                # Counted as timed out: its answer, when it comes (a reset fails it), is
                # no longer wanted; read, it is not logged as an error nobody retrieved.
                sent.future.add_done_callback(_read_late_answer)
        self.holds.hold(
            row for rows, answer in answers if not isinstance(answer, Landed) for row in rows
        )
        self.ledger.held(self.batches)
        return answers


def _read_late_answer(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _answer(future: asyncio.Future[Any]) -> Landed | BaseException:
    if not future.done() or future.cancelled():
        return TimeoutError()
    exc = future.exception()
    if exc is not None:
        return exc
    meta = future.result()
    return Landed(meta.topic, meta.partition, meta.offset)


class BatchPublisher:
    """Submits rows as records grouped by topic-partition, in order within a partition."""

    def __init__(self, producer: AIOKafkaProducer, topics: TopicCatalog) -> None:
        self._producer = producer
        self._topics = topics
        internals: Any = producer
        self._compression = internals._message_accumulator._compression_type
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[tuple[str, int, bytes], int] = {}
        # The last batch handed over per partition; the next one waits for it.
        self._tails: dict[tuple[str, int], asyncio.Future[Any]] = {}
        self._ledger = HoldLedger()

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
        self,
        rows: Sequence[OutboxRow],
        to_record: Callable[[OutboxRow], KafkaRecord],
        holds: KeyHolds,
    ) -> Submission:
        """Map every row and queue its record. A row that cannot be mapped fails here;
        rows of keys ``holds`` holds on their topics are skipped, and so are the later rows
        of a key on a topic that failed or was skipped. The rows that fail here are held
        in ``holds`` before this returns."""
        hold_of, held = holds.hold_of, holds.held()
        mapped: list[tuple[OutboxRow, KafkaRecord]] = []
        rejected: list[tuple[OutboxRow, BaseException]] = []
        rejected_holds: set[Hold] = set()
        for row in rows:
            if rejected_holds and hold_of(row) in rejected_holds:
                continue  # held back behind its key's row that cannot be mapped
            try:
                mapped.append((row, to_record(row)))
            except Exception as exc:
                # RecordRejected, or an error nothing expected: either way this row fails
                # alone (relay/retry.py classifies it) and the batch goes on; it holds its
                # key on its topic back, unless that topic can never be valid.
                if (hold := hold_of(row)) is not None:
                    rejected_holds.add(hold)
                rejected.append((row, exc))
        submission = Submission(self._ledger, holds)
        topics = await self._topics.resolve({record.topic for _, record in mapped})
        # From here on nothing awaits: the held keys read below are those in force when
        # the batches are handed over.
        number = self._ledger.next_number()
        open_batches: dict[tuple[str, int], tuple[Any, list[OutboxRow]]] = {}
        full: list[tuple[str, int, Any, list[OutboxRow]]] = []
        failed_keys: set[Hold] = set()
        for row, record in mapped:
            key = (record.topic, row.aggregateid)
            if key in failed_keys:
                continue  # held back: an earlier row of its key on its topic failed here
            if held and key in held:
                failed_keys.add(key)  # found again once its key is no longer held
                continue
            known = topics[record.topic]
            if isinstance(known, BaseException):  # classified by the caller
                submission.failures.append((row, known))
                failed_keys.add(key)
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
                    submission.failures.append(
                        (
                            row,
                            RecordRejected(
                                "record_too_large", "the record does not fit an empty batch"
                            ),
                        )
                    )
                    failed_keys.add(key)
                    continue
            members.append(row)
        submission.failures.extend(rejected)
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
        # Held now: the next fetch may come before these failures are recorded.
        holds.hold(row for row, _ in submission.failures)
        return submission

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
            if not previous.done():
                # Never cancels or re-raises the previous batch. Not awaited once it is
                # done: every batch of a submission then reaches the producer before its
                # sender wakes, and goes in one produce request.
                await asyncio.wait([previous])
            failed = previous.cancelled() or previous.exception() is not None
            # Failed, and its keys were not yet held back when this batch was built: this
            # batch may carry a later record of one of them.
            if failed and not self._ledger.held_before(previous, number):
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
