"""Recording what the broker acknowledged: batches settled while both recording statements
run are recorded by the next statement together, so under load the bookkeeping costs less
than a statement per batch; a batch that comes alone is recorded at once, and nothing is
lost or recorded twice.

The relay runs in this process against the real PostgreSQL and broker; its store counts
the statements that record outcomes and slows each down, as a loaded database would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from relay.store import RelayStore
from tests.support.relay import RunningRelay, fast_config, running_relay
from tests.support.waiting import wait_until

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ('order', $1, 'order.placed', '{}'::jsonb)
"""


class _SlowRecords(RelayStore):
    """Records each outcome only after a pause; counts the recording statements."""

    pause_s = 0.0
    statements = 0
    rows_per_statement: list[int] = []  # noqa: RUF012 - reset per test by a subclass

    async def record_outcome(
        self, fences: Any, published: Any, failed: Any, *a: Any, **k: Any
    ) -> Any:
        kind = type(self)
        kind.statements += 1
        kind.rows_per_statement.append(sum(len(group.rows) for group in published) + len(failed))
        await asyncio.sleep(kind.pause_s)
        return await super().record_outcome(fences, published, failed, *a, **k)


def _store(pause_s: float) -> type[_SlowRecords]:
    return type(
        "Slow",
        (_SlowRecords,),
        {"pause_s": pause_s, "statements": 0, "rows_per_statement": []},
    )


@asynccontextmanager
async def _counting_batches(running: RunningRelay) -> AsyncIterator[list[int]]:
    """How many batches the relay concluded while the block ran (one signal per batch)."""
    running.signals.recorded.enable()
    concluded = [0]

    async def count() -> None:
        while True:
            await running.signals.recorded.next()
            concluded[0] += 1

    task = asyncio.create_task(count())
    try:
        yield concluded
    finally:
        task.cancel()


async def _published(db: asyncpg.Connection, n: int) -> bool:
    return int(await db.fetchval("SELECT count(*) FROM outbox_receipt")) == n


async def test_batches_settled_while_the_database_is_busy_share_a_statement(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    store = _store(0.2)
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    events = 60
    async with (
        running_relay(config, store_factory=store) as running,
        _counting_batches(running) as batches,
    ):
        # One event per transaction: the relay fetches them as they come.
        for n in range(events):
            await db.execute(INSERT, f"k-{n % 7}")
            await asyncio.sleep(0.01)
        await wait_until(lambda: _published(db, events), timeout=60, what="every event published")
        await wait_until(lambda: sum(store.rows_per_statement) == events, timeout=10)
    assert sum(store.rows_per_statement) == events  # each row recorded once
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0
    # Two statements at once, each 0.2 s, for events that come every 10 ms: batches settle
    # faster than they are recorded, and the next statement records those waiting.
    assert store.statements < batches[0], (batches[0], store.rows_per_statement)


async def test_a_batch_that_comes_alone_is_recorded_alone_and_at_once(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    store = _store(0.0)
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    async with (
        running_relay(config, store_factory=store) as running,
        _counting_batches(running) as batches,
    ):
        for n in range(5):
            await db.execute(INSERT, f"alone-{n}")
            await wait_until(lambda n=n: _published(db, n + 1), timeout=30, what=f"event {n}")
        await wait_until(lambda: batches[0] == 5, timeout=10)
    assert store.rows_per_statement == [1, 1, 1, 1, 1]
