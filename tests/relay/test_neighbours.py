"""What other applications, roles and rows sharing the database can do to the relay, against
the real PostgreSQL and broker: every row the schema accepts is published or quarantined
with a cause, a held row holds only its key on its topic, and a notification is a hint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from relay.passes import QUIET_MS
from relay.records import MAX_RECORD_BYTES
from relay.store import RelayStore
from tests.support.faultproxy import FaultProxy, proxied_database_url
from tests.support.kafka import read_topic as consume
from tests.support.relay import fast_config, running_relay
from tests.support.roles import create_login_role, drop_role, grant
from tests.support.schema import BEFORE_THE_DOOR, migrate_the_rest, migrate_up_to
from tests.support.waiting import wait_until

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic, headers)
VALUES ($1, $2, 'changed', $3::jsonb, $4, $5::jsonb)
RETURNING id, seq
"""
RECEIPTS = "SELECT count(*) FROM outbox_receipt WHERE id = ANY($1::uuid[])"
STATE = "SELECT attempts, last_error_class, quarantined_at IS NOT NULL FROM outbox WHERE id = $1"


async def _insert(
    db: asyncpg.Connection,
    key: str,
    *,
    aggregatetype: str = "order",
    payload: Any = None,
    topic: str | None = None,
    headers: dict[str, str] | None = None,
) -> asyncpg.Record:
    return await db.fetchrow(
        INSERT,
        aggregatetype,
        key,
        json.dumps(payload if payload is not None else {"k": key}),
        topic,
        json.dumps(headers) if headers is not None else None,
    )


async def _receipts(db: asyncpg.Connection, ids: list[Any]) -> int:
    return int(await db.fetchval(RECEIPTS, ids))


async def _all_published(db: asyncpg.Connection, ids: list[Any]) -> bool:
    return await _receipts(db, ids) == len(ids)


async def _quarantined(db: asyncpg.Connection, row: asyncpg.Record) -> bool:
    return bool(
        await db.fetchval("SELECT quarantined_at IS NOT NULL FROM outbox WHERE id = $1", row["id"])
    )


