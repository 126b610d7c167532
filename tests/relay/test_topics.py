"""A missing topic and a topic with a small message limit stall nothing but their own rows
(docs/relay.md, "Topics"): against the real broker, with topics created for the test."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import asyncpg
import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.support.kafka import create_topics, kafka_admin, read_topic
from tests.support.relay import INSERT, RunningRelay, fast_config, running_relay
from tests.support.waiting import wait_until

# Latency of a row: its receipt's publication time, or now while it is still waiting.
_LATENCIES = """
SELECT extract(epoch FROM coalesce(r.published_at, clock_timestamp()) - w.created_at)
FROM unnest($1::uuid[]) AS w_id(id)
JOIN LATERAL (
    SELECT created_at FROM outbox WHERE id = w_id.id
    UNION ALL SELECT created_at FROM outbox_receipt WHERE id = w_id.id
) AS w ON true
LEFT JOIN outbox_receipt r ON r.id = w_id.id
"""


async def _write_steadily(
    db: asyncpg.Connection, seconds: float, running: RunningRelay, live: list[bool]
) -> list[object]:
    """One row every 50 ms on its own key for ``seconds``, watching liveness meanwhile."""
    ids: list[object] = []
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        ids.append(
            await db.fetchval(INSERT + " RETURNING id", "good", f"good-{n}-{len(ids)}", "t", "{}")
        )
        live.append(running.relay.live())
        await asyncio.sleep(0.05)
    return ids


async def _median_latency(db: asyncpg.Connection, ids: list[object]) -> float:
    rows = await db.fetch(_LATENCIES, ids)
    return statistics.median(float(r[0]) for r in rows)


async def test_a_missing_topic_stalls_only_its_own_rows_and_is_quarantined(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    # The broker here creates topics on first use. This name collides with an existing
    # topic ('.' and '_' map to the same metric name), so the broker refuses to create
    # it and answers UNKNOWN_TOPIC_OR_PARTITION, as a broker without auto-creation does.
    await create_topics(kafka_bootstrap, [f"{topic_namespace}.miss_ing"])
    missing = f"{topic_namespace}.miss.ing"
    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        send_timeout_ms=3_000,
        lease_ttl_ms=6_000,
        max_attempts=3,
    )
    live: list[bool] = []
    async with running_relay(config) as running:
        await wait_until(running.relay.ready, timeout=20, what="the relay ready")
        baseline = await _write_steadily(db, 3.0, running, live)
        for n in range(12):
            await db.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic) "
                "VALUES ('lost', $1, 't', '{}', $2)",
                f"lost-{n}",
                missing,
            )
        during = await _write_steadily(db, 6.0, running, live)
        # Let the last rows written have their chance before measuring.
        await asyncio.sleep(1.0)
        baseline_s = await _median_latency(db, baseline)
        during_s = await _median_latency(db, during)
        # Other keys flow at their normal latency: a generous margin over the baseline
        # of this same run, and far below one send timeout (what each pass lost before).
        assert during_s < max(5 * baseline_s, baseline_s + 0.5), (baseline_s, during_s)
        assert all(live), f"not live in {live.count(False)} of {len(live)} samples"
        # The missing topic's rows are quarantined with their cause, within the bound of
        # docs/relay.md: one lookup (send timeout) plus the backoff of max_attempts tries.
        await wait_until(
            lambda: db.fetchval(
                "SELECT count(*) = 12 FROM outbox "
                "WHERE quarantined_at IS NOT NULL AND last_error_class = 'unknown_topic'"
            ),
            timeout=30,
            what="12 events quarantined as unknown_topic",
        )
        assert running.metric("outbox_relay_quarantined_events_total") == 12
        assert (
            running.metric("outbox_relay_failed_events_total", {"error_class": "unknown_topic"})
            >= 12
        )
        assert running.relay.ready()
    assert (
        await db.fetchval("SELECT count(*) FROM outbox_receipt WHERE aggregatetype = 'lost'") == 0
    )


# What is left in the outbox, by key kind, cause and quarantine.
_STATE = """
SELECT CASE WHEN aggregateid = 'huge' THEN 'huge' ELSE 'small' END, last_error_class,
       quarantined_at IS NOT NULL, count(*)
