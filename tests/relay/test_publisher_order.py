"""The batch publisher keeps a partition's order against the broker (real broker): a batch the
broker rejects is never overtaken by a later batch of the same partition."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from aiokafka import AIOKafkaProducer

from relay.config import RelayConfig
from relay.errors import PredecessorFailed
from relay.inflight import InFlightWindow
from relay.publisher import BatchPublisher, Submission
from relay.records import Hold, KafkaRecord, OutboxRow
from relay.retry import HELD_BEHIND_FAILURE, RECORD_TOO_LARGE, classify_failure
from relay.topics import TopicCatalog
from tests.support.kafka import create_topics, read_topic
from tests.support.rows import make_row

_LIMIT = 2_000  # the topic's max.message.bytes: one 4 KiB record is too large


class _LimitsUnreadable(TopicCatalog):
    """As without the DescribeConfigs right: the topic's limit stays unknown, so only the
    broker can refuse the record, which is the case under test."""

    async def _describe_max_message_bytes(self, topic: str) -> int | None:
        return None


def _record(topic: str, n: int, size: int, key: bytes = b"k") -> KafkaRecord:
    return KafkaRecord(
        topic=topic, key=key, value=b'{"n":%d,"pad":"%s"}' % (n, b"x" * size), headers=[]
    )


# Every row these tests submit has a seq of its own, mapped to exactly its record.
_RECORDS: dict[int, KafkaRecord] = {}
_SEQS = itertools.count(1)


def _hold_of(row: OutboxRow) -> Hold:
    """What a row holds when it fails: its key on its record's topic."""
    return (_RECORDS[row.seq].topic, row.aggregateid)


def _holds() -> InFlightWindow:
    """Where the publisher holds failed keys, as the relay's in-flight window does."""
    return InFlightWindow(8, hold_of=_hold_of)


async def _submit(
    publisher: BatchPublisher, *records: KafkaRecord, holds: InFlightWindow | None = None
) -> Submission:
    """Submit one row per record, mapped to exactly that record (and holding its key on
    its topic in ``holds`` when it fails)."""
    rows = [make_row(seq=next(_SEQS), aggregateid=record.key.decode()) for record in records]
    _RECORDS.update((row.seq, record) for row, record in zip(rows, records, strict=True))
    return await publisher.submit(rows, lambda row: _RECORDS[row.seq], holds or _holds())


async def _read_all(bootstrap: str, topic: str) -> list[bytes]:
    return [record.value or b"" for record in await read_topic(bootstrap, topic)]


@pytest.mark.parametrize("first_write", [True, False], ids=["first-write", "later-write"])
async def test_a_rejected_batch_is_not_overtaken_by_the_next_of_its_partition(
    kafka_bootstrap: str, topic_namespace: str, first_write: bool
) -> None:
    topic = f"{topic_namespace}.small"
    await create_topics(kafka_bootstrap, [topic], configs={"max.message.bytes": str(_LIMIT)})
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    try:
        topics = _LimitsUnreadable(RelayConfig(database_url=None, kafka_bootstrap=kafka_bootstrap))
        topics.attach(producer)
        publisher = BatchPublisher(producer, topics)
        if not first_write:
            warmup = await _submit(publisher, _record(topic, 0, 10))
            await asyncio.wait([b.future for b in warmup.batches])
        # Three submissions in a row, as pipelined fetches hand them over: r1 is too large
        # for the topic, r2 and r3 of the same key are small.
        subs = [
            await _submit(publisher, _record(topic, 1, 4_000)),
            await _submit(publisher, _record(topic, 2, 10)),
            await _submit(publisher, _record(topic, 3, 10)),
        ]
        futures = [s.batches[0].future for s in subs]
        await asyncio.wait(futures, timeout=30)
    finally:
        await topics.close()
        await producer.stop()
    assert all(f.done() for f in futures)
    assert classify_failure(futures[0].exception()) is RECORD_TOO_LARGE  # type: ignore[arg-type]
    for later in futures[1:]:
        assert isinstance(later.exception(), PredecessorFailed)
        assert classify_failure(later.exception()) is HELD_BEHIND_FAILURE  # type: ignore[arg-type]
    on_topic = await _read_all(kafka_bootstrap, topic)
    assert [v[:6] for v in on_topic] == ([b'{"n":0'] if not first_write else [])


async def test_a_partition_sends_again_once_its_failed_keys_are_held(
    kafka_bootstrap: str, topic_namespace: str
) -> None:
    topic = f"{topic_namespace}.small"
    await create_topics(kafka_bootstrap, [topic], configs={"max.message.bytes": str(_LIMIT)})
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True
    )
    await producer.start()
    topics = _LimitsUnreadable(RelayConfig(database_url=None, kafka_bootstrap=kafka_bootstrap))
    topics.attach(producer)
    try:
        publisher = BatchPublisher(producer, topics)
        holds = _holds()
        refused = await _submit(publisher, _record(topic, 1, 4_000), holds=holds)
        behind = await _submit(publisher, _record(topic, 2, 10), holds=holds)
        assert not holds.held()
        # Taking the answers holds the failed batches' keys back from here on (as when
        # the relay settles them); a batch built afterwards leaves that key out and is sent.
        await refused.acknowledgements(within_s=30)
        await behind.acknowledgements(within_s=30)
        assert set(holds.held()) == {(topic, "k")}
        held = await _submit(
            publisher,
            _record(topic, 3, 10),
            KafkaRecord(topic, b"other", b'{"n":4}', []),
            holds=holds,
        )
        await asyncio.wait([b.future for b in held.batches], timeout=30)
    finally:
        await topics.close()
        await producer.stop()
    assert isinstance(behind.batches[0].future.exception(), PredecessorFailed)
    # the held key's record left out
    assert [[row.aggregateid for row in b.rows] for b in held.batches] == [["other"]]
    assert held.batches[0].future.exception() is None
    assert [v[:6] for v in await _read_all(kafka_bootstrap, topic)] == [b'{"n":4']
