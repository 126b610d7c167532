"""Checked at the door: a row that can never be a record is refused when it is inserted, by
every role, and the relay's fetch reads the size the door stored; rows stored before the
door, many held topics of one key and a row whose topic can never be valid cannot stop,
bloat or slow it. Real PostgreSQL (each server of the run) and the real broker.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from contracts.limits import (
    MAX_AGGREGATEID_BYTES,
    MAX_AGGREGATETYPE_BYTES,
    MAX_HEADER_SET_BYTES,
    MAX_PAYLOAD_TEXT_BYTES,
    MAX_TOPIC_BYTES,
    MAX_TYPE_BYTES,
)
from relay.records import OutboxRow
from relay.store import RelayStore
from tests.support.faultproxy import proxied_database_url
from tests.support.kafka import read_topic
from tests.support.relay import fast_config, running_relay
from tests.support.roles import create_login_role, drop_role, grant
from tests.support.schema import BEFORE_THE_DOOR, migrate_the_rest, migrate_up_to
from tests.support.waiting import wait_until

ROLES = ("event-writer", "writer", "owner")

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic, headers)
VALUES ($1, $2, 'changed', $3::jsonb, $4, $5::jsonb)
"""
# jsonb keeps 1e131071 in a few bytes and prints it as 131,072 digits: 8,200 of them are
# about 2 kB stored and more than 1 GiB printed.
HUGE_NUMBERS = "[" + ",".join(["1e131071"] * 8_200) + "]"
STATE = "SELECT last_error_class, quarantined_at IS NOT NULL FROM outbox WHERE aggregateid = $1"
RECEIPTS = "SELECT count(*) FROM outbox_receipt WHERE aggregateid = ANY($1::text[])"


