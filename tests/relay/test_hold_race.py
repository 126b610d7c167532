"""A fetch that overlaps the recording of a failure must not send a later row of its key.

The relay holds a failed row's key in memory until the failure is recorded; from then on
the database holds it back (FETCH_READY leaves out every row behind a waiting one). A
fetch statement whose snapshot was taken before the failure committed still sees the key
free, and if it returns after the in-memory hold was released, nothing holds the key back:
the later row would reach Kafka before the failed one.

The statement's slowness is staged: the real fetch runs, then returns only after the
failure was recorded and released, as a slow fetch on a loaded database would.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from relay.records import OutboxRow
from relay.store import Recorded, RelayStore
from tests.support.relay import fast_config, running_relay
from tests.support.waiting import wait_for_signal, wait_until

KEY = "k-race"
INSERT_ROW = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers)
VALUES ('order', $1, 'created', $2::jsonb, $3::jsonb) RETURNING seq
"""


async def test_a_fetch_that_overlaps_a_failure_record_does_not_send_a_later_row_of_its_key(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    # The first row of the key is refused before sending (a header that would replace the
    # relay's own): a permanent failure, retried only in a minute. Both rows go to the same
    # topic: a held row holds its key on its topic.
    failed_seq = await db.fetchval(INSERT_ROW, KEY, json.dumps(1), json.dumps({"id": "forged"}))
    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        retry_base_ms=60_000,
        retry_cap_ms=60_000,
        max_attempts=100,
        poll_interval_ms=300,
    )
    snapshot_taken = asyncio.Event()
    fetches_after: list[int] = []

    class SlowFetchAfterTheSnapshot(RelayStore):
        async def fetch_ready(self, *args: Any, **kwargs: Any) -> list[OutboxRow]:
            rows = await super().fetch_ready(*args, **kwargs)
            if snapshot_taken.is_set():
                fetches_after.append(len(rows))
            elif any(r.aggregateid == KEY and r.seq != failed_seq for r in rows):
                snapshot_taken.set()
                # Returns only once the failure is recorded and its hold released.
                await wait_for_signal(
                    running.signals.recorded,
                    where=lambda outcome: any(row.aggregateid == KEY for row, _ in outcome.failed),
                    what="the failure of the key's first row recorded and its hold released",
                )
            return rows

        async def record_outcome(self, *args: Any, **kwargs: Any) -> Recorded:
            failed = args[2]
            if any(row.aggregateid == KEY for row, _ in failed):
                await snapshot_taken.wait()
            return await super().record_outcome(*args, **kwargs)

    async with running_relay(config, store_factory=SlowFetchAfterTheSnapshot) as running:
        running.signals.sent.enable()
        running.signals.recorded.enable()
        window = running.relay._window
        await wait_for_signal(
            running.signals.sent,
            where=lambda submission: any(row.aggregateid == KEY for row, _ in submission.failures),
            what="the key's first row refused before sending, and its key held",
        )
        # The key's next row, committed while its failure is not recorded yet.
        later_seq = await db.fetchval(INSERT_ROW, KEY, json.dumps(2), None)
        await wait_until(snapshot_taken.is_set, what="a fetch that saw the key free")
        # Two more fetches and nothing in flight: whatever that fetch handed on is recorded.
        await wait_until(
            lambda: len(fetches_after) >= 2 and window.empty(),
            what="two more fetches, and nothing in flight",
        )
    remaining = await db.fetch("SELECT seq, attempts FROM outbox ORDER BY seq")
    assert [r["seq"] for r in remaining] == [failed_seq, later_seq], (
        "the later row of a key whose earlier row failed was published first"
    )
    assert remaining[0]["attempts"] == 1
