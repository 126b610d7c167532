"""A light-load fetch starts from where the last one stopped, never delaying a late commit.

seq is taken at INSERT, not at COMMIT: with concurrent writers a transaction can commit a
row below seqs the relay has already read. The trigger's notification names the lowest and
highest seq each inserting statement wrote (migration 0004); the relay reads from its
cursor, goes back below the lowest seq notified, and sends only rows it has heard of
(docs/relay.md, "Fetching: passes and the key hold"). The poll interval is a minute in
these tests, so only notifications can deliver the late rows in time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from relay.passes import HINTS_PER_POLL
from relay.records import OutboxRow
from relay.store import RelayStore
from tests.support.relay import RunningRelay, fast_config, running_relay
from tests.support.waiting import wait_until

_LONG_POLL_MS = 60_000
_PROMPTLY_S = 30  # generous on a busy machine, and still half the poll interval

INSERT_ROW = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ('order', $1, 'changed', $2::jsonb) RETURNING seq, id::text
"""
PUBLISHED_COUNT = "SELECT count(*) FROM outbox_receipt WHERE id = ANY($1::uuid[])"
PUBLISHED = "SELECT id::text, kafka_partition, kafka_offset FROM outbox_receipt WHERE id = ANY($1)"


async def _insert(conn: asyncpg.Connection, key: str, n: int) -> asyncpg.Record:
    row = await conn.fetchrow(INSERT_ROW, key, json.dumps(n))
    assert row is not None
    return row


async def _all_published(db: asyncpg.Connection, ids: list[str], timeout: float) -> None:
    await wait_until(
        lambda: _count_published(db, ids),
        timeout=timeout,
        interval=0.02,
        what="the events published",
    )


async def _count_published(db: asyncpg.Connection, ids: list[str]) -> bool:
    return bool(await db.fetchval(PUBLISHED_COUNT, ids) == len(ids))


async def _published_order(db: asyncpg.Connection, ids: list[str]) -> list[str]:
    rows = await db.fetch(PUBLISHED, ids)
    assert len({r["kafka_partition"] for r in rows}) == 1  # one key, one partition
    return [r["id"] for r in sorted(rows, key=lambda r: r["kafka_offset"])]


async def _settled(running: RunningRelay, db: asyncpg.Connection) -> str:
    """Every lane held and one event published: the relay is past its first full pass."""
    await running.holds_every_lane(timeout=_PROMPTLY_S)
    warm = await _insert(db, "k-warm", 0)
    await _all_published(db, [warm["id"]], _PROMPTLY_S)
    return str(warm["id"])


async def test_a_late_commit_below_the_cursor_is_published_before_the_poll_and_in_key_order(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=_LONG_POLL_MS
    )
    late = await asyncpg.connect(database_url)
    try:
        async with running_relay(config) as running:
            await _settled(running, db)
            # The late row takes its seq first; a row after it commits and is published,
            # so the relay's cursor is past the late row when it commits.
            late_tx = late.transaction()
            await late_tx.start()
            late_row = await _insert(late, "k-late", 1)
            passed = await _insert(db, "k-other", 1)
            await _all_published(db, [passed["id"]], _PROMPTLY_S)
            assert passed["seq"] > late_row["seq"]
            await late_tx.commit()
            # The key's next row, committed after the late one: it must not overtake it.
            following = await _insert(db, "k-late", 2)
            ids = [late_row["id"], following["id"]]
            await _all_published(db, ids, _PROMPTLY_S)
    finally:
        await late.close()
    assert await _published_order(db, ids) == ids, "a key's rows reached Kafka out of order"


