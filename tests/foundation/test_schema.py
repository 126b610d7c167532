"""The tables a writer and the scoring service use, and their constraints, on real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from tests.support.services import PostgresServer, drop_database, scratch_database, with_database

LEASE_EXPIRY_MS = 1_900_000_000_000
RETRY_AT_MS = 1_800_000_000_000

# One valid row per state, following scoring_job_state's rules (docs/writer.md, "The job table").
VALID: dict[str, dict[str, Any]] = {
    "queued": {"scoring_state": "queued", "attempt_count": 0, "max_attempts": 3},
    "leased": {
        "scoring_state": "leased",
        "attempt_count": 2,
        "max_attempts": 3,
        "active_worker_ref": "worker-a",
        "active_lease_ref": "lease-a",
        "active_fencing_token": 2,
        "active_lease_expires_at_unix_ms": LEASE_EXPIRY_MS,
    },
    "retry_scheduled": {
        "scoring_state": "retry_scheduled",
        "attempt_count": 1,
        "max_attempts": 3,
        "next_attempt_at_unix_ms": RETRY_AT_MS,
        "last_failure_code": "model_timeout",
    },
    "completed": {
        "scoring_state": "completed",
        "attempt_count": 1,
        "max_attempts": 3,
        "result_ref": "result-1",
        "completed_fencing_token": 1,
    },
    "quarantined": {
        "scoring_state": "quarantined",
        "attempt_count": 3,
        "max_attempts": 3,
        "last_failure_code": "lease_expired",
    },
    "cancelled": {"scoring_state": "cancelled", "attempt_count": 0, "max_attempts": 3},
}


def _row(state: str, **overrides: Any) -> dict[str, Any]:
    row = {"scoring_job_ref": f"job-{uuid.uuid4().hex[:8]}", "scoring_request_ref": "req-1"}
    row.update(VALID[state])
    row.update(overrides)
    return row


async def _insert_job(conn: asyncpg.Connection, row: dict[str, Any]) -> None:
    columns = ", ".join(row)
    params = ", ".join(f"${i}" for i in range(1, len(row) + 1))
    await conn.execute(
        f"INSERT INTO scoring_job_state ({columns}) VALUES ({params})", *row.values()
    )


@pytest_asyncio.fixture(scope="module")
async def shared_db(
    pg_server: PostgresServer, template_database: str
) -> AsyncIterator[asyncpg.Connection]:
    """One migrated database per server for the constraint tables (a database per case is slow)."""
    name = await scratch_database(pg_server.url, template_database)
    conn = await asyncpg.connect(with_database(pg_server.url, name))
    yield conn
    await conn.close()
    await drop_database(pg_server.url, name)


@pytest_asyncio.fixture
async def tx(shared_db: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    """``shared_db`` inside a transaction that is rolled back after the test."""
    transaction = shared_db.transaction()
    await transaction.start()
    yield shared_db
    await transaction.rollback()


# -- scoring_job_state ------------------------------------------------------------------------
async def test_scoring_job_state_has_the_upstream_column_contract(tx: asyncpg.Connection) -> None:
    rows = await tx.fetch(
        "SELECT column_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns WHERE table_name = 'scoring_job_state'"
        " ORDER BY ordinal_position"
    )
    got = {r["column_name"]: (r["data_type"], r["is_nullable"]) for r in rows}
    assert got == {
        "scoring_job_ref": ("text", "NO"),
        "scoring_request_ref": ("text", "NO"),
        "scoring_state": ("text", "NO"),
        "attempt_count": ("integer", "NO"),
        "max_attempts": ("integer", "NO"),
        "next_attempt_at_unix_ms": ("bigint", "YES"),
        "last_failure_code": ("text", "YES"),
        "active_worker_ref": ("text", "YES"),
        "active_lease_ref": ("text", "YES"),
        "active_fencing_token": ("bigint", "YES"),
        "active_lease_expires_at_unix_ms": ("bigint", "YES"),
        "result_ref": ("text", "YES"),
        "completed_fencing_token": ("bigint", "YES"),
        "created_at": ("timestamp with time zone", "NO"),
        "updated_at": ("timestamp with time zone", "NO"),
    }
    defaults = {r["column_name"]: r["column_default"] for r in rows}
    assert defaults["attempt_count"] == "0"
    assert defaults["created_at"] == "clock_timestamp()"
    assert defaults["updated_at"] == "clock_timestamp()"
    assert (
        await tx.fetchval(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
            " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE i.indrelid = 'scoring_job_state'::regclass AND i.indisprimary"
        )
        == "scoring_job_ref"
    )


VALID_SHAPES = [
    pytest.param(_row("queued"), id="queued"),
    pytest.param(_row("leased"), id="leased"),
    pytest.param(_row("retry_scheduled"), id="retry_scheduled"),
    pytest.param(_row("completed"), id="completed"),
    pytest.param(_row("quarantined"), id="quarantined"),
    pytest.param(_row("cancelled"), id="cancelled-from-queued"),
    pytest.param(
        _row("cancelled", attempt_count=2, last_failure_code="model_timeout"),
        id="cancelled-after-a-failure",
    ),
    pytest.param(
        _row("completed", attempt_count=3, completed_fencing_token=3), id="completed-last-attempt"
    ),
    # Letters from the numeric alphabet alone are fine: there is no digit.
    pytest.param(_row("queued", scoring_job_ref="e-E"), id="letters-from-numeric-alphabet"),
    pytest.param(_row("queued", scoring_job_ref="job 7"), id="inner-space"),
]


@pytest.mark.parametrize("row", VALID_SHAPES)
async def test_every_valid_shape_inserts(tx: asyncpg.Connection, row: dict[str, Any]) -> None:
    await _insert_job(tx, row)
    stored = await tx.fetchrow(
        "SELECT * FROM scoring_job_state WHERE scoring_job_ref = $1", row["scoring_job_ref"]
    )
    assert stored is not None
    for column, value in row.items():
        assert stored[column] == value, column
    assert stored["created_at"] is not None


INVALID_SHAPES = [
    pytest.param(_row("queued", scoring_job_ref="123"), id="ref-digits"),
    pytest.param(_row("queued", scoring_job_ref="1e5"), id="ref-exponent"),
    pytest.param(_row("queued", scoring_job_ref="-1.5"), id="ref-negative-decimal"),
    pytest.param(_row("queued", scoring_job_ref="1,000"), id="ref-thousands"),
    pytest.param(_row("queued", scoring_job_ref=" x"), id="ref-untrimmed-left"),
    pytest.param(_row("queued", scoring_job_ref="x "), id="ref-untrimmed-right"),
    pytest.param(_row("queued", scoring_job_ref=""), id="ref-empty"),
    pytest.param(_row("queued", scoring_request_ref="42"), id="request-ref-numeric"),
    pytest.param(_row("queued", scoring_request_ref="  "), id="request-ref-blank"),
    pytest.param(_row("leased", active_worker_ref="7"), id="worker-ref-numeric"),
    pytest.param(_row("leased", active_lease_ref=" lease"), id="lease-ref-untrimmed"),
    pytest.param(_row("completed", result_ref="3.14"), id="result-ref-numeric"),
    pytest.param(_row("completed", result_ref=""), id="result-ref-empty"),
    pytest.param(_row("leased", active_worker_ref=None), id="leased-without-worker"),
    pytest.param(_row("leased", active_lease_ref=None), id="leased-without-lease-ref"),
    pytest.param(_row("leased", active_fencing_token=None), id="leased-without-token"),
    pytest.param(_row("leased", active_lease_expires_at_unix_ms=None), id="leased-without-expiry"),
    pytest.param(_row("leased", active_lease_expires_at_unix_ms=0), id="leased-expiry-zero"),
    pytest.param(_row("leased", active_fencing_token=1), id="token-not-attempt-count"),
    pytest.param(
        _row("leased", attempt_count=0, active_fencing_token=0), id="leased-with-zero-attempts"
    ),
    pytest.param(_row("queued", active_worker_ref="worker-a"), id="queued-with-worker"),
    pytest.param(_row("queued", active_fencing_token=0), id="queued-with-token"),
    pytest.param(
        _row("completed", active_lease_expires_at_unix_ms=LEASE_EXPIRY_MS),
        id="completed-with-lease-expiry",
    ),
    pytest.param(_row("queued", attempt_count=1), id="queued-with-attempts"),
    pytest.param(_row("queued", next_attempt_at_unix_ms=RETRY_AT_MS), id="queued-with-retry"),
    pytest.param(_row("queued", last_failure_code="x"), id="queued-with-failure"),
    pytest.param(_row("queued", result_ref="result-1"), id="queued-with-result"),
    pytest.param(_row("retry_scheduled", attempt_count=3), id="retry-at-max-attempts"),
    pytest.param(_row("retry_scheduled", attempt_count=0), id="retry-without-attempts"),
    pytest.param(_row("retry_scheduled", next_attempt_at_unix_ms=None), id="retry-without-time"),
    pytest.param(_row("retry_scheduled", last_failure_code=None), id="retry-without-failure"),
    pytest.param(_row("completed", result_ref=None), id="completed-without-result"),
    pytest.param(_row("completed", completed_fencing_token=None), id="completed-without-fence"),
    pytest.param(_row("completed", completed_fencing_token=2), id="completed-wrong-fence"),
    pytest.param(_row("quarantined", result_ref="result-1"), id="quarantined-with-result"),
    pytest.param(_row("quarantined", last_failure_code=None), id="quarantined-without-failure"),
    pytest.param(_row("quarantined", attempt_count=0), id="quarantined-without-attempts"),
    pytest.param(_row("cancelled", next_attempt_at_unix_ms=RETRY_AT_MS), id="cancelled-with-retry"),
    pytest.param(_row("cancelled", result_ref="result-1"), id="cancelled-with-result"),
    pytest.param(_row("queued", scoring_state="running"), id="unknown-state"),
    pytest.param(_row("queued", scoring_state="Queued"), id="state-wrong-case"),
    pytest.param(_row("completed", attempt_count=4, completed_fencing_token=4), id="over-max"),
    pytest.param(_row("queued", max_attempts=0), id="max-attempts-zero"),
    pytest.param(_row("queued", attempt_count=-1), id="negative-attempts"),
]


@pytest.mark.parametrize("row", INVALID_SHAPES)
async def test_invalid_shapes_are_rejected(tx: asyncpg.Connection, row: dict[str, Any]) -> None:
    with pytest.raises(asyncpg.CheckViolationError):
        async with tx.transaction():  # a savepoint: the test's transaction stays usable
            await _insert_job(tx, row)
    assert await tx.fetchval("SELECT count(*) FROM scoring_job_state") == 0


# -- outbox -----------------------------------------------------------------------------------
WRITER_INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ('scoring_job', 'job-7f3a', 'scoring.result.completed', '{"result_ref": "r-1"}')
"""


