"""The plumbing behind the public calls: the transaction, the locked job row, the fenced
transition, the idempotent event insert, and the one path that quarantines a job with its
failure event."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg

from scoring.errors import ConflictingReplay, LeaseExpired, UnknownJob
from scoring.events import AGGREGATE_TYPE, PreparedEvent
from scoring.outcomes import Enqueue, Failure, FailureOutcome
from scoring.sql import (
    ABORT_CALLER_TRANSACTION_SQL,
    DATABASE_CLOCK_SQL,
    FIND_EVENT_SQL,
    INSERT_EVENT_SQL,
    LOCK_JOB_SQL,
    QUARANTINE_JOB_SQL,
)
from scoring.transitions import Decision, JobRow

Settled = TypeVar("Settled")


@asynccontextmanager
async def outcome_transaction(conn: asyncpg.Connection) -> AsyncIterator[bool]:
    """Run in the caller's transaction when one is open (yields True), else in our own READ COMMITTED one."""
    if conn.is_in_transaction():
        yield True
        return
    async with conn.transaction(isolation="read_committed"):
        yield False


async def lock_job(conn: asyncpg.Connection, job_ref: str) -> JobRow:
    """Lock the job row for the rest of the transaction and read it with the database clock."""
    record = await conn.fetchrow(LOCK_JOB_SQL, job_ref)
    if record is None:
        raise UnknownJob(f"no scoring job {job_ref!r}", job_ref=job_ref)
    return JobRow(**dict(record))


async def lease_expired_meanwhile(
    conn: asyncpg.Connection, job_ref: str, row: JobRow
) -> LeaseExpired:
    """The refusal when a fenced UPDATE matched nothing although the locked row was decided live."""
    # The locked row matched the decision, so the fenced UPDATE can only have missed
    # because the database clock passed the expiry in between.
    now = int(await conn.fetchval(DATABASE_CLOCK_SQL))
    expiry = row.lease_expires_at_unix_ms or 0
    return LeaseExpired(
        f"job {job_ref!r}: lease expired at {expiry} (database clock {now})",
        job_ref=job_ref,
        expired_at_unix_ms=expiry,
        now_unix_ms=now,
    )


async def fenced_transition(
    conn: asyncpg.Connection, row: JobRow, sql: str, job_ref: str, *args: object
) -> int:
    """Run a fenced UPDATE of the locked job (``$1`` is ``job_ref``) and return the unix ms it returns; no match is :class:`LeaseExpired`."""
    returned = await conn.fetchval(sql, job_ref, *args)
    if returned is None:
        raise await lease_expired_meanwhile(conn, job_ref, row)
    return int(returned)


def _same_event(record: Any, event: PreparedEvent) -> bool:
    envelope = event.envelope
    if (
        record["aggregatetype"] != AGGREGATE_TYPE
        or record["aggregateid"] != event.job_ref
        or record["type"] != envelope.event_type
    ):
        return False
    if record["published"]:
        return True
    # Time, correlation, causation and trace context describe the attempt, not the
    # outcome, so a replay may differ in them; the digest covers the data.
    return bool(
        record["tenant_ref"] == envelope.tenant_ref
        and record["schema_version"] == envelope.schema_version
        and record["payload_digest"] == envelope.payload_digest
    )


async def enqueue_event(
    conn: asyncpg.Connection, event: PreparedEvent, occurred_at_unix_ms: int, *, caller_owned: bool
) -> Enqueue:
    """Insert the event unless it is already there (pending or published); a different event under the id is :class:`ConflictingReplay`."""
    # Look first, in its own statement: if the relay is moving this very row to
    # outbox_receipt right now, the look still sees the row; had we only relied on
    # ON CONFLICT, the insert would wait for the move and then succeed, duplicating it.
    existing = await conn.fetch(FIND_EVENT_SQL, event.event_id)
    if not existing:
        envelope = event.envelope
        inserted = await conn.fetchval(
            INSERT_EVENT_SQL,
            event.event_id,
            AGGREGATE_TYPE,
            event.job_ref,
            envelope.event_type,
            event.body(occurred_at_unix_ms),
            envelope.tenant_ref,
            envelope.schema_version,
            envelope.correlation_ref,
            envelope.causation_ref,
            event.traceparent,
            event.tracestate,
        )
        if inserted is not None:
            return Enqueue.INSERTED
        existing = await conn.fetch(FIND_EVENT_SQL, event.event_id)  # a concurrent writer won
    if existing and all(_same_event(record, event) for record in existing):
        return Enqueue.DUPLICATE
    error = ConflictingReplay(
        f"job {event.job_ref!r}: outbox event {event.event_id} exists with different content; "
        "the transaction was rolled back",
        job_ref=event.job_ref,
        event_id=event.event_id,
    )
    if caller_owned:
        try:
            await conn.execute(ABORT_CALLER_TRANSACTION_SQL)
        except asyncpg.RaiseError as exc:
            raise error from exc
    raise error


async def fail_under_lock(
    conn: asyncpg.Connection,
    prepared: PreparedEvent,
    decide: Callable[[JobRow], Awaitable[Decision | Settled]],
    *,
    fencing_token: int,
    lease_must_be_expired: bool,
) -> FailureOutcome | Settled:
    """Every permanent failure: lock the job, ``decide``, then quarantine it with its event (APPLY) or confirm the replay (DUPLICATE).

    Whatever else ``decide`` returns, having settled the job itself (a retry) or found
    nothing to do, is returned as it is, inside the same transaction.
    """
    job_ref = prepared.job_ref
    async with outcome_transaction(conn) as caller_owned:
        row = await lock_job(conn, job_ref)
        decision = await decide(row)
        if not isinstance(decision, Decision):
            return decision
        if decision is Decision.APPLY:
            # The sweeper quarantines only a lease that has expired, a worker only a live one.
            occurred = await fenced_transition(
                conn,
                row,
                QUARANTINE_JOB_SQL,
                job_ref,
                fencing_token,
                prepared.outcome_ref,  # the cause code
                lease_must_be_expired,
            )
            failure = Failure.QUARANTINED
        else:
            assert decision is Decision.DUPLICATE, decision  # decide settles the retries
            occurred, failure = row.updated_at_unix_ms, Failure.DUPLICATE
        enqueue = await enqueue_event(conn, prepared, occurred, caller_owned=caller_owned)
    return FailureOutcome(job_ref, failure, enqueue, prepared.event_id, occurred)