async def test_every_late_commit_just_below_the_cursor_is_published_before_the_poll(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """Concurrent writers commit late all the time (a row's seq is drawn at INSERT): more
    late commits within one poll interval than the hint budget allows for notifications
    from far below the cursor are all read at once, each a few seqs below it. With every
    start below the cursor budgeted, the third waited for the poll (p99.9 575 ms at 1,000
    events/s in `make bench`, against 7.6 before notifications became hints)."""
    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=_LONG_POLL_MS
    )
    late = await asyncpg.connect(database_url)
    late_ids: list[str] = []
    try:
        async with running_relay(config) as running:
            await _settled(running, db)
            for n in range(HINTS_PER_POLL + 2):
                late_tx = late.transaction()
                await late_tx.start()
                late_row = await _insert(late, f"k-late-{n}", 1)
                passed = await _insert(db, f"k-other-{n}", 1)
                await _all_published(db, [passed["id"]], _PROMPTLY_S)
                await late_tx.commit()
                late_ids.append(late_row["id"])
                await _all_published(db, late_ids, _PROMPTLY_S)
    finally:
        await late.close()


async def test_a_light_load_fetch_starts_from_the_cursor_not_the_beginning(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    starts: list[int] = []

    class RecordingStarts(RelayStore):
        async def fetch_ready(
            self, lanes: Any, cursor: int, limit: int, **kwargs: Any
        ) -> list[OutboxRow]:
            starts.append(cursor)
            return await super().fetch_ready(lanes, cursor, limit, **kwargs)

    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=_LONG_POLL_MS
    )
    async with running_relay(config, store_factory=RecordingStarts) as running:
        await _settled(running, db)
        first = await _insert(db, "k-light", 0)
        await _all_published(db, [first["id"]], _PROMPTLY_S)
        starts.clear()
        # One event at a time, as at light load: each is fetched on its notification.
        for n in range(1, 6):
            row = await _insert(db, f"k-light-{n}", n)
            await _all_published(db, [row["id"]], _PROMPTLY_S)
    assert starts, "no fetch ran"
    # Every fetch started at or past a row already published, never from seq 0: the
    # index entries of the rows published before are not walked again.
    assert min(starts) >= first["seq"], f"fetches started at {starts}"


def _counts_empty_fetches(empty: list[int]) -> type[RelayStore]:
    """The relay's store, noting in ``empty`` where each fetch that read nothing started."""

    class CountsEmptyFetches(RelayStore):
        async def fetch_ready(
            self, lanes: Any, cursor: int, limit: int, **kwargs: Any
        ) -> list[OutboxRow]:
            rows = await super().fetch_ready(lanes, cursor, limit, **kwargs)
            if not rows:
                empty.append(cursor)
            return rows

    return CountsEmptyFetches


async def test_a_notification_of_a_row_a_fetch_has_read_brings_no_fetch(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """Under load a fetch often reads a row before the row's notification arrives: its
    statement began after the commit, the notification came after the fetch had begun.
    That notification asks for nothing more. It used to bring a fetch that read nothing,
    and then the quiet after an empty fetch (QUIET_MS) held back whatever committed next:
    in `make bench` at 1,000 events/s, runs of events each waited 10 ms, the run's p99.
    A notification of a row the relay has not read still brings its fetch."""
    empty: list[int] = []
    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=_LONG_POLL_MS
    )
    async with running_relay(config, store_factory=_counts_empty_fetches(empty)) as running:
        await _settled(running, db)
        read = await _insert(db, "k-read", 1)
        await _all_published(db, [read["id"]], _PROMPTLY_S)
        empty.clear()
        # The row's notification once more, as it arrives when a fetch read the row first.
        seq = read["seq"]
        await db.execute("SELECT pg_notify('outbox_relay', $1)", f"{seq},{seq}")
        await asyncio.sleep(0.5)  # a notification that asks for a fetch gets it at once
        assert empty == [], f"empty fetches from {empty} after a notification of seq {seq}"
        # The poll is a minute away: only its notification brings the next row in time.
        following = await _insert(db, "k-read", 2)
        await _all_published(db, [following["id"]], _PROMPTLY_S)
    assert await _published_order(db, [read["id"], following["id"]]) == [
        read["id"],
        following["id"],
    ]


