"""The relay's hot path talks to PostgreSQL as little as it can.

Every statement the relay sends is a round trip to the server, and on a small machine
each costs the relay, the server and the scheduler far more than the statement itself,
mostly in writing to sockets. A fetch is one
statement and recording a published batch is one statement, including the end of its
transaction; the store keeps its connections between statements, and the relay's
sessions keep no state to reset when one goes back to the pool.

Statements are counted where the driver sends them (``Connection.execute`` without
arguments goes out as a simple query, everything else through ``_execute``), on the
relay's own pool and a real server.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest

from relay import sql
from relay.config import DEFAULT_TOPIC_TEMPLATE
from relay.outcome import PublishedGroup
from relay.store import RELAY_SESSION_SETTINGS, RelayStore, create_relay_pool
from tests.support.plans import (
    OUTBOX_STATISTICS,
    blocks_read,
    plan_nodes,
    stage_outbox_statistics,
)
from tests.support.waiting import wait_until

INSTANCE = "round-trip-test"
INSERT_ROW = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ('order', $1, 'created', $2::jsonb)
"""


@contextmanager
def counted_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement sent on any asyncpg connection while the block runs."""
    sent: list[str] = []
    execute, _execute = asyncpg.Connection.execute, asyncpg.Connection._execute

    async def counted_execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if not args:  # a simple query; with arguments it goes through _execute below
            sent.append(query)
        return await execute(self, query, *args, **kwargs)

    async def counted__execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(query)
        return await _execute(self, query, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(asyncpg.Connection, "execute", counted_execute)
        patch.setattr(asyncpg.Connection, "_execute", counted__execute)
        yield sent


async def _held_lanes(db: asyncpg.Connection) -> dict[int, int]:
    await db.execute(sql.HEARTBEAT, INSTANCE)
    rows = await db.fetch(sql.CLAIM_LANES, INSTANCE, 60_000, sql.LANE_COUNT)
    return {row["lane"]: row["fence"] for row in rows}


def _store(pool: asyncpg.Pool) -> RelayStore:
    return RelayStore(
        pool, instance_id=INSTANCE, topic_template=DEFAULT_TOPIC_TEMPLATE, fetch_max_bytes=1 << 20
    )


async def test_a_fetch_and_the_record_of_a_published_batch_are_one_statement_each(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(3):
        await db.execute(INSERT_ROW, f"k{n}", json.dumps(n))
    fences = await _held_lanes(db)
    pool = await create_relay_pool(database_url)
    store = _store(pool)
    try:
        await store.fetch_ready(list(range(sql.LANE_COUNT)), 0, 10)  # statements prepared
        with counted_statements(monkeypatch) as sent:
            rows = await store.fetch_ready(list(range(sql.LANE_COUNT)), 0, 10)
        assert len(rows) == 3
        assert len(sent) == 1, sent

        group = PublishedGroup("t", 0, 40, rows)
        with counted_statements(monkeypatch) as sent:
            recorded = await store.record_outcome(fences, [group], [], [], max_attempts=5)
        assert recorded.published == 3
        # The plain insert of the receipts, not the upsert (sql.RECORD_PUBLISHED).
        assert sent == [sql.RECORD_PUBLISHED], sent
    finally:
        await store.close()
        await pool.close()

    # The same bookkeeping as before: receipts at their offsets, progress counted.
    receipts = await db.fetch("SELECT kafka_offset FROM outbox_receipt ORDER BY kafka_offset")
    assert [r["kafka_offset"] for r in receipts] == [40, 41, 42]
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0
    published_total = await db.fetchval(
        "SELECT published_total FROM relay_instance WHERE instance_id = $1", INSTANCE
    )
    assert published_total == 3


async def test_an_event_published_before_gets_its_receipt_moved_to_the_new_offset(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receipt of the event is already there (it was published before, same id): the
    plain insert is refused as a whole and the upsert records the batch instead."""
    again = await db.fetchval(INSERT_ROW + "RETURNING id", "k-again", json.dumps(1))
    await db.execute(INSERT_ROW, "k-new", json.dumps(2))
    await db.execute(
        "INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic, "
        "kafka_partition, kafka_offset, created_at) "
        "VALUES ($1, 'order', 'k-again', 'created', 'old', 3, 7, now())",
        again,
    )
    fences = await _held_lanes(db)
    pool = await create_relay_pool(database_url)
    store = _store(pool)
    try:
        rows = await store.fetch_ready(list(range(sql.LANE_COUNT)), 0, 10)
        with counted_statements(monkeypatch) as sent:
            recorded = await store.record_outcome(
                fences, [PublishedGroup("t", 0, 40, rows)], [], [], max_attempts=5
            )
        assert recorded.published == 2
        assert sent == [sql.RECORD_PUBLISHED, sql.RECORD_REPUBLISHED], sent
    finally:
        await store.close()
        await pool.close()
    receipts = await db.fetch(
        "SELECT aggregateid, topic, kafka_partition, kafka_offset FROM outbox_receipt "
        "ORDER BY kafka_offset"
    )
    assert [tuple(r) for r in receipts] == [("k-again", "t", 0, 40), ("k-new", "t", 0, 41)]
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0
    published_total = await db.fetchval(
        "SELECT published_total FROM relay_instance WHERE instance_id = $1", INSTANCE
    )
    assert published_total == 2


