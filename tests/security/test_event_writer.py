"""The ``event-writer`` part: the contract's columns of the outbox, and nothing else.

Real PostgreSQL (each server of the run) and, for delivery, the real broker. What is
forbidden is read from the migrated table's own catalog, so a column a later migration adds
for the relay is refused to this part without this file being told about it.
"""

from __future__ import annotations

import datetime as dt
import json

import asyncpg
import pytest

from contracts.health import Classification
from contracts.policy import Family
from health.commands import evaluate_once
from scoring.worker import claim_next_due, enqueue_job
from scoring.writer import EventDetails, complete_job
from tests.security.conftest import MakeRole
from tests.security.process import run_cli
from tests.support import expected_privileges
from tests.support.kafka import read_topic
from tests.support.policies import RECEIPT_RETENTION_MS, loose_policy
from tests.support.relay import fast_config, running_relay
from tests.support.roles import grant, privilege_matrix
from tests.support.waiting import wait_until

DENIED = asyncpg.InsufficientPrivilegeError

CONTRACT = expected_privileges.EVENT_WRITER_COLUMNS
# What the relay owns today; the catalog may name more, never fewer.
RELAY_OWNED = {
    "seq",
    "created_at",
    "lane",
    "attempts",
    "next_attempt_at",
    "last_error_class",
    "quarantined_at",
}

# A value of each type the outbox's columns have; a column of a type not listed here fails
# the test until someone decides what to try in it.
SAMPLE_OF_TYPE = {
    "bigint": "4611686018427387904",
    "integer": "7",
    "smallint": "7",
    "timestamp with time zone": "clock_timestamp() + interval '1 hour'",
    "text": "'forged'",
    "jsonb": "'{}'::jsonb",
    "uuid": "gen_random_uuid()",
}

# A valid value of each contract column.
ALLOWED_VALUE = {
    "id": "'0190a6f4-5b1e-7c3d-8e2f-0123456789ab'::uuid",
    "payload": "'{\"n\": 1}'::jsonb",
    "tenant_ref": "'tenant-a'",
    "schema_version": "'1'",
    "correlation_ref": "'corr-a'",
    "causation_ref": "'cause-a'",
    "traceparent": "'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'",
    "tracestate": "'vendor=opaque'",
    "headers": '\'{"h": "v"}\'::jsonb',
    "topic": "'orders.v1'",
}

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = 'outbox'::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


async def _outbox_columns(db: asyncpg.Connection) -> dict[str, str]:
    return {name: kind for name, kind in await db.fetch(_COLUMNS)}


def _insert(key: str, column: str | None = None, value: str = "", overriding: bool = False) -> str:
    columns = "aggregatetype, aggregateid, type"
    values = f"'order', '{key}', 'order.placed'"
    if column is not None:
        columns += f", {column}"
        values += f", {value}"
    override = " OVERRIDING SYSTEM VALUE" if overriding else ""
    return f"INSERT INTO outbox ({columns}){override} VALUES ({values})"


async def _owner_may(db: asyncpg.Connection, statement: str) -> bool:
    """Whether the table's owner can run ``statement`` (rolled back either way)."""
    try:
        async with db.transaction():
            await db.execute(statement)
            raise _Undo
    except _Undo:
        return True
    except asyncpg.PostgresError:
        return False


class _Undo(Exception):
    pass