# -- a key no index entry can hold ---------------------------------------------------------------
async def test_a_long_key_whose_publish_fails_does_not_stop_the_other_rows_receipts(
    empty_database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key of about 3 kB that does not compress, stored before the door refused keys
    over 1 kB: recording its failure once needed a B-tree entry over the page's limit,
    which rolled the whole batch's bookkeeping back."""
    db = await asyncpg.connect(empty_database_url)
    try:
        await migrate_up_to(db, BEFORE_THE_DOOR)
        long_key = secrets.token_urlsafe(2_400)  # random text: pglz cannot shrink it
        failing = await _insert(db, long_key, topic="not a topic!")
        await migrate_the_rest(db)
        healthy = [await _insert(db, f"healthy-{n}") for n in range(20)]
        config = fast_config(empty_database_url, kafka_bootstrap, topic_namespace, max_attempts=2)
        with caplog.at_level(logging.WARNING, logger="relay.engine"):
            async with running_relay(config):
                await wait_until(lambda: _receipts(db, [r["id"] for r in healthy]), timeout=30)
                await wait_until(lambda: _quarantined(db, failing), timeout=30)
                assert await _receipts(db, [r["id"] for r in healthy]) == 20
        attempts, cause, quarantined = await db.fetchrow(STATE, failing["id"])
    finally:
        await db.close()
    assert (attempts, cause, quarantined) == (2, "invalid_topic", True)
    said = [r for r in caplog.records if r.getMessage() == "publish failed"]
    assert said and all(getattr(r, "error_class", None) == "invalid_topic" for r in said)


# -- an outcome the database refuses to record -----------------------------------------------------
_REFUSE = """
CREATE FUNCTION pg_temp_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.aggregateid LIKE 'refused-%' THEN
        RAISE EXCEPTION 'refused for the test' USING ERRCODE = 'program_limit_exceeded';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_receipt BEFORE INSERT ON outbox_receipt
    FOR EACH ROW EXECUTE FUNCTION pg_temp_refuse();
CREATE TRIGGER refuse_failure BEFORE UPDATE ON outbox
    FOR EACH ROW EXECUTE FUNCTION pg_temp_refuse();
"""


async def test_a_row_whose_outcome_cannot_be_written_is_left_out_and_the_rest_recorded(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database refuses the statement for one row's content (here a trigger does, as
    a limit would): the batch is recorded in parts, the rows it can record are, and the
    refused ones are left out, each said once."""
    await db.execute(_REFUSE)
    published_refused = await _insert(db, "refused-published")
    failed_refused = await _insert(db, "refused-failed", headers={"ID": "forged"})
    healthy = [await _insert(db, f"healthy-{n}") for n in range(10)]
    later_of_failed = await _insert(db, "refused-failed")
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    with caplog.at_level(logging.ERROR, logger="relay.engine"):
        async with running_relay(config) as running:
            await wait_until(lambda: _receipts(db, [r["id"] for r in healthy]), timeout=30)
            await wait_until(
                lambda: running.metric("outbox_relay_unrecordable_events") == 2, timeout=30
            )
            await asyncio.sleep(1.5)  # passes come and go; nothing more is sent
            assert await _receipts(db, [r["id"] for r in healthy]) == 10
            refused_lines = [r for r in caplog.records if "refused to record" in r.getMessage()]
            assert sorted(getattr(r, "seq", None) for r in refused_lines) == sorted(
                [published_refused["seq"], failed_refused["seq"]]
            )
            assert {getattr(r, "sqlstate", None) for r in refused_lines} == {"54000"}
    topic = f"{topic_namespace}.order"
    records = await consume(kafka_bootstrap, [topic], count=11, settle=1.0)
    keys = [r.key for r in records]
    assert keys.count(b"refused-published") == 1  # published once, never again
    assert b"refused-failed" not in keys  # its key stays held behind the refused failure
    assert later_of_failed["id"] not in {r.headers[0][1] for r in records}


# -- sizes ------------------------------------------------------------------------------------------
async def test_payloads_far_over_the_record_limit_are_quarantined_without_being_fetched(
    empty_database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """Rows of tens of MB stored before the door refused them, beside batch size x
    (batches in flight + 1) rows just under the record limit: the rest is published, the
    huge ones are quarantined as too large once measured, and the bytes the server sent
    the relay show none of them was transferred."""
    batch_size, in_flight = 4, 2
    near = MAX_RECORD_BYTES * 95 // 100 - 1_000
    huge_bytes = 30 * 1024 * 1024
    db = await asyncpg.connect(empty_database_url)
    try:
        await migrate_up_to(db, BEFORE_THE_DOOR)
        huge = [await _insert(db, f"huge-{n}", payload={"pad": "x" * huge_bytes}) for n in range(3)]
        await migrate_the_rest(db)
        just_under = [
            await _insert(db, f"near-{n}", payload={"pad": secrets.token_hex(near // 2)})
            for n in range(batch_size * (in_flight + 1))
        ]
        small = [await _insert(db, f"small-{n}") for n in range(10)]
        with proxied_database_url(empty_database_url) as (proxied, proxy):
            config = fast_config(
                proxied,
                kafka_bootstrap,
                topic_namespace,
                batch_size=batch_size,
                max_in_flight_batches=in_flight,
            )
            async with running_relay(config) as running:
                ids = [r["id"] for r in just_under + small]
                await wait_until(lambda: _all_published(db, ids), timeout=120)
                for row in huge:
                    await wait_until(lambda row=row: _quarantined(db, row), timeout=30)
                fetched_whole = running.metric("outbox_relay_fetched_bytes_total")
            received = proxy.counters().forwarded_down
        states = [tuple(await db.fetchrow(STATE, row["id"])) for row in huge]
    finally:
        await db.close()
    assert states == [(1, "too_large", True)] * 3
    legitimate = sum(
        len(json.dumps({"pad": "0" * (near // 2 * 2)})) for _ in just_under
    ) + 10_000 * len(small)
    # Each publishable row crossed once or twice (a pass may meet it again); none of the
    # huge ones crossed at all.
    assert received < 3 * legitimate + huge_bytes // 2, (received, legitimate)
    assert fetched_whole < 3 * legitimate


# -- a held row holds its key on its topic -----------------------------------------------------------
async def test_a_quarantined_event_does_not_hold_another_topic_s_event_with_the_same_id(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """Integer ids shared across tables ("order 123", "customer 123"): per-aggregatetype
    topics are different topics, so nothing waits."""
    held = await _insert(db, "shared-1", aggregatetype="order", headers={"id": "forged"})
    other = await _insert(db, "shared-1", aggregatetype="customer")
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, max_attempts=1)
    async with running_relay(config):
        await wait_until(lambda: _receipts(db, [other["id"]]), timeout=30)
    assert (await db.fetchrow(STATE, held["id"]))[2]  # quarantined all along


async def test_with_one_topic_for_every_aggregatetype_the_same_key_is_held(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    held = await _insert(db, "shared-1", aggregatetype="order", headers={"id": "forged"})
    other = await _insert(db, "shared-1", aggregatetype="customer")
    unrelated = await _insert(db, "shared-2", aggregatetype="customer")
    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        topic_template=f"{topic_namespace}.all",
        max_attempts=1,
    )
    async with running_relay(config):
        await wait_until(lambda: _receipts(db, [unrelated["id"]]), timeout=30)
        await wait_until(lambda: _quarantined(db, held), timeout=30)
        await asyncio.sleep(1.0)  # several passes
        assert await _receipts(db, [other["id"]]) == 0  # same topic, same key: it waits


# -- notifications are hints ------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def _notifier(db: asyncpg.Connection, database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the sidecar's role (read-only): it may still NOTIFY anything."""
    role = await create_login_role(db, database_url, "notifier")
    try:
        await grant(database_url, role.name, "sidecar")
        conn = await asyncpg.connect(role.url)
        try:
            yield conn
        finally:
            await conn.close()
    finally:
        await drop_role(db, role.name)


class _CountsFetchesFromZero(RelayStore):
    from_zero = 0

    async def fetch_ready(self, lanes: Any, cursor: int, limit: int, **kwargs: Any) -> Any:
        if cursor == 0:
            type(self).from_zero += 1
        return await super().fetch_ready(lanes, cursor, limit, **kwargs)


async def test_a_flood_of_notifications_costs_a_bounded_number_of_passes(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    store = type("Counting", (_CountsFetchesFromZero,), {"from_zero": 0})
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=1_000)
    # The forged seqs lie far below the cursor, as in a table that has seen traffic: a
    # start up to a batch below it is always honoured (it costs what a cursor fetch costs).
    await db.execute("SELECT setval('outbox_seq_seq', $1)", 100 * config.batch_size)
    async with _notifier(db, database_url) as forger, running_relay(config, store_factory=store):
        first = await _insert(db, "k-first")
        await wait_until(lambda: _receipts(db, [first["id"]]), timeout=30)
        before = store.from_zero
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n in range(10_000):
            payload = ("", "1,1", "1,9223372036854775807", "garbage")[n % 4]
            await forger.execute("SELECT pg_notify('outbox_relay', $1)", payload)
        await asyncio.sleep(0.5)
        elapsed = loop.time() - started
        passes = store.from_zero - before
        last = await _insert(db, "k-last")
        await wait_until(lambda: _receipts(db, [last["id"]]), timeout=30)
    intervals = int(elapsed) + 2
    # Per poll interval: the poll's own pass, and the hint budgets (relay/passes.py).
    assert passes <= intervals * 5, (passes, elapsed)


class _CountsFetches(RelayStore):
    fetches = 0

    async def fetch_ready(self, lanes: Any, cursor: int, limit: int, **kwargs: Any) -> Any:
        type(self).fetches += 1
        return await super().fetch_ready(lanes, cursor, limit, **kwargs)


async def test_a_stream_of_notifications_without_rows_costs_a_bounded_number_of_fetches(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """A role that can only connect NOTIFYs as fast as it can, announcing nothing: each
    fetch that found nothing used to be repeated for the next notification (about 3,900
    fetches a second on an idle relay). A row committed meanwhile is still published."""
    store = type("Counting", (_CountsFetches,), {"fetches": 0})
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, poll_interval_ms=1_000)
    async with _notifier(db, database_url) as forger, running_relay(config, store_factory=store):
        first = await _insert(db, "k-first")
        await wait_until(lambda: _receipts(db, [first["id"]]), timeout=30)
        before = store.fetches
        loop = asyncio.get_running_loop()
        started = loop.time()
        sent = 0
        # At least 2,000 of them, over at least 2 s (a busy machine sends fewer a second).
        while sent < 2_000 or loop.time() - started < 2.0:
            await forger.execute("SELECT pg_notify('outbox_relay', '1,1')")
            sent += 1
        during = await _insert(db, "k-during")
        await wait_until(lambda: _receipts(db, [during["id"]]), timeout=30)
        elapsed = loop.time() - started
        fetches = store.fetches - before
    # A fetch after one that found nothing waits a little (relay/passes.py, QUIET_MS).
    assert fetches <= elapsed * 1000 / QUIET_MS + 20, (fetches, sent, elapsed)


_LATE_ORDER = """
SELECT id::text FROM outbox_receipt WHERE id = ANY($1::uuid[]) ORDER BY kafka_offset
"""


async def test_a_forged_notification_does_not_let_a_row_overtake_a_late_commit(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    """A late commit and its key's next row, both committed after a cursor fetch chose
    where it starts (above the late row), their notifications delayed past the fetch (the
    listening connection's path stalls): with a payload claiming every seq was heard, sent
    from the sidecar's role, the next row still waits for the late one."""
    late = await asyncpg.connect(database_url)
    successor = await asyncpg.connect(database_url)
    staged = asyncio.Event()
    armed_above = 0
    ids: list[str] = []
    late_tx = late.transaction()
    listen_path: FaultProxy | None = None

    class CommitBehindTheStart(RelayStore):
        async def fetch_ready(self, lanes: Any, cursor: int, limit: int, **kwargs: Any) -> Any:
            if armed_above and cursor >= armed_above and not staged.is_set():
                assert listen_path is not None
                staged.set()
                listen_path.stall()  # their notifications arrive only after this fetch
                await late_tx.commit()
                ids.append(str((await _insert(successor, "k-race"))["id"]))
                rows = await super().fetch_ready(lanes, cursor, limit, **kwargs)
                asyncio.get_running_loop().call_later(0.5, listen_path.heal)
                return rows
            return await super().fetch_ready(lanes, cursor, limit, **kwargs)

    try:
        with proxied_database_url(database_url) as (listen_url, listen_path):
            async with _notifier(db, database_url) as forger:
                config = fast_config(
                    database_url,
                    kafka_bootstrap,
                    topic_namespace,
                    poll_interval_ms=60_000,
                    listen_database_url=listen_url,
                )
                async with running_relay(config, store_factory=CommitBehindTheStart):
                    settled = await _insert(db, "k-settle")
                    await wait_until(lambda: _receipts(db, [settled["id"]]), timeout=30)
                    # "Every seq was heard"
                    await forger.execute(
                        "SELECT pg_notify('outbox_relay', '1,9223372036854775807')"
                    )
                    await late_tx.start()
                    late_row = await _insert(late, "k-race")
                    ids.insert(0, str(late_row["id"]))
                    passed = await _insert(db, "k-passed")
                    await wait_until(lambda: _receipts(db, [passed["id"]]), timeout=30)
                    armed_above = passed["seq"]
                    wake = await _insert(db, "k-wake")
                    await wait_until(lambda: _receipts(db, [wake["id"]]), timeout=30)
                    assert staged.is_set(), (
                        "the staged fetch never ran: the scenario did not happen"
                    )
                    await wait_until(lambda: _all_published(db, ids), timeout=30)
    finally:
        await late.close()
        await successor.close()
    published = [r[0] for r in await db.fetch(_LATE_ORDER, ids)]
    assert published == ids, "a key's rows reached Kafka out of order"


# -- topics -------------------------------------------------------------------------------------
async def test_a_row_routed_outside_the_allowed_topics_is_quarantined_at_once(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    outside = await _insert(db, "k-out", topic="someone.elses.topic")
    inside = await _insert(db, "k-in")
    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        allowed_topics=re.escape(topic_namespace) + r"\..+",
        max_attempts=5,
    )
    async with running_relay(config) as running:
        await wait_until(lambda: _receipts(db, [inside["id"]]), timeout=30)
        await wait_until(lambda: _quarantined(db, outside), timeout=30)
        counted = running.metric(
            "outbox_relay_failed_events_total", {"error_class": "topic_not_allowed"}
        )
    assert tuple(await db.fetchrow(STATE, outside["id"])) == (1, "topic_not_allowed", True)
    assert counted == 1


# -- an error nothing expected -----------------------------------------------------------------------
async def test_a_row_that_always_fails_unexpectedly_ends_quarantined_with_the_error_s_type(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from aiokafka import AIOKafkaProducer

    from relay.producer import make_producer

    surprising_topic = f"{topic_namespace}.surprise"

    class Surprising(AIOKafkaProducer):  # type: ignore[misc]
        async def send_batch(self, batch: Any, topic: str, *, partition: int) -> Any:
            if topic == surprising_topic:
                raise LookupError("nothing expected this")
            return await super().send_batch(batch, topic, partition=partition)

    def factory(config: Any) -> AIOKafkaProducer:
        producer = make_producer(config)
        producer.__class__ = Surprising
        return producer

    surprise = await _insert(db, "k-surprise", topic=surprising_topic)
    fine = await _insert(db, "k-fine")
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, max_attempts=3)
    from prometheus_client import CollectorRegistry

    from relay.engine import Relay
    from relay.metrics import RelayMetrics

    relay = Relay(config, RelayMetrics.register(CollectorRegistry()), producer_factory=factory)
    stop = asyncio.Event()
    caplog.set_level(logging.ERROR, logger="relay.engine")
    task = asyncio.create_task(relay.run(stop))  # type: ignore[arg-type]
    try:
        await wait_until(lambda: _receipts(db, [fine["id"]]), timeout=30)
        await wait_until(lambda: _quarantined(db, surprise), timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
    assert tuple(await db.fetchrow(STATE, surprise["id"])) == (3, "unexpected:LookupError", True)
    said = [r for r in caplog.records if r.getMessage() == "publish failed unexpectedly"]
    assert len(said) == 3  # once per attempt, each with its type and where it was raised
    assert {getattr(r, "exc_type", None) for r in said} == {"LookupError"}
    assert all(str(getattr(r, "at", "")).startswith("relay/publisher.py:") for r in said)
    assert not any("nothing expected this" in r.getMessage() for r in caplog.records)


# -- trace context ------------------------------------------------------------------------------
async def test_a_traceparent_receivers_must_ignore_is_not_forwarded(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    row = await db.fetchrow(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, traceparent) "
        "VALUES ('order', 'k-trace', 'changed', '{}', "
        "'ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01') RETURNING id"
    )
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    async with running_relay(config) as running:
        await wait_until(lambda: _receipts(db, [row["id"]]), timeout=30)
        dropped = running.metric("outbox_relay_void_traceparents_total")
    (record,) = await consume(kafka_bootstrap, [f"{topic_namespace}.order"], count=1)
    assert "traceparent" not in {name for name, _ in record.headers}
    assert dropped == 1