@pytest_asyncio.fixture(params=ROLES)
async def inserter(
    request: pytest.FixtureRequest, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the role that inserts: an application's event writer, the scoring
    writer's part, or the table's owner."""
    part: str = request.param
    if part == "owner":
        conn = await asyncpg.connect(database_url)
        try:
            yield conn
        finally:
            await conn.close()
        return
    role = await create_login_role(db, database_url, part.replace("-", "_"))
    try:
        await grant(database_url, role.name, part)
        conn = await asyncpg.connect(role.url)
        try:
            yield conn
        finally:
            await conn.close()
    finally:
        await drop_role(db, role.name)


async def _insert(
    conn: asyncpg.Connection,
    key: str,
    *,
    aggregatetype: str = "order",
    payload: str | None = None,
    topic: str | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    await conn.execute(
        INSERT,
        aggregatetype,
        key,
        payload if payload is not None else json.dumps({"k": key}),
        topic,
        json.dumps(headers) if headers is not None else None,
    )


async def _published(db: asyncpg.Connection, keys: list[str]) -> bool:
    return int(await db.fetchval(RECEIPTS, keys)) == len(keys)


# -- refused at the door -------------------------------------------------------------------------
# (what, SQL building the row on the server, the column the refusal names)
_BUILT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic, headers, tenant_ref)
SELECT {aggregatetype}, {aggregateid}, {type}, {payload}, {topic}, {headers}, {tenant_ref}
"""
_ROW = {
    "aggregatetype": "'order'",
    "aggregateid": "'k-1'",
    "type": "'changed'",
    "payload": "'{}'::jsonb",
    "topic": "NULL",
    "headers": "NULL",
    "tenant_ref": "NULL",
}
REFUSED = [
    ("numbers printing over 1 GiB", {"payload": f"'{HUGE_NUMBERS}'::jsonb"}, "payload"),
    ("a number of 1,001 digits", {"payload": "'{\"n\": 1e1000}'::jsonb"}, "payload"),
    ("a number 1,001 digits below 1", {"payload": "'[-1e-1001]'::jsonb"}, "payload"),
    (
        "numbers whose scale the server set",  # 0.1 printed with 16,383 decimals, 2,000 times
        {"payload": "(SELECT jsonb_agg(0.1 + 0e-16383) FROM generate_series(1, 2000))"},
        "payload",
    ),
    (
        "a payload printing over the limit",
        {"payload": f"jsonb_build_object('pad', repeat('x', {MAX_PAYLOAD_TEXT_BYTES}))"},
        "payload",
    ),
    ("a key the server built", {"aggregateid": "'g' || repeat('k', 5242000)"}, "aggregateid"),
    (
        "a key over the limit",
        {"aggregateid": f"repeat('k', {MAX_AGGREGATEID_BYTES + 1})"},
        "aggregateid",
    ),
    (
        "a key of multibyte characters",
        {"aggregateid": f"repeat('é', {MAX_AGGREGATEID_BYTES // 2 + 1})"},
        "aggregateid",
    ),
    (
        "an aggregatetype over the limit",
        {"aggregatetype": f"repeat('a', {MAX_AGGREGATETYPE_BYTES + 1})"},
        "aggregatetype",
    ),
    ("a type over the limit", {"type": f"repeat('t', {MAX_TYPE_BYTES + 1})"}, "type"),
    ("a topic over the limit", {"topic": f"repeat('p', {MAX_TOPIC_BYTES + 1})"}, "topic"),
    (
        "headers over the limit",
        {"headers": f"jsonb_build_object('h', repeat('v', {MAX_HEADER_SET_BYTES}))"},
        "headers",
    ),
    (
        "header columns over the limit together",
        {
            "headers": f"jsonb_build_object('h', repeat('v', {MAX_HEADER_SET_BYTES // 2}))",
            "tenant_ref": f"repeat('t', {MAX_HEADER_SET_BYTES // 2})",
        },
        "headers",
    ),
]
ACCEPTED = [
    ("a number of 1,000 digits", {"payload": "'[9e999, -1e-999, 1.7976931348623157e308]'::jsonb"}),
    (
        "a payload printing at the limit",
        # {"pad": "xx…"} prints 11 bytes around the string
        {"payload": f"jsonb_build_object('pad', repeat('x', {MAX_PAYLOAD_TEXT_BYTES - 11}))"},
    ),
    ("a key at the limit", {"aggregateid": f"repeat('k', {MAX_AGGREGATEID_BYTES})"}),
    ("an aggregatetype at the limit", {"aggregatetype": f"repeat('a', {MAX_AGGREGATETYPE_BYTES})"}),
    ("a type at the limit", {"type": f"repeat('t', {MAX_TYPE_BYTES})"}),
    ("a topic at the limit", {"topic": f"repeat('p', {MAX_TOPIC_BYTES})"}),
    (
        "headers at the limit",
        # {"h": "vv…"} prints 9 bytes around the value
        {"headers": f"jsonb_build_object('h', repeat('v', {MAX_HEADER_SET_BYTES - 9}))"},
    ),
]


def _built(**columns: str) -> str:
    return _BUILT.format(**{**_ROW, **columns})


async def test_a_row_that_can_never_be_a_record_is_refused_at_insert_by_every_role(
    inserter: asyncpg.Connection,
) -> None:
    """Each refusal is an error the writer sees (program_limit_exceeded), naming the
    column; the same rows a byte inside the limits are taken."""
    refused: dict[str, tuple[str | None, bool]] = {}
    for what, columns, _ in REFUSED:
        try:
            await inserter.execute(_built(**columns))
        except asyncpg.ProgramLimitExceededError as exc:
            refused[what] = (exc.column_name, "limit" in exc.message)
    assert refused == {what: (column, True) for what, _, column in REFUSED}
    for _, columns in ACCEPTED:
        await inserter.execute(_built(**columns))


async def test_the_size_a_row_is_stored_with_is_what_the_fetch_transfers(
    db: asyncpg.Connection,
) -> None:
    """Every text column the relay fetches, as the server sends it; a writer cannot set
    it, and an operator's update of a measured column measures again."""
    await db.execute(
        """
        INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic, headers,
                            tenant_ref, schema_version, correlation_ref, causation_ref,
                            traceparent, tracestate, size_bytes)
        VALUES ('order', 'k-é', 'changed', '{"n": 1.50, "s": "\\u0001é"}', 'orders',
                '{"h": "v"}', 't', '1', 'c', 'd',
                '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'v=1', 1)
        """
    )
    sent = """
    SELECT octet_length(id::text) + octet_length(aggregatetype) + octet_length(aggregateid)
           + octet_length(type) + coalesce(octet_length(payload::text), 0)
           + coalesce(octet_length(headers::text), 0) + coalesce(octet_length(topic), 0)
           + coalesce(octet_length(tenant_ref), 0) + coalesce(octet_length(schema_version), 0)
           + coalesce(octet_length(correlation_ref), 0) + coalesce(octet_length(causation_ref), 0)
           + coalesce(octet_length(traceparent), 0) + coalesce(octet_length(tracestate), 0)
    FROM outbox
    """
    stored = await db.fetchval("SELECT size_bytes FROM outbox")
    assert stored == await db.fetchval(sent)
    await db.execute("UPDATE outbox SET payload = '{\"n\": [1, 2, 3]}'")
    assert await db.fetchval("SELECT size_bytes FROM outbox") == await db.fetchval(sent)
    with pytest.raises(asyncpg.ProgramLimitExceededError):
        await db.execute(f"UPDATE outbox SET payload = '{HUGE_NUMBERS}'::jsonb")


# -- rows stored before the door ---------------------------------------------------------------------
@pytest_asyncio.fixture
async def before_the_door(empty_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A database migrated up to the last migration before the door."""
    conn = await asyncpg.connect(empty_database_url)
    try:
        await migrate_up_to(conn, BEFORE_THE_DOOR)
        yield conn
    finally:
        await conn.close()


async def test_rows_stored_before_the_door_cannot_stop_or_bloat_the_relay(
    before_the_door: asyncpg.Connection,
    empty_database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    """Stored before the door: a row of numbers that print to more than 1 GiB (every fetch
    that printed it failed after seconds, and the row was never quarantined) and 40 rows
    whose 5 MB keys the server built (one fetch moved 200 MiB under an 8 MiB budget). The
    relay measures them once, quarantines them as too large without transferring them,
    and publishes the rest."""
    db = before_the_door
    await _insert(db, "huge-numbers", payload=HUGE_NUMBERS)
    await db.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
        "SELECT 'order', g || repeat('k', 5242000), 'changed', '{}' FROM generate_series(1, 40) g"
    )
    await migrate_the_rest(db)
    healthy = [f"healthy-{n}" for n in range(20)]
    for key in healthy:
        await _insert(db, key)
    with proxied_database_url(empty_database_url) as (proxied, proxy):
        config = fast_config(proxied, kafka_bootstrap, topic_namespace)
        async with running_relay(config):
            await wait_until(lambda: _published(db, healthy), what="healthy rows published")
            await wait_until(
                lambda: db.fetchval(
                    "SELECT count(*) = 41 FROM outbox WHERE quarantined_at IS NOT NULL"
                ),
                what="the 41 rows quarantined",
            )
        received = proxy.counters().forwarded_down
    causes = await db.fetch("SELECT DISTINCT last_error_class FROM outbox")
    assert [r[0] for r in causes] == ["too_large"]
    assert received < 16 * 1024 * 1024, received  # 200 MiB of keys crossed before


# -- a key's held topics --------------------------------------------------------------------------
async def test_a_row_whose_topic_can_never_be_valid_holds_nothing_else(
    inserter: asyncpg.Connection,
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    """Writer A's rows can go nowhere ('x y' makes no topic name, nor does its own topic);
    writer B's rows of the same keys on valid topics are published."""
    await _insert(inserter, "456", aggregatetype="x y")
    await _insert(inserter, "123", aggregatetype="attacker", topic="bad topic")
    await _insert(inserter, "456", aggregatetype="customer")
    await _insert(inserter, "123", aggregatetype="order")
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, max_attempts=1)
    async with running_relay(config):
        await wait_until(lambda: _published(db, ["456", "123"]), what="B's rows published")
    causes = await db.fetch("SELECT last_error_class, quarantined_at IS NOT NULL FROM outbox")
    assert sorted(tuple(r) for r in causes) == [("invalid_topic", True)] * 2


async def test_many_held_topics_of_one_key_do_not_slow_its_fetches(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """5,000 rows of one key, each routed to its own topic outside --allowed-topics, each
    quarantined at once and holding the key on its own topic: before, each fetch tested
    every row of the key against every held one (69 quarantined in 120 s)."""
    await db.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic) "
        "SELECT 'order', 'K', 'changed', '{}', $1 || g FROM generate_series(1, 5000) g",
        f"{topic_namespace}-denied-",
    )
    healthy = [f"healthy-{n}" for n in range(20)]
    for key in healthy:
        await _insert(db, key)
    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        allowed_topics=re.escape(topic_namespace) + r"\..*",
    )
    async with running_relay(config):
        await wait_until(lambda: _published(db, healthy), what="the other keys published")
        await wait_until(
            lambda: db.fetchval(
                "SELECT count(*) = 5000 FROM outbox "
                "WHERE quarantined_at IS NOT NULL AND last_error_class = 'topic_not_allowed'"
            ),
            what="the 5,000 rows quarantined",
            timeout=60,
        )
    # The key's rows on allowed topics are not held by the quarantined ones.
    await _insert(db, "K")
    async with running_relay(config):
        await wait_until(lambda: _published(db, ["K"]), what="K on an allowed topic")
    records = await read_topic(kafka_bootstrap, f"{topic_namespace}.order", count=21)
    assert sorted(r.key for r in records) == sorted([b"K", *(k.encode() for k in healthy)])