async def test_the_bookkeeping_commit_setting_does_not_stay_on_the_pooled_connection(
    db: asyncpg.Connection, database_url: str
) -> None:
    """Its commit need not wait for the WAL flush (a lost mark only republishes), but the
    setting is local to its transaction: nothing else on that connection runs with it."""
    await db.execute(INSERT_ROW, "k", json.dumps(1))
    fences = await _held_lanes(db)
    pool = await create_relay_pool(database_url)
    store = _store(pool)
    try:
        rows = await store.fetch_ready(list(range(sql.LANE_COUNT)), 0, 10)
        group = PublishedGroup("t", 0, 0, rows)
        await store.record_outcome(fences, [group], [], [], max_attempts=5)
        # Every connection the pool can hand out, the one that recorded among them.
        await store.close()  # the store's kept connections back in the pool
        connections = [await pool.acquire() for _ in range(pool.get_max_size())]
        try:
            for conn in connections:
                assert await conn.fetchval("SHOW synchronous_commit") == "on"
        finally:
            for conn in connections:
                await pool.release(conn)
    finally:
        await store.close()
        await pool.close()


async def test_a_statement_is_planned_once_per_connection_not_on_every_call(
    db: asyncpg.Connection, database_url: str
) -> None:
    """At a low rate each batch is one event, and for a one-element array PostgreSQL
    prices a plan made for the values below the generic plan: left to choose, it planned
    the recording statement again on every call, its six CTEs each time, about as much
    server time as the statement's own work. The relay's sessions keep each statement's
    generic plan, made once per connection."""
    fences = await _held_lanes(db)
    pool = await create_relay_pool(database_url)
    store = _store(pool)
    try:
        for n in range(8):  # past the five calls PostgreSQL plans before choosing
            await db.execute(INSERT_ROW, f"one-{n}", json.dumps(n))
            rows = await store.fetch_ready(list(range(sql.LANE_COUNT)), 0, 10)
            assert len(rows) == 1
            # as the relay records a batch: under the fence of its own lane only
            fence = {rows[0].lane: fences[rows[0].lane]}
            group = PublishedGroup("t", 0, n, rows)
            recorded = await store.record_outcome(fence, [group], [], [], max_attempts=5)
            assert recorded.published == 1
        # Every connection the pool can hand out, those that ran the statements among them.
        await store.close()  # the store's kept connections back in the pool
        plans: dict[str, tuple[int, int]] = {}
        connections = [await pool.acquire() for _ in range(pool.get_max_size())]
        try:
            for conn in connections:
                for row in await conn.fetch(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
                ):
                    generic, custom = plans.get(row["statement"], (0, 0))
                    plans[row["statement"]] = (
                        generic + row["generic_plans"],
                        custom + row["custom_plans"],
                    )
        finally:
            for conn in connections:
                await pool.release(conn)
    finally:
        await store.close()
        await pool.close()
    assert plans[sql.RECORD_PUBLISHED] == (8, 0), plans[sql.RECORD_PUBLISHED]
    assert plans[sql.FETCH_READY] == (8, 0), plans[sql.FETCH_READY]
    assert not [s for s, (_, custom) in plans.items() if custom], plans


def _fetch_args(*, after: int, check_below: int) -> tuple[object, ...]:
    """FETCH_READY's parameters for a plan: every lane, a batch of 1,000, the default
    template, 5 MiB rows, an 8 MiB budget, nothing in flight."""
    return (None, after, 1000, DEFAULT_TOPIC_TEMPLATE, check_below, 5 << 20, 8 << 20, "{}")