async def test_a_notification_taken_by_a_fetch_waiting_for_a_slot_brings_no_more_fetches(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """A fetch decided on news waits for an in-flight slot; a notification that comes
    meanwhile is answered by that fetch. Its wake-up used to stay set, and brought one
    more fetch, which read nothing (and then the quiet after it)."""
    empty: list[int] = []
    recording = asyncio.Event()
    release = asyncio.Event()

    class SlowFirstRecord(_counts_empty_fetches(empty)):  # type: ignore[misc]
        async def record_outcome(self, fences: Any, published: Any, *args: Any, **kw: Any) -> Any:
            if any(row.aggregateid == "k-slot" for group in published for row in group.rows):
                recording.set()
                await release.wait()
            return await super().record_outcome(fences, published, *args, **kw)

    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        poll_interval_ms=_LONG_POLL_MS,
        max_in_flight_batches=1,
    )
    async with running_relay(config, store_factory=SlowFirstRecord) as running:
        await _settled(running, db)
        empty.clear()
        first = await _insert(db, "k-slot", 1)
        await asyncio.wait_for(recording.wait(), _PROMPTLY_S)  # its slot stays taken
        second = await _insert(db, "k-waits", 1)  # its fetch waits for the slot
        await asyncio.sleep(0.3)
        third = await _insert(db, "k-meanwhile", 1)  # notified while that fetch waits
        release.set()
        ids = [first["id"], second["id"], third["id"]]
        await _all_published(db, ids, _PROMPTLY_S)
        await asyncio.sleep(0.5)  # a fetch asked for comes at once
        assert empty == [], f"empty fetches from {empty}"


async def test_a_fetch_that_starts_above_a_commit_it_has_not_heard_of_keeps_key_order(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    """The race a notified seq alone would lose: a late row and its key's next row both
    commit after the relay chose where its fetch starts (above the late row), and before
    the fetch's statement takes its snapshot. The fetch sees the next row; it must not
    send it before the late row."""
    late = await asyncpg.connect(database_url)
    successor = await asyncpg.connect(database_url)
    staged = asyncio.Event()
    armed_above = 0
    ids: list[str] = []
    late_tx = late.transaction()

    class CommitBehindTheStart(RelayStore):
        async def fetch_ready(
            self, lanes: Any, cursor: int, limit: int, **kwargs: Any
        ) -> list[OutboxRow]:
            if armed_above and cursor >= armed_above and not staged.is_set():
                staged.set()
                await late_tx.commit()
                ids.append((await _insert(successor, "k-race", 2))["id"])
            return await super().fetch_ready(lanes, cursor, limit, **kwargs)

    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=_LONG_POLL_MS
    )
    try:
        async with running_relay(config, store_factory=CommitBehindTheStart) as running:
            await _settled(running, db)
            await late_tx.start()
            late_row = await _insert(late, "k-race", 1)
            ids.insert(0, late_row["id"])
            passed = await _insert(db, "k-passed", 1)
            await _all_published(db, [passed["id"]], _PROMPTLY_S)
            # The next fetch starts at or past `passed`, above the late row.
            armed_above = passed["seq"]
            wake = await _insert(db, "k-wake", 1)
            await _all_published(db, [wake["id"]], _PROMPTLY_S)
            assert staged.is_set(), "the staged fetch never ran: the scenario did not happen"
            await _all_published(db, ids, _PROMPTLY_S)
    finally:
        await late.close()
        await successor.close()
    assert await _published_order(db, ids) == ids, "a key's rows reached Kafka out of order"


async def test_a_notification_without_seqs_brings_a_full_pass(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """A redrive, or a trigger from before the seq payload, wakes the relay with nothing
    to go by: the rows it announces are found by a full pass, not a poll interval later."""
    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=_LONG_POLL_MS
    )
    async with running_relay(config) as running:
        await _settled(running, db)
        # Committed without its notification, as under the trigger before migration 0004
        # (whose notification said nothing), then announced by an empty one.
        await db.execute("ALTER TABLE outbox DISABLE TRIGGER outbox_relay_notify")
        try:
            silent = await _insert(db, "k-silent", 1)
        finally:
            await db.execute("ALTER TABLE outbox ENABLE TRIGGER outbox_relay_notify")
        await db.execute("SELECT pg_notify('outbox_relay', '')")
        await _all_published(db, [silent["id"]], _PROMPTLY_S)