async def test_the_part_holds_exactly_its_matrix(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    assert await privilege_matrix(db, role.name) == expected_privileges.EVENT_WRITER


async def test_every_column_outside_the_contract_is_refused(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    columns = await _outbox_columns(db)
    forbidden = {name: kind for name, kind in columns.items() if name not in CONTRACT}
    assert set(forbidden) >= RELAY_OWNED, sorted(forbidden)
    as_writer = await asyncpg.connect(role.url)
    try:
        # A role that may insert nothing would refuse everything below and prove nothing.
        await as_writer.execute(_insert("allowed"))
        for column, kind in forbidden.items():
            assert kind in SAMPLE_OF_TYPE, f"no sample value for {column} of type {kind}"
            for overriding in (False, True):
                key = f"forbidden-{column}-{overriding}"
                statement = _insert(key, column, SAMPLE_OF_TYPE[kind], overriding)
                # Refused for lack of the privilege wherever the owner could have done it;
                # a column nobody may set (the generated lane) is refused to both.
                expected: type[asyncpg.PostgresError] = (
                    DENIED if await _owner_may(db, statement) else asyncpg.PostgresError
                )
                with pytest.raises(expected):
                    await as_writer.execute(statement)
        # seq above all: with OVERRIDING SYSTEM VALUE the owner could set it.
        assert await _owner_may(db, _insert("seq-owner", "seq", "4611686018427387904", True))
    finally:
        await as_writer.close()
    assert await db.fetch("SELECT aggregateid FROM outbox") == [("allowed",)]


async def test_each_contract_column_may_be_inserted(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    as_writer = await asyncpg.connect(role.url)
    try:
        await as_writer.execute(_insert("plain"))
        for column, value in ALLOWED_VALUE.items():
            await as_writer.execute(_insert(f"with-{column}", column, value))
        every = ", ".join(ALLOWED_VALUE)
        values = ", ".join(v for k, v in ALLOWED_VALUE.items() if k != "id")
        await as_writer.execute(
            f"INSERT INTO outbox (aggregatetype, aggregateid, type, {every}) "
            f"VALUES ('order', 'all', 'order.placed', gen_random_uuid(), {values})"
        )
        # Through COPY as well: the part's privileges are the same for it.
        await as_writer.copy_records_to_table(
            "outbox",
            records=[("order", "copied", "order.placed", '{"n": 2}')],
            columns=["aggregatetype", "aggregateid", "type", "payload"],
        )
    finally:
        await as_writer.close()
    assert set(ALLOWED_VALUE) | {"aggregatetype", "aggregateid", "type"} == set(CONTRACT)
    rows = {r["aggregateid"]: r for r in await db.fetch("SELECT * FROM outbox")}
    assert len(rows) == len(ALLOWED_VALUE) + 3
    for column in ALLOWED_VALUE:
        given = await db.fetchval(
            f"SELECT {column} = {ALLOWED_VALUE[column]} FROM outbox WHERE aggregateid = $1",
            f"with-{column}",
        )
        assert given is True, column
    # The relay's bookkeeping starts where the database puts it.
    assert all(r["attempts"] == 0 and r["quarantined_at"] is None for r in rows.values())


async def test_a_forged_scoring_event_is_refused(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    forged = (
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
        "VALUES ('scoring_job', 'job-forged', 'scoring.result.completed', '{}')"
    )
    as_writer = await asyncpg.connect(role.url)
    try:
        with pytest.raises(DENIED, match="scoring_job"):
            await as_writer.execute(forged)
        with pytest.raises(DENIED, match="scoring_job"):
            await as_writer.copy_records_to_table(
                "outbox",
                records=[("scoring_job", "job-copied", "scoring.result.completed")],
                columns=["aggregatetype", "aggregateid", "type"],
            )
        # Other aggregate types are its own to write, whatever they look like.
        await as_writer.execute(_insert("scoring_job-lookalike"))
        await as_writer.execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type) "
            "VALUES ('Scoring_Job', 'job-x', 'scoring.result.completed')"
        )
    finally:
        await as_writer.close()
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE aggregatetype = 'scoring_job'") == 0
    # The owner still writes them (a replay by hand), as does the scoring service's part.
    await db.execute(forged)
    writer = await make_role("writer")
    await grant(database_url, writer.name, "writer")
    as_scoring = await asyncpg.connect(writer.url)
    try:
        await as_scoring.execute(forged.replace("job-forged", "job-scoring"))
    finally:
        await as_scoring.close()
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE aggregatetype = 'scoring_job'") == 2


async def test_the_part_reads_nothing_and_touches_no_scoring_job(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    assert await enqueue_job(db, job_ref="job-evw", request_ref="req-evw", max_attempts=3)
    claimed = await claim_next_due(db, worker_ref="worker-a", lease_ms=60_000)
    assert claimed is not None
    relations = [
        name
        for (name,) in await db.fetch(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
            "AND relkind IN ('r', 'p', 'v', 'm', 'S')"
        )
    ]
    assert {"outbox", "outbox_receipt", "scoring_job_state", "outbox_seq_seq"} <= set(relations)
    as_writer = await asyncpg.connect(role.url)
    try:
        await as_writer.execute(_insert("allowed"))  # it is a writer, and yet:
        for relation in relations:
            with pytest.raises(DENIED):
                await as_writer.fetch(f"SELECT * FROM {relation} LIMIT 1")
        # Not even the id it just wrote: RETURNING reads.
        with pytest.raises(DENIED):
            await as_writer.fetchval(_insert("returning") + " RETURNING id")
        for statement in (
            "INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, "
            "scoring_state, max_attempts) VALUES ('job-new', 'req-new', 'queued', 1)",
            "UPDATE scoring_job_state SET scoring_state = 'cancelled', active_worker_ref = NULL, "
            "active_lease_ref = NULL, active_fencing_token = NULL, "
            "active_lease_expires_at_unix_ms = NULL",
            "DELETE FROM scoring_job_state",
            "TRUNCATE scoring_job_state",
            "UPDATE outbox SET quarantined_at = clock_timestamp()",
            "DELETE FROM outbox",
        ):
            with pytest.raises(DENIED):
                await as_writer.execute(statement)
        # Nor through the writer API, which is the scoring service's part.
        with pytest.raises(DENIED):
            await complete_job(
                as_writer,
                job_ref="job-evw",
                fencing_token=claimed.fencing_token,
                result_ref="result-evw",
                event=EventDetails(
                    source="urn:test",
                    tenant_ref="tenant-a",
                    correlation_ref="corr-a",
                    schema_version="1",
                ),
            )
    finally:
        await as_writer.close()
    state = await db.fetchval(
        "SELECT scoring_state FROM scoring_job_state WHERE scoring_job_ref = 'job-evw'"
    )
    assert state == "leased"


async def test_its_events_are_published(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    role = await make_role("evw")
    await grant(database_url, role.name, "event-writer")
    as_writer = await asyncpg.connect(role.url)
    try:
        for n in range(3):
            await as_writer.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, headers) "
                "VALUES ('order', 'order-evw', 'order.placed', $1::jsonb, '{\"h\": \"v\"}')",
                json.dumps({"n": n}),
            )
    finally:
        await as_writer.close()
    async with running_relay(fast_config(database_url, kafka_bootstrap, topic_namespace)):
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
        )
    records = await read_topic(kafka_bootstrap, f"{topic_namespace}.order", count=3)
    assert [json.loads(r.value or b"")["n"] for r in records] == [0, 1, 2]


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


async def test_cli_grants_the_part(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("evw")
    # Where the role may route is said, one way or another.
    unsaid = run_cli(
        "grant", "--database-url", database_url, "--to", role.name, "--as", "event-writer"
    )
    assert unsaid.returncode == 2, unsaid.stderr
    assert unsaid.stderr.strip().count("\n") == 0 and "--any-route" in unsaid.stderr
    done = run_cli(
        "grant",
        "--database-url",
        database_url,
        "--to",
        role.name,
        "--as",
        "event-writer",
        "--any-route",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        f"role {role.name} now holds exactly what event-writer needs on this database's objects"
    )
    assert await privilege_matrix(db, role.name) == expected_privileges.EVENT_WRITER
    # The scoring service's part and this one on one role: the wider writer wins.
    await grant(database_url, role.name, "writer", "event-writer")
    assert await privilege_matrix(db, role.name) == expected_privileges.WRITER
