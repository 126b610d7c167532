"""The real broker: an idempotent ``acks=all`` producer's records come back intact and in order."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from tests.support.kafka import create_topics, read_topic


async def test_produce_consume_round_trip(kafka_bootstrap: str, topic_namespace: str) -> None:
    topic = f"{topic_namespace}.roundtrip"
    await create_topics(kafka_bootstrap, [topic], partitions=3)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all"
    )
    await producer.start()
    try:
        sent = []
        for i in range(5):
            metadata = await producer.send_and_wait(
                topic,
                key=b"job-7f3a",
                value=f'{{"n":{i}}}'.encode(),
                headers=[("id", f"event-{i}".encode()), ("ce_specversion", b"1.0")],
            )
            sent.append(metadata)
        tombstone = await producer.send_and_wait(topic, key=b"job-7f3a", value=None)
    finally:
        await producer.stop()
    # One key → one partition, consecutive offsets in send order.
    partitions = {m.partition for m in [*sent, tombstone]}
    assert len(partitions) == 1
    (partition,) = partitions
    offsets = [m.offset for m in [*sent, tombstone]]
    assert offsets == list(range(offsets[0], offsets[0] + 6))

    records = await read_topic(kafka_bootstrap, topic, count=6)
    assert len(records) == 6
    assert {r.partition for r in records} == {partition}
    assert [r.offset for r in records] == offsets
    assert all(r.key == b"job-7f3a" for r in records)
    assert [r.value for r in records[:5]] == [f'{{"n":{i}}}'.encode() for i in range(5)]
    assert records[5].value is None
    assert [dict(r.headers)["id"] for r in records[:5]] == [f"event-{i}".encode() for i in range(5)]
    assert dict(records[0].headers)["ce_specversion"] == b"1.0"
