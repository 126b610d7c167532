"""The benchmark's topics (bench.peers.measure.create_topic) against the real broker: a
topic the broker refuses is an error naming it, and a created topic is ready to publish to,
every partition with a leader in the broker's metadata, before the call returns."""

from __future__ import annotations

import uuid

import pytest

from bench.peers import measure
from tests.support.kafka import kafka_admin


def _name(what: str) -> str:
    return f"t{uuid.uuid4().hex[:10]}-{what}"


@pytest.mark.parametrize(
    ("topic", "partitions", "error"),
    [
        (_name("no-partitions"), 0, "InvalidPartitionsError"),
        (_name("bad name!"), measure.PARTITIONS, "InvalidTopicError"),
    ],
)
async def test_a_topic_the_broker_refuses_is_an_error_naming_it(
    kafka_bootstrap: str, topic: str, partitions: int, error: str
) -> None:
    try:
        with pytest.raises(RuntimeError, match="the broker did not create") as refused:
            await measure.create_topic(kafka_bootstrap, topic, partitions=partitions)
    finally:
        await measure.delete_topics(kafka_bootstrap, [topic])
    assert topic in str(refused.value)
    assert error in str(refused.value)


async def test_a_topic_that_exists_already_is_an_error(kafka_bootstrap: str) -> None:
    """Every run names its topics afresh; finding one already there means the run would
    count another run's records."""
    topic = _name("twice")
    try:
        await measure.create_topic(kafka_bootstrap, topic)
        with pytest.raises(RuntimeError, match="TopicAlreadyExistsError"):
            await measure.create_topic(kafka_bootstrap, topic)
    finally:
        await measure.delete_topics(kafka_bootstrap, [topic])


async def test_a_created_topic_has_a_leader_for_every_partition(kafka_bootstrap: str) -> None:
    topics = [_name(f"ready{n}") for n in range(3)]
    try:
        for topic in topics:
            await measure.create_topic(kafka_bootstrap, topic)
            async with kafka_admin(kafka_bootstrap) as admin:  # a fresh metadata request
                (described,) = await admin.describe_topics([topic])
            assert described["error_code"] == 0, described
            leaders = {p["partition"]: p["leader"] for p in described["partitions"]}
            assert sorted(leaders) == list(range(measure.PARTITIONS)), described
            assert all(leader >= 0 for leader in leaders.values()), described
    finally:
        await measure.delete_topics(kafka_bootstrap, topics)
