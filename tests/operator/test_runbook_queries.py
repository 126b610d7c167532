"""Every SQL query in docs/operations.md runs on the migrated schema, read-only, and finds
what it is meant to find on a seeded scene."""

from __future__ import annotations

import datetime
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
QUERIES = re.findall(r"```sql\n(.*?)```", RUNBOOK.read_text(), flags=re.DOTALL)


def _title(query: str) -> str:
    """A query's first comment line: what the runbook says it answers."""
    first = query.lstrip().splitlines()[0]
    assert first.startswith("-- "), f"a runbook query without a leading comment: {query[:80]!r}"
    return first.removeprefix("-- ").strip()


def test_the_runbook_has_queries() -> None:
    assert len(QUERIES) >= 10


@dataclass(frozen=True)
class Scene:
    """What the seed put in the database, for the expectations to name."""

    quarantined_id: uuid.UUID  # key-a, record_too_large
    held_id: uuid.UUID  # key-a, pending behind the quarantined row
    retrying_id: uuid.UUID  # key-b, broker_timeout, its next attempt due already
    lane_a: int
    lane_b: int  # owned by relay-a with a live lease
    locker_pid: int  # a session holding a lock on outbox in an open transaction


Rows = list[asyncpg.Record]
SEED_RECEIPT_AGE = datetime.timedelta(hours=2)


def _quarantined_by_cause(rows: Rows, s: Scene) -> None:
    got = [(r["last_error_class"], r["aggregatetype"], r["type"], r["events"]) for r in rows]
    assert got == [("record_too_large", "ledger", "t", 1)]


def _each_quarantined(rows: Rows, s: Scene) -> None:
    assert [(r["id"], r["held_behind"]) for r in rows] == [(s.quarantined_id, 1)]


def _backlog_by_type(rows: Rows, s: Scene) -> None:
    got = [(r["aggregatetype"], r["pending"], r["retrying"], r["quarantined"]) for r in rows]
    assert got == [("ledger", 2, 1, 1)]
    assert rows[0]["oldest_pending"] is not None


def _backlog_by_lane(rows: Rows, s: Scene) -> None:
    got = {(r["lane"], r["pending"], r["owner_id"]) for r in rows}
    assert got == {(s.lane_a, 1, None), (s.lane_b, 1, "relay-a")}


def _retrying_by_cause(rows: Rows, s: Scene) -> None:
    assert [(r["last_error_class"], r["events"]) for r in rows] == [("broker_timeout", 1)]


def _oldest_pending(rows: Rows, s: Scene) -> None:
    got = {r["id"]: r["held_behind_earlier_row"] for r in rows}
    assert got == {s.held_id: True, s.retrying_id: False}


def _expired_leases(rows: Rows, s: Scene) -> None:
    assert [(r["active_worker_ref"], r["expired_leases"]) for r in rows] == [("worker-a", 1)]


def _queue_by_state(rows: Rows, s: Scene) -> None:
    assert {r["scoring_state"]: r["jobs"] for r in rows} == {"leased": 1, "quarantined": 1}


def _oldest_active_jobs(rows: Rows, s: Scene) -> None:
    assert [(r["scoring_job_ref"], r["scoring_state"]) for r in rows] == [("job-a", "leased")]


def _quarantined_jobs(rows: Rows, s: Scene) -> None:
    assert [(r["last_failure_code"], r["jobs"]) for r in rows] == [("model_failed", 1)]


def _jobs_without_event(rows: Rows, s: Scene) -> None:
    assert [(r["scoring_job_ref"], r["scoring_state"]) for r in rows] == [("job-q", "quarantined")]


def _receipts_reach(rows: Rows, s: Scene) -> None:
    assert len(rows) == 1
    assert rows[0]["oldest_receipt"] is not None
    # The seeded receipt is two hours old; a minute of slack for a slow machine.
    assert rows[0]["kept_for"] >= SEED_RECEIPT_AGE - datetime.timedelta(minutes=1)


def _relay_instances(rows: Rows, s: Scene) -> None:
    assert [(r["instance_id"], r["lanes"]) for r in rows] == [("relay-a", 1)]


def _lanes_without_owner(rows: Rows, s: Scene) -> None:
    assert [r["lane"] for r in rows] == [lane for lane in range(64) if lane != s.lane_b]
    assert all(r["owner_id"] is None for r in rows)


def _ready_by_lane(rows: Rows, s: Scene) -> None:
    # key-a's pending row is held behind its quarantined one: only key-b's row is ready.
    assert [(r["lane"], r["ready"]) for r in rows] == [(s.lane_b, 1)]


def _lock_holders(rows: Rows, s: Scene) -> None:
    # Other sessions of the server may show too (the query does not filter by database).
    assert s.locker_pid in {r["pid"] for r in rows}


def _sessions_in_a_transaction(rows: Rows, s: Scene) -> None:
    # Every session of the server in a transaction shows: the queue is the cluster's.
    assert s.locker_pid in {r["pid"] for r in rows}
    assert [r["xact_start"] for r in rows] == sorted(r["xact_start"] for r in rows)