FROM outbox GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
"""

_SMALL_LIMIT = 16_384  # max.message.bytes of the test's topic, far below the 256 KiB cap


async def _alter_limit(bootstrap: str, topic: str, limit: int) -> None:
    async with kafka_admin(bootstrap) as admin:
        await admin.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(limit)})]
        )


async def _insert_sized(db: asyncpg.Connection, count: int, prefix: str, size: int) -> None:
    await db.executemany(
        INSERT,
        [
            ("small", f"{prefix}-{n % 40}", "t", json.dumps({"pad": "x" * size}))
            for n in range(count)
        ],
    )


async def _wait_for(db: asyncpg.Connection, condition: str, what: str) -> None:
    """``wait_until`` on a SQL condition; a timeout names what was awaited and what is left."""
    try:
        await wait_until(lambda: db.fetchval(condition), timeout=30, what=what)
    except AssertionError:
        state = [tuple(r) for r in await db.fetch(_STATE)]
        receipts = await db.fetchval("SELECT count(*) FROM outbox_receipt")
        raise AssertionError(
            f"not within 30 s: {what}; receipts {receipts}, outbox {state}"
        ) from None


async def test_batches_fit_the_topic_and_only_a_record_too_large_alone_is_quarantined(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    topic = f"{topic_namespace}.small"
    await create_topics(kafka_bootstrap, [topic], configs={"max.message.bytes": str(_SMALL_LIMIT)})
    await _insert_sized(db, 200, "a", 1_000)
    await db.execute(INSERT, "small", "huge", "t", json.dumps({"pad": "x" * 20_000}))
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, max_attempts=2)
    async with running_relay(config) as running:
        # Every small event goes out, in batches the topic accepts; the one record larger
        # than the topic's limit on its own is quarantined, nothing else.
        await _wait_for(
            db,
            "SELECT count(*) = 200 FROM outbox_receipt WHERE aggregateid <> 'huge'",
            "the 200 small events published",
        )
        await _wait_for(
            db,
            "SELECT count(*) = 0 FROM outbox WHERE quarantined_at IS NULL",
            "nothing left pending but the quarantined record",
        )
        state = await db.fetch(_STATE)
        assert [tuple(r) for r in state] == [("huge", "record_too_large", True, 1)], state
        assert await db.fetchval("SELECT count(*) FROM outbox_receipt") == 200
        assert await db.fetchval("SELECT count(*) FROM outbox") == 1
        assert running.metric("outbox_relay_quarantined_events_total") == 1
        # The limit is lowered while the relay runs: the first batches built for the old
        # limit are refused, the relay reads the limit again and sends smaller batches.
        await _alter_limit(kafka_bootstrap, topic, 4_096)
        await _insert_sized(db, 100, "b", 1_000)
        await _wait_for(
            db,
            "SELECT count(*) = 300 FROM outbox_receipt",
            "the 100 later small events published under the lowered limit",
        )
        state = await db.fetch(_STATE)
        assert [tuple(r) for r in state] == [("huge", "record_too_large", True, 1)], state
        assert running.metric("outbox_relay_quarantined_events_total") == 1
        refused = running.metric(
            "outbox_relay_retried_events_total", {"error_class": "batch_too_large"}
        )
    records = await read_topic(kafka_bootstrap, topic, count=300)
    assert len(records) >= 300 and b"huge" not in {r.key for r in records}
    assert refused > 0  # the lowered limit was met by a refusal, not by luck


async def test_the_topics_the_relay_tracks_are_bounded(
    kafka_bootstrap: str, topic_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers choose topics: the catalog, and the producer's metadata requests, keep the
    most recently used ones and forget the rest past the bound."""
    from aiokafka import AIOKafkaProducer

    import relay.topics
    from relay.config import RelayConfig
    from relay.topics import TopicCatalog

    monkeypatch.setattr(relay.topics, "MAX_TRACKED_TOPICS", 3)
    await create_topics(kafka_bootstrap, [f"{topic_namespace}.t{n}" for n in range(5)])
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    catalog = TopicCatalog(RelayConfig(database_url=None, kafka_bootstrap=kafka_bootstrap))
    catalog.attach(producer)
    try:
        for n in range(5):
            answers = await catalog.resolve([f"{topic_namespace}.t{n}"])
            assert answers[f"{topic_namespace}.t{n}"] == [0]
        tracked = set(producer.client._topics)  # what its metadata requests ask for
    finally:
        await catalog.close()
        await producer.stop()
    assert catalog.tracked == 3
    assert {f"{topic_namespace}.t{n}" for n in range(2)}.isdisjoint(tracked)
    assert {f"{topic_namespace}.t{n}" for n in range(2, 5)} <= tracked