async def test_the_writers_insert_works_unchanged(tx: asyncpg.Connection) -> None:
    assert await tx.execute(WRITER_INSERT) == "INSERT 0 1"
    row = await tx.fetchrow("SELECT * FROM outbox")
    assert isinstance(row["id"], uuid.UUID)
    assert row["id"].version == 7
    assert row["created_at"] is not None
    assert await tx.fetchval("SELECT now() - created_at < interval '1 minute' FROM outbox")
    assert 0 <= row["lane"] <= 63
    assert row["lane"] == await tx.fetchval("SELECT hashtext('job-7f3a') & 63")
    assert isinstance(row["seq"], int)
    assert row["seq"] >= 1
    assert json.loads(row["payload"]) == {"result_ref": "r-1"}
    assert row["attempts"] == 0
    assert row["quarantined_at"] is None
    assert row["next_attempt_at"] is None
    # A second insert gets a later position and its own id; the lane follows the key.
    await tx.execute(WRITER_INSERT)
    rows = await tx.fetch("SELECT id, seq, lane FROM outbox ORDER BY seq")
    assert rows[1]["seq"] > rows[0]["seq"]
    assert rows[1]["id"] != rows[0]["id"]
    assert rows[1]["lane"] == rows[0]["lane"]


async def test_null_payload_is_a_tombstone(tx: asyncpg.Connection) -> None:
    await tx.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)"
        " VALUES ('scoring_job', 'job-1', 'scoring.job.deleted', NULL)"
    )
    assert await tx.fetchval("SELECT payload IS NULL FROM outbox") is True


