"""The rest of a small worker SDK over ``scoring_job_state``: enqueue, claim the next due
job, retryable failure, lease expiry and cancellation.

A retryable failure and lease expiry can end a job, with its event: they are SQL functions
(``outbox_relay_fail_retryable``, ``outbox_relay_expire_leases``, migration 0012) that take
the same permanent-failure path as the writer's, so the quarantine and its event commit
together. Enqueue, claim and cancel write no event and are plain statements.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Final

import asyncpg

from contracts.envelope import JsonValue
from scoring.errors import ConflictingReplay, NotCancellable, UnknownJob
from scoring.events import (
    EventArguments,
    EventDetails,
    event_arguments,
    json_text,
    sendable_integer,
    sendable_text,
    validate_duration_ms,
    validate_job_ref,
    validate_ref,
)
from scoring.outcomes import ClaimedJob, FailureOutcome, LeaseExpiry, RetryScheduled
from scoring.sql import (
    CANCEL_JOB_SQL,
    CLAIM_NEXT_DUE_SQL,
    ENQUEUE_JOB_SQL,
    EXPIRE_LEASES_SQL,
    FAIL_RETRYABLE_SQL,
    LOCK_JOB_STATE_SQL,
)
from scoring.store import Row, call, failure_outcome, outcome_transaction, refusal, settled

# The names docs/writer.md documents under scoring.worker; the result types live in
# scoring.outcomes.
__all__ = [
    "LEASE_EXPIRED",
    "ClaimedJob",
    "LeaseExpiry",
    "RetryScheduled",
    "cancel_job",
    "claim_next_due",
    "enqueue_job",
    "expire_leases",
    "exponential_backoff_ms",
    "fail_retryable",
]

LEASE_EXPIRED: Final = "lease_expired"


def exponential_backoff_ms(attempt_count: int, *, base_ms: int, cap_ms: int) -> int:
    """``base_ms * 2**(attempt_count - 1)``, capped at ``cap_ms``: the delay after the given attempt."""
    if attempt_count < 1:
        return 0
    # Compare before multiplying so a large attempt count cannot build a huge integer.
    if attempt_count > 62 or base_ms << (attempt_count - 1) > cap_ms:
        return cap_ms
    return base_ms << (attempt_count - 1)


async def enqueue_job(
    conn: asyncpg.Connection, *, job_ref: str, request_ref: str, max_attempts: int
) -> bool:
    """Queue a new job; False when a job with this ref already exists (left unchanged)."""
    validate_job_ref(job_ref)
    validate_ref("request_ref", request_ref, job_ref=job_ref)
    validate_duration_ms("max_attempts", max_attempts, minimum=1)
    created = await conn.fetchval(ENQUEUE_JOB_SQL, job_ref, request_ref, max_attempts)
    return created is not None


async def claim_next_due(
    conn: asyncpg.Connection, *, worker_ref: str, lease_ms: int
) -> ClaimedJob | None:
    """Lease the oldest due job (by created_at, then ref) for ``lease_ms`` by the database clock; None when nothing is due."""
    validate_ref("worker_ref", worker_ref)
    validate_duration_ms("lease_ms", lease_ms, minimum=1)
    # Lease refs must not look numeric (the table's CHECK), hence the prefix.
    lease_ref = f"lease-{uuid.uuid4().hex}"
    record = await conn.fetchrow(CLAIM_NEXT_DUE_SQL, worker_ref, lease_ref, lease_ms)
    if record is None:
        return None
    return ClaimedJob(
        job_ref=record["scoring_job_ref"],
        request_ref=record["scoring_request_ref"],
        worker_ref=worker_ref,
        lease_ref=lease_ref,
        fencing_token=record["attempt_count"],
        max_attempts=record["max_attempts"],
        lease_expires_at_unix_ms=record["active_lease_expires_at_unix_ms"],
    )


async def fail_retryable(
    conn: asyncpg.Connection,
    *,
    job_ref: str,
    fencing_token: int,
    cause_code: str,
    retry_delay_ms: int,
    event: EventDetails,
    detail: JsonValue = None,
) -> RetryScheduled | FailureOutcome:
    """Record a retryable failure: retry after ``retry_delay_ms``, or quarantine with its event when the budget is spent."""
    job_ref = sendable_text("job_ref", job_ref)
    arguments = (
        job_ref,
        sendable_integer("fencing_token", fencing_token, job_ref=job_ref),
        sendable_text("cause_code", cause_code, job_ref=job_ref),
        json_text("payload.detail", detail, job_ref=job_ref),
        *event_arguments(event, job_ref=job_ref).as_tuple(),
        sendable_integer("retry_delay_ms", retry_delay_ms, job_ref=job_ref),
    )
    [row] = await call(conn, FAIL_RETRYABLE_SQL, *arguments, job_ref=job_ref)
    row = settled(row)
    if row["outcome"] in ("retry_scheduled", "retry_duplicate"):
        return RetryScheduled(
            job_ref, row["next_attempt_at_unix_ms"], duplicate=row["outcome"] == "retry_duplicate"
        )
    return failure_outcome(row)  # the budget was spent: a permanent failure


async def expire_leases(
    conn: asyncpg.Connection,
    *,
    limit: int,
    event: EventDetails | Callable[[str], EventDetails],
) -> LeaseExpiry:
    """End up to ``limit`` expired leases: retry due now, or quarantine (``lease_expired``) with its event when the budget is spent.

    ``event`` gives the failure event's details, or a function of the job ref returning them
    (the job table has no tenant column, so a multi-tenant caller must look it up). With
    details, the sweep is one call and one transaction (the caller's, or its own). With a
    function, the sweep leaves each spent job leased and each is then quarantined by a call
    of its own, with its own details (in its own transaction unless the caller's is open).
    """
    sendable_integer("limit", limit)
    caller_owned = conn.is_in_transaction()
    details_for = event if callable(event) else None
    rows = await _expire(conn, limit, None if callable(event) else event_arguments(event))
    rescheduled: list[str] = []
    quarantined: list[FailureOutcome] = []
    conflicts: list[str] = []
    for row in rows:
        if row["outcome"] == "needs_event_details" and details_for is not None:
            job_ref = row["job_ref"]
            arguments = event_arguments(details_for(job_ref), job_ref=job_ref)
            try:
                again = await _expire(conn, 1, arguments, job_refs=[job_ref])
            except ConflictingReplay:
                if caller_owned:
                    raise  # the caller's transaction is aborted; nothing else can proceed in it
                conflicts.append(job_ref)
                continue
            if not again:
                continue  # a worker finished it, or another sweep took it, meanwhile
            row = again[0]
        match row["outcome"]:
            case "rescheduled":
                rescheduled.append(row["job_ref"])
            case "quarantined":
                quarantined.append(failure_outcome(row))
            case "refused":
                # Its event cannot be written (another event under its id, or one the
                # outbox's door would refuse): left leased, which the health sidecar counts.
                conflicts.append(row["job_ref"])
    return LeaseExpiry(tuple(sorted(rescheduled)), tuple(quarantined), tuple(conflicts))


async def _expire(
    conn: asyncpg.Connection,
    limit: int,
    details: EventArguments | None,
    *,
    job_refs: list[str] | None = None,
) -> list[Row]:
    """One call of ``outbox_relay_expire_leases``; without details, spent jobs come back as
    ``needs_event_details``. A refusal of the arguments themselves is raised."""
    if details is None:
        event: tuple[object, ...] = (None,) * 9
    else:
        event = details.as_tuple()
        event = event[:8] + event[9:]  # the sweep derives each job's id: no event_id
    rows = await call(conn, EXPIRE_LEASES_SQL, limit, *event, job_refs, job_ref=None)
    if rows and rows[0]["outcome"] == "refused" and rows[0]["job_ref"] is None:
        raise refusal(rows[0])
    return rows


async def cancel_job(conn: asyncpg.Connection, *, job_ref: str) -> bool:
    """Cancel a queued, leased or retry-scheduled job; False when it was already cancelled."""
    validate_ref("job_ref", job_ref)
    async with outcome_transaction(conn):
        state = await conn.fetchval(LOCK_JOB_STATE_SQL, job_ref)
        if state is None:
            raise UnknownJob(f"no scoring job {job_ref!r}", job_ref=job_ref)
        if state == "cancelled":
            return False
        if state in ("completed", "quarantined"):
            raise NotCancellable(
                f"job {job_ref!r} is {state}; a terminal job cannot be cancelled",
                job_ref=job_ref,
                state=state,
            )
        await conn.execute(CANCEL_JOB_SQL, job_ref)
        return True
