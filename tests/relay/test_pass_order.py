"""A pass never publishes a key's later row while it has stepped over an earlier one.

A pass reads ready rows in seq order after a cursor. A row held behind an earlier row of
its key that is waiting to be retried is left out of a fetch, yet the cursor moves past it.
If that earlier row is then published within the same pass, nothing holds the key back
any more: a later fetch of the pass would read the key's rows *after* the cursor, while
the row the pass stepped over waits for the next pass. A soak run saw exactly that after a
broker restart (for one key: 17, 18, 29, 30, 19, ..., 28 on Kafka).

Staged here with the relay's real statements: the first fetch of a pass returns the
retried row and steps over the key's next row; the pass's second fetch runs only once the
retried row is published and recorded, as on a loaded database.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest

from relay.records import OutboxRow
from relay.store import RelayStore
from tests.support.relay import fast_config, running_relay
from tests.support.waiting import wait_for_signal, wait_until

KEY = "k-pass"
INSERT_ROW = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ('order', $1, 'changed', $2::jsonb) RETURNING seq, id::text
"""
# The row's earlier publish failed retriably and was recorded; its retry is due now.
FAILED_AND_DUE = """
UPDATE outbox SET attempts = 1, next_attempt_at = clock_timestamp() - interval '1 ms'
WHERE seq = $1
"""
PUBLISHED = "SELECT id::text, kafka_partition, kafka_offset FROM outbox_receipt WHERE id = ANY($1)"


async def _published_order(db: asyncpg.Connection, ids: list[str]) -> list[str]:
    rows = await db.fetch(PUBLISHED, ids)
    assert len({r["kafka_partition"] for r in rows}) == 1  # one key, one partition
    return [r["id"] for r in sorted(rows, key=lambda r: r["kafka_offset"])]


async def test_a_pass_does_not_publish_a_keys_later_row_before_one_it_stepped_over(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    first = await db.fetchrow(INSERT_ROW, KEY, json.dumps(1))
    stepped_over = await db.fetchrow(INSERT_ROW, KEY, json.dumps(2))
    other = await db.fetchrow(INSERT_ROW, "k-other", json.dumps(1))
    later = await db.fetchrow(INSERT_ROW, KEY, json.dumps(3))
    await db.execute(FAILED_AND_DUE, first["seq"])
    ids = [first["id"], stepped_over["id"], later["id"]]

    # Two rows a fetch: the pass's first fetch reads [first, other] and its cursor passes
    # the stepped-over row, which waits behind `first`.
    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, batch_size=2, poll_interval_ms=300
    )
    delayed = asyncio.Event()

    class FetchAfterFirstIsRecorded(RelayStore):
        async def fetch_ready(
            self, lanes: Any, cursor: int, limit: int, **kwargs: Any
        ) -> list[OutboxRow]:
            if cursor == other["seq"] and not delayed.is_set():
                delayed.set()
                watcher = await asyncpg.connect(database_url)
                try:
                    await wait_until(
                        lambda: watcher.fetchval(
                            "SELECT count(*) = 1 FROM outbox_receipt WHERE id = $1", first["id"]
                        ),
                        timeout=30,
                        what="the first event's receipt",
                    )
                finally:
                    await watcher.close()
                # ...and its rows have left the window: the hold is gone in memory too.
                await wait_for_signal(
                    running.signals.recorded,
                    where=lambda outcome: any(
                        row.seq == first["seq"] for group in outcome.published for row in group.rows
                    ),
                    what="the first event's batch concluded and out of the in-flight window",
                )
            return await super().fetch_ready(lanes, cursor, limit, **kwargs)

    async with running_relay(config, store_factory=FetchAfterFirstIsRecorded) as running:
        running.signals.recorded.enable()
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 3 FROM outbox_receipt WHERE id = ANY($1)", ids),
            timeout=60,
            what="all three events published",
        )
    assert delayed.is_set(), "the staged fetch never ran: the scenario did not happen"
    assert await _published_order(db, ids) == ids, "a key's rows reached Kafka out of order"


@pytest.mark.parametrize("notify", [True, False], ids=["notified", "polling"])
async def test_a_pass_does_not_publish_a_late_commits_next_row_before_it(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    notify: bool,
) -> None:
    """A full pass's fetches follow each other from the cursor. A row its first fetch could
    not see (its transaction had not committed) lies behind the cursor; once it commits,
    the key's next row takes a seq after every row the pass has read, so the pass's next
    fetch would read that next row while the earlier one waits for the next pass."""
    late = await asyncpg.connect(database_url)
    try:
        late_tx = late.transaction()
        await late_tx.start()
        earlier = await late.fetchrow(INSERT_ROW, KEY, json.dumps(1))  # not committed yet
        fillers = [await db.fetchrow(INSERT_ROW, f"k-fill-{n}", json.dumps(n)) for n in (1, 2)]
        ids = [earlier["id"]]

        # Two rows a fetch: the pass's first fetch reads both fillers and steps over the
        # uncommitted row; its next fetch starts from the second filler.
        config = fast_config(
            database_url,
            kafka_bootstrap,
            topic_namespace,
            batch_size=2,
            poll_interval_ms=1_000,
            notify=notify,
        )
        staged = asyncio.Event()

        class CommitThenFetch(RelayStore):
            async def fetch_ready(
                self, lanes: Any, cursor: int, limit: int, **kwargs: Any
            ) -> list[OutboxRow]:
                if cursor == fillers[-1]["seq"] and not staged.is_set():
                    staged.set()
                    # The stepped-over row commits, then its key's next row, before this
                    # fetch.
                    await late_tx.commit()
                    # On the late row's own connection, now free: the test's polling uses db.
                    later = await late.fetchrow(INSERT_ROW, KEY, json.dumps(2))
                    ids.append(later["id"])
                return await super().fetch_ready(lanes, cursor, limit, **kwargs)

        async with running_relay(config, store_factory=CommitThenFetch):
            await wait_until(
                lambda: db.fetchval(
                    "SELECT count(*) = 2 FROM outbox_receipt WHERE id = ANY($1)", ids
                ),
                timeout=60,
                what="both events published",
            )
    finally:
        await late.close()
    assert staged.is_set(), "the staged fetch never ran: the scenario did not happen"
    assert await _published_order(db, ids) == ids, "a key's rows reached Kafka out of order"
