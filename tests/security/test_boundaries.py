"""Ids and routes belong to their owners (migration 0011, relay/sql.py): an event writer
cannot take the scoring writer's ids, cannot re-use a published event's id for another
event, and writes only where its routes say. Real PostgreSQL (each server of the run) and,
for what is published, the real broker."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest

from migrations.grants import WriterRoutes
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.worker import claim_next_due, enqueue_job
from scoring.writer import EventDetails, complete_job
from tests.security.conftest import MakeRole
from tests.security.process import run_cli
from tests.support.kafka import read_topic
from tests.support.relay import fast_config, running_relay
from tests.support.roles import grant
from tests.support.waiting import wait_until

DENIED = asyncpg.InsufficientPrivilegeError
DETAILS = EventDetails(
    source="urn:scoring", tenant_ref="tenant-a", correlation_ref="corr-a", schema_version="1"
)


async def test_an_event_writer_cannot_take_a_scoring_event_s_id(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    """A scoring event's id follows from public data (the job and its outcome): an event
    writer that inserted it first made the completion a conflicting replay, and the job
    stayed leased for good."""
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    await enqueue_job(db, job_ref="job-squat", request_ref="request-1", max_attempts=3)
    lease = await claim_next_due(db, worker_ref="worker-1", lease_ms=60_000)
    assert lease is not None
    squatted = terminal_event_id("job-squat", OutcomeKind.COMPLETED, "result-1")
    as_writer = await asyncpg.connect(role.url)
    try:
        with pytest.raises(DENIED, match="version 8"):
            await as_writer.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                "VALUES ($1, 'order', 'o-1', 'junk', '{}')",
                squatted,
            )
        # Its own ids, and the default, still go in.
        await as_writer.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type) "
            "VALUES ($1, 'order', 'o-2', 'placed')",
            uuid.uuid4(),
        )
    finally:
        await as_writer.close()
    outcome = await complete_job(
        db,
        job_ref=lease.job_ref,
        fencing_token=lease.fencing_token,
        result_ref="result-1",
        event=DETAILS,
    )
    assert outcome.event_id == squatted
    assert (
        await db.fetchval(
            "SELECT scoring_state FROM scoring_job_state WHERE scoring_job_ref = 'job-squat'"
        )
        == "completed"
    )


async def test_a_published_event_s_id_is_never_given_to_another_event(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    make_role: MakeRole,
) -> None:
    """A row under the id of an event published with another key or type: it re-pointed
    that event's receipt, and consumers deduplicating on the id dropped one of them. It is
    quarantined as duplicate_id, never published, and the receipt stays where it was."""
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    first = await db.fetchval(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
        "VALUES ('payment', 'pay-9', 'paid', '{\"n\": 1}') RETURNING id"
    )
    config = fast_config(database_url, kafka_bootstrap, topic_namespace, max_attempts=1)
    receipt = "SELECT topic, kafka_partition, kafka_offset FROM outbox_receipt WHERE id = $1"
    async with running_relay(config):
        await wait_until(lambda: db.fetchval(receipt, first), what="the first event published")
        where = tuple(await db.fetchrow(receipt, first))
        as_writer = await asyncpg.connect(role.url)
        try:
            await as_writer.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                "VALUES ($1, 'junk', 'other', 'forged', '{\"n\": 2}')",
                first,
            )
        finally:
            await as_writer.close()
        await wait_until(
            lambda: db.fetchval(
                "SELECT last_error_class FROM outbox WHERE id = $1 AND quarantined_at IS NOT NULL",
                first,
            ),
            what="the second row quarantined",
        )
    assert tuple(await db.fetchrow(receipt, first)) == where
    cause = await db.fetchval("SELECT last_error_class FROM outbox WHERE id = $1", first)
    assert cause == "duplicate_id"
    forged = await read_topic(kafka_bootstrap, f"{topic_namespace}.junk", count=1, timeout=3)
    assert forged == []


ROUTED = "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic) VALUES ($1, 'k', 't', $2::jsonb, $3)"


async def test_an_event_writer_writes_only_where_its_routes_say(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    """Its aggregatetypes (rows the relay's template routes) and the prefixes of its own
    topics; nothing else, tombstones included, for its members too."""
    role = await make_role("evw")
    await grant(
        database_url,
        role.name,
        "event-writer",
        routes=WriterRoutes(aggregatetypes=("order",), topic_prefixes=("orders.",)),
    )
    member = await make_role("member")
    await db.execute(f'GRANT "{role.name}" TO "{member.name}"')
    for login in (role, member):
        conn = await asyncpg.connect(login.url)
        try:
            await conn.execute(ROUTED, "order", "{}", None)
            await conn.execute(ROUTED, "anything", "{}", "orders.audit")
            for aggregatetype, topic in [
                ("customer", None),
                ("order", "payments"),
                ("order", "orders"),  # the prefix is "orders.", with its dot
            ]:
                with pytest.raises(DENIED, match="route"):
                    await conn.execute(ROUTED, aggregatetype, None, topic)  # tombstones too
            with pytest.raises(DENIED, match="route"):  # one row outside refuses the statement
                await conn.execute(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type) "
                    "SELECT t, 'k', 't' FROM unnest(ARRAY['order', 'customer']) AS t"
                )
        finally:
            await conn.close()
    # Another event writer without routes, and the owner, write anywhere.
    free = await make_role("free")
    await grant(database_url, free.name, "event-writer")
    conn = await asyncpg.connect(free.url)
    try:
        await conn.execute(ROUTED, "customer", "{}", "payments")
    finally:
        await conn.close()
    await db.execute(ROUTED, "customer", "{}", "payments")
    # Granted again with --any-route: the routes are gone.
    await grant(database_url, role.name, "event-writer")
    conn = await asyncpg.connect(role.url)
    try:
        await conn.execute(ROUTED, "customer", "{}", "payments")
    finally:
        await conn.close()
    assert await db.fetchval("SELECT count(*) FROM outbox_relay_writer_route") == 0


async def test_routes_are_given_on_the_command_line(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("evw")
    done = run_cli(
        "grant",
        "--database-url",
        database_url,
        "--to",
        role.name,
        "--as",
        "event-writer",
        "--route-aggregatetype",
        "order",
        "--route-aggregatetype",
        "customer",
        "--route-topic-prefix",
        "orders.",
    )
    assert done.returncode == 0, done.stderr
    row = await db.fetchrow(
        "SELECT aggregatetypes, topic_prefixes FROM outbox_relay_writer_route "
        "WHERE writer = $1::regrole",
        role.name,
    )
    assert (row["aggregatetypes"], row["topic_prefixes"]) == (["order", "customer"], ["orders."])
    for wrong, says in [
        (["--route-topic-prefix", "orders/"], "--route-topic-prefix"),
        (["--any-route", "--route-aggregatetype", "order"], "--any-route"),
    ]:
        refused = run_cli(
            "grant",
            "--database-url",
            database_url,
            "--to",
            role.name,
            "--as",
            "event-writer",
            *wrong,
        )
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert refused.stderr.strip().count("\n") == 0
    payload = json.dumps({"ok": True})
    conn = await asyncpg.connect(role.url)
    try:
        await conn.execute(ROUTED, "customer", payload, None)
    finally:
        await conn.close()
