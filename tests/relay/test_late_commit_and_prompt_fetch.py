"""Rows a pass stepped over are found again within about one poll interval, even while a
continuous backlog keeps the pipeline busy (docs/relay.md, "Fetching: passes and the key
hold")."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg

from relay.store import Recorded, RelayStore
from tests.support.kafka import read_topic
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.waiting import wait_until

_BACKLOG = 30_000

_INSERT_BACKLOG = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'bulk', 'key-' || (g % 500), 'bulk.event', '{}'::jsonb FROM generate_series(1, $1) g
"""


async def _pending(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM outbox"))


async def test_a_late_commit_is_found_while_the_backlog_still_drains(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    late = await asyncpg.connect(database_url)
    try:
        # The late row takes its seq first and commits only once the relay's pass is far
        # past it: every fetch of that pass stepped over it.
        late_tx = late.transaction()
        await late_tx.start()
        late_id = await late.fetchval(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
            "VALUES ('bulk', 'late-key', 'late.event', '{}') RETURNING id"
        )
        await db.execute(_INSERT_BACKLOG, _BACKLOG)
        config = fast_config(
            database_url, kafka_bootstrap, topic_namespace, batch_size=20, poll_interval_ms=200
        )
        async with running_relay(config):
            await wait_until(lambda: _receipts_at_least(db, 500), timeout=60, what="500 receipts")
            await late_tx.commit()
            await wait_until(
                lambda: _published(db, late_id),
                timeout=80,
                interval=0.02,
                what="the late commit published",
            )
            pending_when_found = await _pending(db)
            published_when_found = _BACKLOG - pending_when_found
            await wait_until(lambda: _drained(db), timeout=80, what="the outbox drained")
    finally:
        await late.close()
    # The row was found by a pass that started while the backlog was still there, not by
    # the first pass after the backlog drained: most of the backlog was still waiting.
    assert pending_when_found > _BACKLOG // 4, (
        f"the late row was published only after {published_when_found} of {_BACKLOG} "
        f"backlog rows ({pending_when_found} still pending)"
    )


async def _receipts_at_least(db: asyncpg.Connection, count: int) -> bool:
    return bool(await db.fetchval("SELECT count(*) >= $1 FROM outbox_receipt", count))


async def _published(db: asyncpg.Connection, event_id: object) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM outbox_receipt WHERE id = $1", event_id))


async def _drained(db: asyncpg.Connection) -> bool:
    return await _pending(db) == 0


async def test_a_new_event_does_not_wait_for_the_previous_batch_to_be_recorded(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    """Latency at light load: an event committed while the batch before it is acknowledged
    but not yet recorded is fetched and published at once (on its NOTIFY), not after
    that bookkeeping; the poll interval is far longer than the test may take."""
    recording = anyio.Event()
    release = anyio.Event()

    class HeldFirstRecord(RelayStore):
        async def record_outcome(self, *args: Any, **kwargs: Any) -> Recorded:
            if not recording.is_set():
                recording.set()
                await release.wait()
            return await super().record_outcome(*args, **kwargs)

    config = fast_config(database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=60_000)
    topic = f"{topic_namespace}.quick"
    async with running_relay(config, store_factory=HeldFirstRecord) as running:
        await wait_until(running.relay.ready, timeout=30, what="the relay ready")
        await db.execute(INSERT, "quick", "first-key", "quick.event", "{}")
        with anyio.fail_after(30):
            await recording.wait()  # the first batch is acknowledged; its record waits
        await db.execute(INSERT, "quick", "second-key", "quick.event", "{}")
        try:
            records = await read_topic(kafka_bootstrap, topic, count=2, timeout=20)
            second_published_while_first_unrecorded = len(records) == 2
        finally:
            release.set()
        await wait_until(lambda: _drained(db), timeout=30, what="the outbox drained")
    assert second_published_while_first_unrecorded, (
        "the second event waited for the first batch's bookkeeping"
    )