# -- no content can stop a fetch ---------------------------------------------------------------------
def _failing_store(fails: Callable[[list[int]], BaseException | None]) -> type[RelayStore]:
    """The relay's store, whose fetches fail as ``fails`` says for the seqs they would read
    (a damaged value, a statement timeout), as the server would fail them."""

    class Failing(RelayStore):
        async def fetch_ready(
            self, lanes: Any, cursor: int, limit: int, **kwargs: Any
        ) -> list[OutboxRow]:
            rows = await super().fetch_ready(lanes, cursor, limit, **kwargs)
            error = fails([row.seq for row in rows])
            if error is not None:
                raise error
            return rows

    return Failing


async def test_a_row_whose_fetch_fails_on_its_own_is_quarantined_and_the_rest_published(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """Every fetch that reads one row fails (XX001, as a damaged value fails): before, it
    was retried for ever and nothing after it was published."""
    keys = [f"k-{n}" for n in range(30)]
    for key in keys:
        await _insert(db, key)
    damaged = await db.fetchval("SELECT seq FROM outbox WHERE aggregateid = 'k-16'")

    def fails(seqs: list[int]) -> BaseException | None:
        return asyncpg.DataCorruptedError("damaged") if damaged in seqs else None

    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    async with running_relay(config, store_factory=_failing_store(fails)) as running:
        healthy = [key for key in keys if key != "k-16"]
        await wait_until(lambda: _published(db, healthy), what="the other rows published")
        await wait_until(
            lambda: db.fetchval(
                "SELECT quarantined_at IS NOT NULL FROM outbox WHERE seq = $1", damaged
            ),
            what="the damaged row quarantined",
        )
        assert running.metric("outbox_relay_quarantined_events_total") == 1
    assert tuple(await db.fetchrow(STATE, "k-16")) == ("unfetchable", True)


async def test_fetches_that_fail_for_load_quarantine_nothing(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """Every fetch times out for a while (the server is overloaded, not a row): narrowing
    finds no row that fails on its own, nothing is quarantined, and all is published once
    the fetches succeed again."""
    keys = [f"k-{n}" for n in range(30)]
    for key in keys:
        await _insert(db, key)
    overloaded = asyncio.Event()
    failed_fetches = 0

    def fails(seqs: list[int]) -> BaseException | None:
        nonlocal failed_fetches
        if overloaded.is_set():
            return None
        failed_fetches += 1
        return asyncpg.QueryCanceledError("canceling statement due to statement timeout")

    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    async with running_relay(config, store_factory=_failing_store(fails)):
        await wait_until(lambda: failed_fetches >= 40, what="forty failed fetches")
        overloaded.set()
        await wait_until(lambda: _published(db, keys), what="every row published")
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE quarantined_at IS NOT NULL") == 0