@pytest.mark.parametrize("statistics", list(OUTBOX_STATISTICS), ids=list(OUTBOX_STATISTICS))
async def test_a_fetch_looks_up_held_rows_only_in_their_index_whatever_the_statistics(
    db: asyncpg.Connection, database_url: str, statistics: str
) -> None:
    """The relay deletes what it publishes, and a minute's ANALYZE of a heap it emptied
    makes every index of the outbox look alike. Whether an earlier held row holds a row
    back must stay a probe of outbox_held_topic_idx (empty while all is well): the unique
    index on seq answers ``h.seq < o.seq`` too, by reading every entry below the row."""
    await stage_outbox_statistics(db, *OUTBOX_STATISTICS[statistics])
    start = int(await db.fetchval("SELECT coalesce(max(seq), 0) FROM outbox")) - 2
    conn = await asyncpg.connect(database_url, server_settings=RELAY_SESSION_SETTINGS)
    try:
        explain = await conn.prepare("EXPLAIN (FORMAT JSON) " + sql.FETCH_READY)
        for after, check_below in ((0, 0), (start, start)):  # a pass's fetch, a cursor fetch
            (plan,) = json.loads(
                await explain.fetchval(*_fetch_args(after=after, check_below=check_below))
            )
            held = [
                node.get("Index Name", node["Node Type"])
                for node in plan_nodes(plan["Plan"])
                if node.get("Relation Name") == "outbox" and node["Alias"] == "h"
            ]
            assert held and set(held) == {"outbox_held_topic_idx"}, (statistics, after, held)
    finally:
        await conn.close()


def _text_of(node: dict[str, Any]) -> str:
    """What a node computes and tests, as EXPLAIN VERBOSE prints it."""
    parts = [*node.get("Output", []), node.get("Filter", ""), node.get("Index Cond", "")]
    return " ".join(str(part) for part in parts)


async def test_a_fetch_reads_stored_sizes_prints_only_what_it_sends_and_probes_holds_once(
    database_url: str,
) -> None:
    """The generic plan of a fetch (a pass's and a cursor fetch: one statement): each row's
    size is read from the column the door filled, nothing is printed beneath the node
    above the byte budget's filter (so no row the budget leaves out is printed), whether a
    held row holds it back is one probe of outbox_held_topic_idx, and nothing sorts."""
    conn = await asyncpg.connect(
        database_url,
        server_settings=RELAY_SESSION_SETTINGS,
    )
    try:
        explain = await conn.prepare("EXPLAIN (VERBOSE, COSTS OFF, FORMAT JSON) " + sql.FETCH_READY)
        for check_below in (0, 7):
            (plan,) = json.loads(
                await explain.fetchval(*_fetch_args(after=0, check_below=check_below))
            )
            top = plan["Plan"]
            nodes = plan_nodes(top)
            assert not [n for n in nodes if n["Node Type"] == "Sort"], plan  # the index's order
            (window,) = [n for n in nodes if n["Node Type"] == "WindowAgg"]
            (beneath,) = window["Plans"]
            outputs = [" ".join(n.get("Output", [])) for n in plan_nodes(beneath)]
            assert any("o.size_bytes" in output for output in outputs), outputs
            printing = [n for n in nodes if re.search(r"\((?:\w+\.)?payload\)::text", _text_of(n))]
            assert printing == [top], [n["Node Type"] for n in printing]
            assert "fetched_bytes" in top.get("Filter", ""), top  # the budget, filtered there
            probes = [n for n in nodes if n.get("Index Name") == "outbox_held_topic_idx"]
            # one on the row's topic, one on '*' (held everywhere), each a probe per row
            assert len(probes) == 2, plan
            for probe in probes:
                assert probe["Parent Relationship"] == "SubPlan", probe
                assert probe["Node Type"] == "Index Scan", probe
                condition = probe["Index Cond"]
                assert "hashtextextended" in condition and "held_topic =" in condition, probe
                # the seqs are compared by function (a filter on the key's few held rows):
                # an operator would let the unique index on seq serve the look-up
                assert "seq <" not in condition and "int8lt" in probe["Filter"], probe
            assert not [n for n in nodes if n.get("Index Name") == "outbox_held_key_idx"], plan
    finally:
        await conn.close()