async def test_optional_writer_columns_are_accepted(tx: asyncpg.Connection) -> None:
    await tx.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, tenant_ref,"
        " schema_version, correlation_ref, causation_ref, traceparent, headers, topic)"
        " VALUES ('a', 'k', 't', '{}', 'tenant-1', '1', 'corr-1', 'cause-1',"
        " '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01', '{\"x-a\": \"b\"}',"
        " 'custom.topic')"
    )
    row = await tx.fetchrow("SELECT traceparent, headers, topic FROM outbox")
    assert row["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert json.loads(row["headers"]) == {"x-a": "b"}
    assert row["topic"] == "custom.topic"


@pytest.mark.parametrize(
    ("column", "value"),
    [
        pytest.param("headers", '{"x-count": 1}', id="header-number"),
        pytest.param("headers", '{"x-a": null}', id="header-null"),
        pytest.param("headers", '{"x-a": {"b": "c"}}', id="header-nested"),
        pytest.param("headers", '["x-a"]', id="headers-array"),
        pytest.param("headers", '"x-a"', id="headers-string"),
        pytest.param("traceparent", "not-a-traceparent", id="traceparent-garbage"),
        pytest.param(
            "traceparent",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            id="traceparent-uppercase",
        ),
        pytest.param(
            "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", id="no-flags"
        ),
        pytest.param("topic", "", id="topic-empty"),
        pytest.param("aggregateid", "", id="aggregateid-empty"),
        pytest.param("aggregatetype", "", id="aggregatetype-empty"),
        pytest.param("type", "", id="type-empty"),
    ],
)
async def test_invalid_outbox_rows_are_rejected(
    tx: asyncpg.Connection, column: str, value: str
) -> None:
    row = {"aggregatetype": "a", "aggregateid": "k", "type": "t", column: value}
    placeholders = ", ".join(
        f"${i}::jsonb" if name == "headers" else f"${i}" for i, name in enumerate(row, 1)
    )
    with pytest.raises(asyncpg.CheckViolationError):
        async with tx.transaction():
            await tx.execute(
                f"INSERT INTO outbox ({', '.join(row)}) VALUES ({placeholders})", *row.values()
            )
    assert await tx.fetchval("SELECT count(*) FROM outbox") == 0


# -- NOTIFY -----------------------------------------------------------------------------------
@pytest_asyncio.fixture
async def notifications(database_url: str) -> AsyncIterator[asyncio.Queue[tuple[str, str]]]:
    """Notifications on ``outbox_relay`` as a second connection receives them."""
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)

    def received(_conn: object, _pid: int, channel: str, payload: str) -> None:
        queue.put_nowait((channel, payload))

    await listener.add_listener("outbox_relay", received)
    yield queue
    await listener.remove_listener("outbox_relay", received)
    await listener.close()


