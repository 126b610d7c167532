"""Nothing committed is skipped, and each key's events reach Kafka in commit order."""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections import defaultdict

import asyncpg

from relay.redrive import RedriveFilter, redrive
from relay.store import pending_summary
from tests.support.kafka import read_topic
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.waiting import wait_until


async def _drained(db: asyncpg.Connection) -> bool:
    return await db.fetchval("SELECT count(*) FROM outbox WHERE quarantined_at IS NULL") == 0


async def test_a_transaction_that_commits_last_is_not_skipped(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    early = await asyncpg.connect(database_url)
    try:
        tx = early.transaction()
        await tx.start()
        # The early transaction takes the lower seq, then stays open.
        await early.execute(INSERT, "agg", "early-key", "t", '{"n": 1}')
        async with running_relay(fast_config(database_url, kafka_bootstrap, topic_namespace)):
            for i in range(20):
                await db.execute(INSERT, "agg", f"late-{i}", "t", '{"n": 2}')
            await wait_until(lambda: _drained(db), what="the outbox drained")
            await tx.commit()
            await wait_until(lambda: _drained(db), what="the outbox drained")
    finally:
        await early.close()
    records = await read_topic(kafka_bootstrap, f"{topic_namespace}.agg", count=21)
    assert sorted(r.key for r in records) == sorted(
        [b"early-key"] + [f"late-{i}".encode() for i in range(20)]
    )


async def test_concurrent_writers_keep_each_keys_commit_order(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    await db.execute("CREATE TABLE aggregate_version (key text PRIMARY KEY, n int NOT NULL)")
    keys = [f"key-{i}" for i in range(25)]
    await db.executemany("INSERT INTO aggregate_version VALUES ($1, 0)", [(k,) for k in keys])
    per_writer = 60

    async def writer(seed: int) -> None:
        rng = random.Random(seed)
        conn = await asyncpg.connect(database_url)
        try:
            for _ in range(per_writer):
                key = rng.choice(keys)
                async with conn.transaction():
                    # Writers of one aggregate serialise on it (the row lock), as the ordering guarantee assumes.
                    n = await conn.fetchval(
                        "UPDATE aggregate_version SET n = n + 1 WHERE key = $1 RETURNING n", key
                    )
                    await asyncio.sleep(rng.random() / 500)
                    await conn.execute(INSERT, "agg", key, "t", json.dumps({"n": n}))
        finally:
            await conn.close()

    async with running_relay(
        fast_config(database_url, kafka_bootstrap, topic_namespace, batch_size=50)
    ):
        await asyncio.gather(*(writer(s) for s in range(6)))
        await wait_until(lambda: _drained(db), what="the outbox drained")
    total = 6 * per_writer
    records = await read_topic(kafka_bootstrap, f"{topic_namespace}.agg", count=total)
    sequences: dict[bytes, list[int]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        sequences[record.key].append(json.loads(record.value)["n"])
    assert sum(len(s) for s in sequences.values()) == total
    for key, seen in sequences.items():
        assert seen == list(range(1, len(seen) + 1)), key


async def test_polling_alone_delivers_everything(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, notify=False)
    async with running_relay(config):
        for i in range(30):
            await db.execute(INSERT, "agg", f"k{i % 7}", "t", json.dumps({"i": i}))
            if i % 10 == 0:
                await asyncio.sleep(0.3)
        await wait_until(lambda: _drained(db), what="the outbox drained")
    records = await read_topic(kafka_bootstrap, f"{topic_namespace}.agg", count=30)
    assert sorted(json.loads(r.value)["i"] for r in records) == list(range(30))


async def test_poison_event_is_quarantined_holds_only_its_key_and_redrives(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    # A header of the relay's own: no attempt can publish it (the key's topic is valid,
    # so it holds the key there).
    poison_id = await db.fetchval(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers) "
        "VALUES ('agg', 'poisoned', 't', '{\"n\": 1}', '{\"ce_source\": \"forged\"}') "
        "RETURNING id"
    )
    await db.execute(INSERT, "agg", "poisoned", "t", '{"n": 2}')
    for i in range(10):
        await db.execute(INSERT, "agg", f"healthy-{i}", "t", '{"n": 1}')
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, max_attempts=2)
    topic = f"{topic_namespace}.agg"
    async with running_relay(config) as running:
        await wait_until(
            lambda: db.fetchval(
                "SELECT quarantined_at IS NOT NULL FROM outbox WHERE id = $1", poison_id
            ),
            what="the poison row quarantined",
        )
        healthy = await read_topic(kafka_bootstrap, topic, count=10)
        assert sorted(r.key for r in healthy) == sorted(f"healthy-{i}".encode() for i in range(10))
        row = await db.fetchrow(
            "SELECT attempts, last_error_class FROM outbox WHERE id = $1", poison_id
        )
        assert (row["attempts"], row["last_error_class"]) == (2, "invalid_headers")
        # The key's second event waits behind the quarantined first one.
        await asyncio.sleep(1.0)
        assert await db.fetchval("SELECT count(*) FROM outbox WHERE aggregateid = 'poisoned'") == 2
        assert running.metric("outbox_relay_quarantined_events_total") == 1
        # The operator repairs the row and returns it to the relay.
        await db.execute("UPDATE outbox SET headers = NULL WHERE id = $1", poison_id)
        count = await redrive(db, RedriveFilter(ids=[poison_id]))
        assert count == 1
        await wait_until(lambda: _drained(db), what="the outbox drained")
    records = await read_topic(kafka_bootstrap, topic, count=12)
    poisoned = [
        json.loads(r.value)["n"]
        for r in sorted(records, key=lambda r: r.offset)
        if r.key == b"poisoned"
    ]
    assert poisoned == [1, 2]


# A row of key $1 written at $2, any text timestamptz takes ('infinity' too); returns its id.
INSERT_CREATED_AT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, created_at)
VALUES ('agg', $1, 't', '{"n": 1}', $2::text::timestamptz)
RETURNING id
"""


async def test_a_created_at_no_record_can_carry_is_quarantined_not_a_stalled_relay(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    # The column takes any timestamptz a writer sets; ce_time is RFC 3339 (years 1-9999).
    # Each such row must cost only its own key, never every fetch of its lane.
    odd_ids = [
        await db.fetchval(INSERT_CREATED_AT, f"odd-{i}", when)
        for i, when in enumerate(["infinity", "-infinity", "10000-01-01 00:00:00+00"])
    ]
    for i in range(10):
        await db.execute(INSERT, "agg", f"healthy-{i}", "t", '{"n": 1}')
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, max_attempts=1)
    async with running_relay(config):
        healthy = await read_topic(kafka_bootstrap, f"{topic_namespace}.agg", count=10)
        assert sorted(r.key for r in healthy) == sorted(f"healthy-{i}".encode() for i in range(10))
        assert all(dict(r.headers)["ce_time"].endswith(b"Z") for r in healthy)
        await wait_until(
            lambda: db.fetchval(
                "SELECT count(*) = 3 FROM outbox WHERE id = ANY($1) AND quarantined_at IS NOT NULL",
                odd_ids,
            ),
            what="the three odd rows quarantined",
        )
    causes = await db.fetch(
        "SELECT DISTINCT last_error_class FROM outbox WHERE id = ANY($1)", odd_ids
    )
    assert [c["last_error_class"] for c in causes] == ["invalid_created_at"]


async def test_the_backlog_gauges_read_a_pending_row_created_at_minus_infinity(
    db: asyncpg.Connection,
) -> None:
    # Until it is quarantined the row is pending, and older than any other: the summary
    # the backlog gauges come from failed ("cannot subtract infinite timestamps").
    await db.execute(INSERT, "agg", "healthy", "t", '{"n": 1}')
    await db.execute(INSERT_CREATED_AT, "odd", "-infinity")
    summary = await pending_summary(db)
    assert (summary.pending, summary.quarantined, summary.oldest_age_s) == (2, 0, math.inf)
