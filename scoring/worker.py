"""The rest of a small worker SDK over ``scoring_job_state``: enqueue, claim the next due
job, retryable failure, lease expiry and cancellation.

Every path that ends a job permanently (a retryable failure with its budget spent, an
expired lease with its budget spent) goes through the same permanent-failure path as the
writer (:func:`scoring.store.fail_under_lock`), so the quarantine and its event commit
together.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Final

import asyncpg

from contracts.envelope import JsonValue
from scoring.errors import ConflictingReplay, NotCancellable
from scoring.events import (
    EventDetails,
    prepare_failure_event,
    validate_cause_code,
    validate_duration_ms,
    validate_fencing_token,
    validate_ref,
)
from scoring.outcomes import ClaimedJob, FailureOutcome, LeaseExpiry, RetryScheduled
from scoring.sql import (
    CANCEL_JOB_SQL,
    CLAIM_NEXT_DUE_SQL,
    ENQUEUE_JOB_SQL,
    EXPIRE_LEASES_SQL,
    RETRY_JOB_SQL,
)
from scoring.store import fail_under_lock, fenced_transition, lock_job, outcome_transaction
from scoring.transitions import Decision, JobRow, decide_retryable_failure, expiry_applies

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
    validate_ref("job_ref", job_ref)
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
    validate_ref("job_ref", job_ref)
    validate_fencing_token(fencing_token, job_ref=job_ref)
    validate_cause_code(cause_code, job_ref=job_ref)
    validate_duration_ms("retry_delay_ms", retry_delay_ms, minimum=0)
    # Validated now, before any write, although it is only used when the budget is spent.
    prepared = prepare_failure_event(
        job_ref=job_ref, cause_code=cause_code, detail=detail, event=event
    )

    async def decide(row: JobRow) -> Decision | RetryScheduled:
        decision = decide_retryable_failure(job_ref, row, fencing_token, cause_code)
        if decision is Decision.DUPLICATE_RETRY:
            assert row.next_attempt_at_unix_ms is not None  # retry_scheduled has one (CHECK)
            return RetryScheduled(job_ref, row.next_attempt_at_unix_ms, duplicate=True)
        if decision is Decision.RETRY:
            next_at = await fenced_transition(
                conn, row, RETRY_JOB_SQL, job_ref, fencing_token, cause_code, retry_delay_ms
            )
            return RetryScheduled(job_ref, next_at, duplicate=False)
        return decision  # the budget is spent: a permanent failure

    return await fail_under_lock(
        conn, prepared, decide, fencing_token=fencing_token, lease_must_be_expired=False
    )


async def expire_leases(
    conn: asyncpg.Connection,
    *,
    limit: int,
    event: EventDetails | Callable[[str], EventDetails],
) -> LeaseExpiry:
    """End up to ``limit`` expired leases: retry due now, or quarantine (``lease_expired``) with its event when the budget is spent.

    ``event`` gives the failure event's details, or a function of the job ref returning them
    (the job table has no tenant column, so a multi-tenant caller must look it up).
    """
    validate_duration_ms("limit", limit, minimum=1)
    caller_owned = conn.is_in_transaction()
    records = await conn.fetch(EXPIRE_LEASES_SQL, limit, LEASE_EXPIRED)
    rescheduled = tuple(r["scoring_job_ref"] for r in records if r["rescheduled"])
    quarantined: list[FailureOutcome] = []
    conflicts: list[str] = []
    for record in records:
        if record["rescheduled"]:
            continue
        job_ref, fencing_token = record["scoring_job_ref"], record["active_fencing_token"]
        prepared = prepare_failure_event(
            job_ref=job_ref,
            cause_code=LEASE_EXPIRED,
            detail=None,
            event=event(job_ref) if callable(event) else event,
        )

        # fencing_token is bound as a default: this record's, not whatever the loop holds later.
        async def still_expired(row: JobRow, fencing_token: int = fencing_token) -> Decision | None:
            # Re-checked under the lock: between the sweep and this transaction the worker
            # may have finished the job, or another sweeper may have got there first.
            return Decision.APPLY if expiry_applies(row, fencing_token) else None

        try:
            outcome = await fail_under_lock(
                conn,
                prepared,
                still_expired,
                fencing_token=fencing_token,
                lease_must_be_expired=True,
            )
        except ConflictingReplay:
            if caller_owned:
                raise  # the caller's transaction is aborted; nothing else can proceed in it
            conflicts.append(job_ref)
            continue
        if outcome is not None:
            quarantined.append(outcome)
    return LeaseExpiry(rescheduled, tuple(quarantined), tuple(conflicts))


async def cancel_job(conn: asyncpg.Connection, *, job_ref: str) -> bool:
    """Cancel a queued, leased or retry-scheduled job; False when it was already cancelled."""
    validate_ref("job_ref", job_ref)
    async with outcome_transaction(conn):
        row = await lock_job(conn, job_ref)
        if row.state == "cancelled":
            return False
        if row.state in ("completed", "quarantined"):
            raise NotCancellable(
                f"job {job_ref!r} is {row.state}; a terminal job cannot be cancelled",
                job_ref=job_ref,
                state=row.state,
            )
        await conn.execute(CANCEL_JOB_SQL, job_ref)
        return True