async def _drain(queue: asyncio.Queue[tuple[str, str]], settle: float) -> list[tuple[str, str]]:
    await asyncio.sleep(settle)
    got = []
    while not queue.empty():
        got.append(queue.get_nowait())
    return got


async def _seqs(db: asyncpg.Connection) -> list[int]:
    return [r["seq"] for r in await db.fetch("SELECT seq FROM outbox ORDER BY seq")]


async def test_insert_notifies_only_at_commit(
    db: asyncpg.Connection, notifications: asyncio.Queue[tuple[str, str]]
) -> None:
    transaction = db.transaction()
    await transaction.start()
    await db.execute(WRITER_INSERT)
    assert await _drain(notifications, 0.5) == []
    await transaction.commit()
    first = await asyncio.wait_for(notifications.get(), timeout=10)
    (seq,) = await _seqs(db)
    # The lowest and highest seq the statement wrote (migration 0004).
    assert first == ("outbox_relay", f"{seq},{seq}")
    assert await _drain(notifications, 0.3) == []


async def test_a_rolled_back_insert_never_notifies(
    db: asyncpg.Connection, notifications: asyncio.Queue[tuple[str, str]]
) -> None:
    transaction = db.transaction()
    await transaction.start()
    await db.execute(WRITER_INSERT)
    await transaction.rollback()
    assert await _drain(notifications, 0.5) == []