# Keyed by each query's first comment line, so a reordered runbook keeps its checks.
EXPECTED: dict[str, Callable[[Rows, Scene], None]] = {
    "Quarantined events by cause: what broke, where, since when.": _quarantined_by_cause,
    "Each quarantined event and how many later events of its key it holds back.": (
        _each_quarantined
    ),
    "The backlog by aggregatetype: pending, retrying, quarantined, oldest.": _backlog_by_type,
    "Where the backlog sits: per lane, with the lane's owner (a lane without a live owner is": (
        _backlog_by_lane
    ),
    "Retrying rows by cause: retriable broker failures spend no attempt.": _retrying_by_cause,
    "The oldest pending rows: attempts, cause, next attempt, and whether a quarantined or": (
        _oldest_pending
    ),
    "Expired leases by worker: one worker with many is a dead or hung process.": _expired_leases,
    "The queue by state: how many, the oldest, the last change.": _queue_by_state,
    "The oldest active jobs: state, attempts, next retry, failure cause.": _oldest_active_jobs,
    "Quarantined jobs by cause and when they last happened.": _quarantined_jobs,
    "The jobs without their event (the family's own rule), oldest first.": _jobs_without_event,
    "How far back receipts reach now.": _receipts_reach,
    "Relay instances: heartbeat, last publish, lanes held now.": _relay_instances,
    "Lanes with no live owner.": _lanes_without_owner,
    "Ready rows by lane (the relay's own rule), oldest first.": _ready_by_lane,
    "Transactions holding a lock on outbox, oldest first (pid and start only; add `query`": (
        _lock_holders
    ),
    "Sessions in a transaction, oldest first: the one that holds the NOTIFY queue is among them.": (
        _sessions_in_a_transaction
    ),
}


def test_every_expectation_names_a_runbook_query() -> None:
    assert set(EXPECTED) <= {_title(q) for q in QUERIES}


_INSERT_EVENT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, attempts, next_attempt_at,
                    last_error_class, quarantined_at)
VALUES ('ledger', $1, 't', '{}', $2, $3, $4, $5)
RETURNING id, lane
"""


@pytest_asyncio.fixture
async def scene(db: asyncpg.Connection, database_url: str) -> AsyncIterator[Scene]:
    """A leased job with an expired lease, a quarantined job without its event, a
    quarantined event with a later one of its key behind it, a retrying event on a lane
    with a live owner, an old receipt, and a session holding a lock on outbox."""
    await db.execute(
        "INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,"
        " attempt_count, max_attempts, active_worker_ref, active_lease_ref,"
        " active_fencing_token, active_lease_expires_at_unix_ms)"
        " VALUES ('job-a', 'request-a', 'leased', 1, 3, 'worker-a', 'lease-a', 1, 1000)"
    )
    await db.execute(
        "INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,"
        " attempt_count, max_attempts, last_failure_code, created_at, updated_at)"
        " VALUES ('job-q', 'request-q', 'quarantined', 3, 3, 'model_failed',"
        " now() - interval '2 hours', now() - interval '1 hour')"
    )
    now = await db.fetchval("SELECT now()")
    quarantined = await db.fetchrow(
        _INSERT_EVENT, "key-a", 5, None, "record_too_large", datetime.datetime.now(datetime.UTC)
    )
    held = await db.fetchrow(_INSERT_EVENT, "key-a", 0, None, None, None)
    retrying = await db.fetchrow(
        _INSERT_EVENT, "key-b", 0, now - datetime.timedelta(seconds=5), "broker_timeout", None
    )
    lane_a, lane_b = quarantined["lane"], retrying["lane"]
    assert lane_a != lane_b, "the seed needs key-a and key-b on different lanes"
    await db.execute("INSERT INTO relay_instance (instance_id) VALUES ('relay-a')")
    await db.execute(
        "UPDATE relay_lane SET owner_id = 'relay-a', fence = 1,"
        " lease_expires_at = now() + interval '1 hour' WHERE lane = $1",
        lane_b,
    )
    await db.execute(
        "INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic,"
        " kafka_partition, kafka_offset, created_at, published_at)"
        " VALUES (gen_random_uuid(), 'ledger', 'key-old', 't', 'ledger', 0, 0,"
        " now() - $1::interval, now() - $1::interval)",
        SEED_RECEIPT_AGE,
    )
    locker = await asyncpg.connect(database_url)
    try:
        async with locker.transaction():
            await locker.execute("LOCK TABLE outbox IN ACCESS SHARE MODE")
            yield Scene(
                quarantined_id=quarantined["id"],
                held_id=held["id"],
                retrying_id=retrying["id"],
                lane_a=lane_a,
                lane_b=lane_b,
                locker_pid=locker.get_server_pid(),
            )
    finally:
        await locker.close()


@pytest.mark.parametrize("query", QUERIES, ids=[f"query-{n}" for n in range(len(QUERIES))])
async def test_a_runbook_query_finds_the_seed(
    db: asyncpg.Connection, scene: Scene, query: str
) -> None:
    check = EXPECTED.get(_title(query))
    assert check is not None, f"no expectation for the runbook query {_title(query)!r}"
    async with db.transaction(readonly=True):
        rows = await db.fetch(query)
    check(rows, scene)
