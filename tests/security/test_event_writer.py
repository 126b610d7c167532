"""What the outbox takes from a writer: the database's time, whatever time the writer gives.

Real PostgreSQL (each server of the run).
"""

from __future__ import annotations

import datetime as dt

import asyncpg

from contracts.health import Classification
from contracts.policy import Family
from health.commands import evaluate_once
from tests.health.conftest import RECEIPT_RETENTION_MS, loose_policy
from tests.security.conftest import MakeRole
from tests.security.roles import grant


def _insert(key: str) -> str:
    return (
        "INSERT INTO outbox (aggregatetype, aggregateid, type) "
        f"VALUES ('order', '{key}', 'order.placed')"
    )


async def test_created_at_is_the_database_time_for_every_writer(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    # The scoring service's part may name every column; a time it gives is replaced by the
    # database's own, in the future (the outbox family would be unknown) and in the past.
    role = await make_role("writer")
    await grant(database_url, role.name, "writer")
    as_writer = await asyncpg.connect(role.url)
    try:
        before = await db.fetchval("SELECT clock_timestamp()")
        for key, shift in (("future", "+ interval '1 hour'"), ("past", "- interval '1 hour'")):
            await as_writer.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, created_at) "
                f"VALUES ('order', '{key}', 'order.placed', clock_timestamp() {shift})"
            )
        # In a transaction that began earlier, too: the row's time is the insert's.
        async with as_writer.transaction():
            await as_writer.execute("SELECT pg_sleep(0.05)")
            await as_writer.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, created_at) "
                "VALUES ('order', 'now', 'order.placed', now())"
            )
        await as_writer.execute(_insert("default"))
        after = await db.fetchval("SELECT clock_timestamp()")
    finally:
        await as_writer.close()
    stored = {r["aggregateid"]: r["created_at"] for r in await db.fetch("SELECT * FROM outbox")}
    for key, created_at in stored.items():
        assert before <= created_at <= after, (key, created_at, before, after)
    assert stored["now"] - before >= dt.timedelta(milliseconds=50)
    report = await evaluate_once(
        database_url, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS
    )
    outbox = next(r for r in report.families if r.family is Family.OUTBOX)
    assert outbox.classification is Classification.WITHIN_BOUNDS, outbox.reasons


async def test_the_owner_keeps_the_time_it_gives(db: asyncpg.Connection) -> None:
    # Tests and hand replays back-date rows as the owner; that keeps working.
    await db.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, created_at) "
        "VALUES ('order', 'old', 'order.placed', '2001-02-03T04:05:06Z')"
    )
    stored = await db.fetchval("SELECT created_at FROM outbox WHERE aggregateid = 'old'")
    assert stored == dt.datetime(2001, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