def _colliding_names(base: str, count: int) -> list[str]:
    """``count`` valid topic names that collide with ``base`` (the broker maps '.' and '_'
    to the same metric name, so it refuses to create any of them): ``base`` with a
    different subset of its underscores written as dots."""
    parts = base.split("_")
    names = []
    for mask in range(1, 2 ** (len(parts) - 1)):
        name = parts[0]
        for i, part in enumerate(parts[1:]):
            name += ("." if mask >> i & 1 else "_") + part
        names.append(name)
    assert len(names) >= count
    return names[:count]


# Where the rows of the missing topics stand, by cause and quarantine.
_MISSING_STATE = """
SELECT last_error_class, quarantined_at IS NOT NULL, count(*)
FROM outbox WHERE aggregatetype = 'lost' GROUP BY 1, 2 ORDER BY 1, 2
"""


async def test_rows_over_more_missing_topics_than_are_tracked_end_as_unknown_topic(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    # Writers choose topics. Rows spread over more missing topics than the catalog tracks
    # must still be quarantined as unknown_topic after their attempts: the broker's "no
    # such topic" is kept apart from the tracked topics, not forgotten with them.
    import relay.topics

    count = 2 * relay.topics.MAX_TRACKED_TOPICS
    base = f"{topic_namespace}_c_c_c_c_c_c_c_c_c_c_c"
    await create_topics(kafka_bootstrap, [base])
    missing = _colliding_names(base, count)
    await db.executemany(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic) "
        "VALUES ('lost', $1, 't', '{}', $2)",
        [(f"lost-{n}", topic) for n, topic in enumerate(missing)],
    )
    # The default send timeout: how long a first lookup watches the broker answer
    # without the topic before it is taken as missing.
    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        max_attempts=3,
        send_timeout_ms=5_000,
        lease_ttl_ms=12_000,
    )
    async with running_relay(config) as running:
        try:
            await wait_until(
                lambda: db.fetchval(
                    "SELECT count(*) = $1 FROM outbox WHERE aggregatetype = 'lost' "
                    "AND quarantined_at IS NOT NULL AND last_error_class = 'unknown_topic'",
                    count,
                ),
                timeout=90,
                what=f"{count} events quarantined as unknown_topic",
            )
        except AssertionError:
            state = [tuple(r) for r in await db.fetch(_MISSING_STATE)]
            raise AssertionError(f"rows of the missing topics: {state}") from None
        assert running.metric("outbox_relay_quarantined_events_total") == count
    assert await db.fetchval("SELECT count(*) FROM outbox_receipt") == 0


async def test_negative_entries_are_bounded_apart_from_the_tracked_topics_and_expire(
    kafka_bootstrap: str, topic_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiokafka import AIOKafkaProducer

    import relay.topics
    from relay.config import RelayConfig
    from relay.errors import TopicLookupPending, TopicNotFound
    from relay.topics import TopicCatalog

    monkeypatch.setattr(relay.topics, "MAX_TRACKED_TOPICS", 2)
    monkeypatch.setattr(relay.topics, "MAX_MISSING_TOPICS", 3)
    monkeypatch.setattr(relay.topics, "FIRST_LOOKUP_WAIT_S", 0.1)
    base = f"{topic_namespace}_c_c_c"
    await create_topics(kafka_bootstrap, [base])
    names = _colliding_names(base, 4)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    config = RelayConfig(database_url=None, kafka_bootstrap=kafka_bootstrap, send_timeout_ms=1_000)
    catalog = TopicCatalog(config)
    catalog.attach(producer)

    async def answer(topic: str) -> object:
        return (await catalog.resolve([topic]))[topic]

    async def found_missing(topic: str) -> None:
        # The first lookup watches the broker answer without it for a send timeout.
        assert isinstance(await answer(topic), TopicLookupPending)
        deadline = time.monotonic() + 10
        while not isinstance(await answer(topic), TopicNotFound):
            assert time.monotonic() < deadline, f"{topic} never found missing"
            await asyncio.sleep(0.1)

    try:
        for topic in names[:3]:
            await found_missing(topic)
        # Three negative entries outlive their topics' place among the two tracked: the
        # first topic's rows are unknown_topic at once, not another lookup.
        assert (catalog.tracked, catalog.missing) == (2, 3)
        assert isinstance(await answer(names[0]), TopicNotFound)
        # A fourth pushes out the entry the broker confirmed longest ago.
        await found_missing(names[3])
        assert catalog.missing == 3
        # An entry the broker has not confirmed within its time to live stands no more:
        # the topic is looked up again before its rows are counted as failing.
        monkeypatch.setattr(relay.topics, "MISSING_TTL_S", 0.0)
        assert isinstance(await answer(names[3]), TopicLookupPending)
    finally:
        await catalog.close()
        await producer.stop()