async def test_each_inserting_statement_notifies_the_seqs_it_wrote_at_commit(
    db: asyncpg.Connection, notifications: asyncio.Queue[tuple[str, str]]
) -> None:
    async with db.transaction():
        await db.execute(WRITER_INSERT)
        await db.execute(WRITER_INSERT)
        await db.execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)"
            " SELECT 'a', 'k-' || g, 't', '{}' FROM generate_series(1, 50) g"
        )
        await db.execute(  # no rows: nothing to announce
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)"
            " SELECT 'a', 'k', 't', '{}' WHERE false"
        )
    seqs = await _seqs(db)
    assert len(seqs) == 52
    got = [await asyncio.wait_for(notifications.get(), timeout=10) for _ in range(3)]
    assert got == [
        ("outbox_relay", f"{seqs[0]},{seqs[0]}"),
        ("outbox_relay", f"{seqs[1]},{seqs[1]}"),
        ("outbox_relay", f"{seqs[2]},{seqs[-1]}"),
    ]
    assert await _drain(notifications, 0.5) == []


async def test_each_committed_transaction_notifies(
    db: asyncpg.Connection, notifications: asyncio.Queue[tuple[str, str]]
) -> None:
    await db.execute(WRITER_INSERT)  # autocommit: its own transaction
    await db.execute(WRITER_INSERT)
    got = [await asyncio.wait_for(notifications.get(), timeout=10) for _ in range(2)]
    first, second = await _seqs(db)
    assert got == [("outbox_relay", f"{first},{first}"), ("outbox_relay", f"{second},{second}")]


async def test_a_default_id_is_a_time_ordered_uuidv7(tx: asyncpg.Connection) -> None:
    # Receipts are keyed by the event id: a random one lands every receipt's index entry in
    # a random leaf of an index that the retention window makes large
    # (docs/benchmarks.md#findings). A default id starts with the insert's Unix milliseconds.
    before_ms = int(await tx.fetchval("SELECT extract(epoch FROM clock_timestamp()) * 1000"))
    ids = []
    for _ in range(3):
        await tx.execute(WRITER_INSERT)
        ids.append(await tx.fetchval("SELECT id FROM outbox ORDER BY seq DESC LIMIT 1"))
        await tx.execute("SELECT pg_sleep(0.002)")
    after_ms = int(await tx.fetchval("SELECT extract(epoch FROM clock_timestamp()) * 1000"))
    for event_id in ids:
        assert event_id.version == 7
        assert event_id.variant == uuid.RFC_4122
        assert before_ms - 1 <= event_id.int >> 80 <= after_ms + 1
    assert ids == sorted(ids, key=lambda u: u.bytes)
    assert len(set(ids)) == 3
