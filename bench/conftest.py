"""Benchmarks run against the same real services as the tests, one server only."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from bench.deployment import fresh_database
from bench.peers import measure


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        pytest.fail("benchmarks need KAFKA_BOOTSTRAP_SERVERS (make bench starts a broker)")
    return bootstrap


@pytest.fixture(scope="session")
def server_url() -> str:
    url = os.environ.get("DATABASE_URL_PG18") or os.environ.get("DATABASE_URL")
    if not url:
        pytest.fail("benchmarks need DATABASE_URL_PG18 or DATABASE_URL (make bench starts them)")
    return url


@pytest_asyncio.fixture
async def bench_database(server_url: str) -> AsyncIterator[str]:
    """A fresh migrated database, dropped afterwards."""
    async with fresh_database(server_url) as url:
        yield url


BEFORE_THE_DOOR = 8  # the last migration before rows were measured at INSERT (0009)


@pytest_asyncio.fixture
async def database_before_the_door(server_url: str) -> AsyncIterator[str]:
    """A fresh database migrated up to the last migration before the door: rows the door
    refuses go in, as rows stored before an upgrade; the test migrates the rest."""
    async with fresh_database(server_url, up_to=BEFORE_THE_DOOR) as url:
        yield url


class Topics:
    """The topics one benchmark creates; the fixture deletes them when it ends."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.created: list[str] = []

    async def create(self, topic: str, *, log_append_time: bool = False) -> str:
        await measure.create_topic(self.bootstrap, topic, log_append_time=log_append_time)
        self.created.append(topic)
        return topic


@pytest_asyncio.fixture
async def bench_topics(kafka_bootstrap: str) -> AsyncIterator[Topics]:
    """Fresh topics on the broker, deleted afterwards (bench.peers.measure.delete_topics)."""
    topics = Topics(kafka_bootstrap)
    try:
        yield topics
    finally:
        await measure.delete_topics(kafka_bootstrap, topics.created)


# What one drain left behind for its topic: the events in the outbox still, the receipts
# naming the topic, the distinct positions they name, and the topic's end offsets summed.
_RECEIPTS = """
SELECT (SELECT count(*) FROM outbox),
       count(*),
       count(DISTINCT (kafka_partition, kafka_offset))
FROM outbox_receipt WHERE topic = $1
"""


async def assert_delivered(
    conn: asyncpg.Connection, bootstrap: str, topic: str, events: int, *, quarantined: int = 0
) -> None:
    """Correctness, not speed: after a drain, every one of ``events`` is on ``topic`` and
    has its receipt, and only the ``quarantined`` rows are left in the outbox. An empty
    outbox alone would pass a relay that deleted rows without producing them; the broker's
    end offsets and the receipts would not."""
    left, receipts, positions = await conn.fetchrow(_RECEIPTS, topic)
    on_topic = await measure.records_on(bootstrap, topic)
    assert (left, on_topic, receipts, positions) == (quarantined, events, events, events), (
        f"{topic}: {events} events written; {left} left in the outbox, {on_topic} on the "
        f"topic, {receipts} receipts naming {positions} distinct positions"
    )