async def test_the_hot_path_keeps_its_connections_instead_of_a_checkout_per_statement(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 1,000 events/s asyncpg's pool checkout (a timeout, and a shielded task per
    release) cost the relay about 5 % of its CPU: a fetch and a recording every two or
    three events each took one. The store keeps its connections between statements."""
    fences = await _held_lanes(db)
    pool = await create_relay_pool(database_url)
    store = _store(pool)
    checkouts: list[object] = []
    acquire = asyncpg.pool.Pool.acquire

    def counted_acquire(self: asyncpg.Pool, *args: Any, **kwargs: Any) -> Any:
        checkouts.append(self)
        return acquire(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.pool.Pool, "acquire", counted_acquire)
    try:
        for n in range(5):
            await db.execute(INSERT_ROW, f"kept-{n}", json.dumps(n))
            rows = await store.fetch_ready(list(range(sql.LANE_COUNT)), 0, 10)
            group = PublishedGroup("t", 0, n, rows)
            assert (await store.record_outcome(fences, [group], [], [], max_attempts=5)).published
        assert len(checkouts) == 1, f"{len(checkouts)} checkouts for 10 statements"
    finally:
        await store.close()
        await pool.close()  # returns: nothing is still kept


async def test_a_kept_connection_the_server_closed_or_a_failed_statement_left_is_not_used(
    db: asyncpg.Connection, database_url: str
) -> None:
    """A connection closed while it was kept (its backend terminated) is given back to the
    pool, which opens a fresh one, as its own checkout would: the next statement does not
    fail on it. One whose statement failed is thrown away (its backend ends), not kept."""
    await db.execute(INSERT_ROW, "k", json.dumps(1))
    pool = await create_relay_pool(database_url, statement_timeout_ms=300)
    store = _store(pool)
    lanes = list(range(sql.LANE_COUNT))
    relay_backends = (
        "SELECT pid FROM pg_stat_activity "
        "WHERE application_name = 'outbox-relay' AND datname = current_database()"
    )
    try:
        assert len(await store.fetch_ready(lanes, 0, 10)) == 1
        kept = {r["pid"] for r in await db.fetch(relay_backends)}
        await db.execute(f"SELECT pg_terminate_backend(pid) FROM ({relay_backends}) AS r")
        await wait_until(
            lambda: _gone(db, relay_backends, kept, every=True), what="the relay's backends"
        )
        await asyncio.sleep(0.2)  # the client reads the end of its connections
        assert len(await store.fetch_ready(lanes, 0, 10)) == 1

        async with db.transaction():
            await db.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
            blocked = {r["pid"] for r in await db.fetch(relay_backends)}
            with pytest.raises(asyncpg.QueryCanceledError):
                await store.fetch_ready(lanes, 0, 10)  # waits for the lock past its timeout
        await wait_until(
            lambda: _gone(db, relay_backends, blocked), what="the failed connection's backend"
        )
        assert len(await store.fetch_ready(lanes, 0, 10)) == 1
    finally:
        await store.close()
        await pool.close()


async def _gone(
    db: asyncpg.Connection, backends: str, pids: set[int], *, every: bool = False
) -> bool:
    """True once one of ``pids`` (``every``: each of them) no longer runs."""
    ended = pids - {r["pid"] for r in await db.fetch(backends)}
    return ended == pids if every else bool(ended)


async def test_a_prune_round_reads_what_it_deletes_and_stops_at_the_retention_bound(
    db: asyncpg.Connection, database_url: str
) -> None:
    """After a catch-up the receipts table holds the burst's receipts, inside their
    retention, beside the few older ones each prune round deletes. The round read the
    whole primary key to join the batch it picked (about 72,000 blocks and 50 to 70 ms a
    round for 124,000 receipts), and picked it by a bound on a volatile clock, which no
    index can take: once fewer than a batch were old enough it read every receipt of the
    window too. A round now costs what it deletes."""
    await db.execute(
        """INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic,
               kafka_partition, kafka_offset, created_at, published_at)
           SELECT gen_random_uuid(), 'order', 'k' || g, 'created', 'outbox.order', 0, g,
                  now(), now() - CASE WHEN g <= 5000 THEN interval '2 hours' ELSE '0' END
           FROM generate_series(1, 65000) AS g"""
    )
    await db.execute("VACUUM ANALYZE outbox_receipt")
    conn = await asyncpg.connect(database_url, server_settings=RELAY_SESSION_SETTINGS)
    try:
        explain = await conn.prepare(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.PRUNE_RECEIPTS
        )
        blocks = []
        for _ in range(2):  # a full batch of old receipts, then none old enough
            (plan,) = json.loads(await explain.fetchval(3_600_000, 5_000))
            blocks.append(blocks_read(plan["Plan"]))
    finally:
        await conn.close()
    assert await db.fetchval("SELECT count(*) FROM outbox_receipt") == 60_000
    assert blocks[0] < 3 * 5_000, blocks  # a heap visit or two per receipt deleted
    assert blocks[1] < 100, blocks
