"""The worker SDK against a real PostgreSQL: claim, retryable failure, lease expiry, cancel."""

from __future__ import annotations

import asyncpg
import pytest

from contracts.envelope import JobFailed, decode_outcome_event
from scoring.errors import InvalidArgument, LeaseExpired, NotCancellable, NotLeased, StaleLease
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.worker import (
    LEASE_EXPIRED,
    RetryScheduled,
    cancel_job,
    claim_next_due,
    enqueue_job,
    expire_leases,
    exponential_backoff_ms,
    fail_retryable,
)
from scoring.writer import Enqueue, EventDetails, Failure, FailureOutcome
from tests.support.scoring_jobs import COMPLETION, FAILURE, events, expire_lease, job, leased_job

CLOCK_SQL = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


async def _fail_retryable(
    conn: asyncpg.Connection,
    fencing_token: int,
    details: EventDetails,
    *,
    retry_delay_ms: int = 0,
) -> RetryScheduled | FailureOutcome:
    """Report a ``timeout`` of job-1 under ``fencing_token``."""
    return await fail_retryable(
        conn,
        job_ref="job-1",
        fencing_token=fencing_token,
        cause_code="timeout",
        retry_delay_ms=retry_delay_ms,
        event=details,
    )


async def test_claim_takes_the_oldest_due_job_by_created_at_then_ref(
    db: asyncpg.Connection,
) -> None:
    for ref in ("job-b", "job-a", "job-c"):
        await enqueue_job(db, job_ref=ref, request_ref=f"req-{ref}", max_attempts=2)
    # job-a and job-b share a created_at: the ref breaks the tie.
    await db.execute(
        "UPDATE scoring_job_state SET created_at = '2024-01-01' WHERE scoring_job_ref IN ('job-a', 'job-b')"
    )
    before = await db.fetchval(CLOCK_SQL)
    claimed = [await claim_next_due(db, worker_ref="worker-a", lease_ms=30_000) for _ in range(4)]
    after = await db.fetchval(CLOCK_SQL)
    assert [c.job_ref if c else None for c in claimed] == ["job-a", "job-b", "job-c", None]
    first = claimed[0]
    assert first is not None
    assert (first.fencing_token, first.request_ref, first.max_attempts) == (1, "req-job-a", 2)
    assert before + 30_000 <= first.lease_expires_at_unix_ms <= after + 30_000
    row = await job(db, "job-a")
    assert (row["scoring_state"], row["attempt_count"], row["active_fencing_token"]) == (
        "leased",
        1,
        1,
    )
    assert (row["active_worker_ref"], row["active_lease_ref"]) == ("worker-a", first.lease_ref)


async def test_enqueue_is_idempotent_and_validates_refs(db: asyncpg.Connection) -> None:
    assert await enqueue_job(db, job_ref="job-1", request_ref="req-1", max_attempts=3) is True
    assert await enqueue_job(db, job_ref="job-1", request_ref="req-1", max_attempts=3) is False
    for kwargs in (
        {"job_ref": "123", "request_ref": "req-1", "max_attempts": 1},
        {"job_ref": "job-2", "request_ref": "req-1 ", "max_attempts": 1},
        {"job_ref": "job-2", "request_ref": "req-1", "max_attempts": 0},
    ):
        with pytest.raises(InvalidArgument):
            await enqueue_job(db, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="worker_ref"):
        await claim_next_due(db, worker_ref="7", lease_ms=1000)
    with pytest.raises(InvalidArgument, match="lease_ms"):
        await claim_next_due(db, worker_ref="worker-a", lease_ms=0)


async def test_retryable_failure_schedules_the_next_attempt(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db, max_attempts=3)
    before = await db.fetchval(CLOCK_SQL)
    retry = await _fail_retryable(db, claimed.fencing_token, details, retry_delay_ms=60_000)
    assert isinstance(retry, RetryScheduled)
    assert retry.next_attempt_at_unix_ms >= before + 60_000
    assert not retry.duplicate
    row = await job(db)
    assert (row["scoring_state"], row["last_failure_code"], row["active_lease_ref"]) == (
        "retry_scheduled",
        "timeout",
        None,
    )
    # A replay of the same failure is recognised; the job is not due yet, so nobody claims it.
    again = await _fail_retryable(db, claimed.fencing_token, details, retry_delay_ms=60_000)
    assert again == RetryScheduled("job-1", retry.next_attempt_at_unix_ms, duplicate=True)
    assert await claim_next_due(db, worker_ref="worker-b", lease_ms=1000) is None
    await db.execute("UPDATE scoring_job_state SET next_attempt_at_unix_ms = 1")
    reclaimed = await claim_next_due(db, worker_ref="worker-b", lease_ms=1000)
    assert reclaimed is not None
    assert reclaimed.fencing_token == 2
    assert await events(db) == []


async def test_retryable_failure_with_the_budget_spent_quarantines_with_its_event(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db, max_attempts=1)
    outcome = await _fail_retryable(db, claimed.fencing_token, details)
    assert isinstance(outcome, FailureOutcome)
    assert (outcome.failure, outcome.enqueue) == (Failure.QUARANTINED, Enqueue.INSERTED)
    assert outcome.event_id == terminal_event_id("job-1", OutcomeKind.FAILED, "timeout")
    row = await job(db)
    assert (row["scoring_state"], row["last_failure_code"]) == ("quarantined", "timeout")
    [event] = await events(db)
    assert decode_outcome_event(event["payload"]).data == JobFailed("job-1", "timeout", None)
    replay = await _fail_retryable(db, claimed.fencing_token, details)
    assert isinstance(replay, FailureOutcome)
    assert (replay.failure, replay.enqueue) == (Failure.DUPLICATE, Enqueue.DUPLICATE)


async def test_retryable_failure_is_fenced(db: asyncpg.Connection, details: EventDetails) -> None:
    claimed = await leased_job(db)
    with pytest.raises(StaleLease):
        await _fail_retryable(db, 9, details)
    await expire_lease(db, "job-1")
    with pytest.raises(LeaseExpired):
        await _fail_retryable(db, claimed.fencing_token, details)
    assert (await job(db))["scoring_state"] == "leased"


async def test_expired_leases_are_rescheduled_or_quarantined_with_their_event(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    retry = await leased_job(db, "job-retry", max_attempts=2)
    spent = await leased_job(db, "job-spent", max_attempts=1)
    await leased_job(db, "job-live", max_attempts=1)
    await expire_lease(db, "job-retry")
    await expire_lease(db, "job-spent")

    result = await expire_leases(db, limit=10, event=lambda ref: details)
    assert result.rescheduled == ("job-retry",)
    assert [q.job_ref for q in result.quarantined] == ["job-spent"]
    assert result.conflicts == ()
    [quarantined] = result.quarantined
    assert quarantined.event_id == terminal_event_id("job-spent", OutcomeKind.FAILED, LEASE_EXPIRED)

    rescheduled = await job(db, "job-retry")
    assert (rescheduled["scoring_state"], rescheduled["last_failure_code"]) == (
        "retry_scheduled",
        LEASE_EXPIRED,
    )
    assert rescheduled["next_attempt_at_unix_ms"] <= await db.fetchval(CLOCK_SQL)  # due now
    assert (await job(db, "job-spent"))["scoring_state"] == "quarantined"
    assert (await job(db, "job-live"))["scoring_state"] == "leased"
    [event] = await events(db)
    assert (event["aggregateid"], event["type"]) == ("job-spent", "scoring.job.failed")

    # The dead worker's late completion is refused; the job goes to a new lease.
    with pytest.raises(NotLeased):
        await COMPLETION.apply(
            db, job_ref="job-retry", fencing_token=retry.fencing_token, event=details
        )
    again = await claim_next_due(db, worker_ref="worker-b", lease_ms=1000)
    assert again is not None
    assert (again.job_ref, again.fencing_token) == ("job-retry", 2)
    # The worker whose lease was quarantined sees the terminal outcome as a conflict.
    with pytest.raises(Exception, match="already failed"):
        await COMPLETION.apply(
            db, job_ref="job-spent", fencing_token=spent.fencing_token, event=details
        )
    # Nothing left to expire.
    nothing = await expire_leases(db, limit=10, event=details)
    assert (nothing.rescheduled, nothing.quarantined) == ((), ())


async def test_expire_leases_respects_the_limit_oldest_expiry_first(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    for ref in ("job-1", "job-2", "job-3"):
        await leased_job(db, ref)
    await db.execute(
        "UPDATE scoring_job_state SET active_lease_expires_at_unix_ms = 10 WHERE scoring_job_ref = 'job-3'"
    )
    await db.execute(
        "UPDATE scoring_job_state SET active_lease_expires_at_unix_ms = 20 WHERE scoring_job_ref = 'job-1'"
    )
    first = await expire_leases(db, limit=1, event=details)
    assert first.rescheduled == ("job-3",)
    second = await expire_leases(db, limit=5, event=details)
    assert second.rescheduled == ("job-1",)


async def test_a_quarantined_expired_lease_replays_as_duplicate_for_the_worker(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db, max_attempts=1)
    await expire_lease(db, "job-1")
    await expire_leases(db, limit=10, event=details)
    outcome = await FAILURE.apply(
        db, fencing_token=claimed.fencing_token, ref=LEASE_EXPIRED, event=details
    )
    assert (outcome.failure, outcome.enqueue) == (Failure.DUPLICATE, Enqueue.DUPLICATE)
    assert len(await events(db)) == 1


async def test_cancel(db: asyncpg.Connection, details: EventDetails) -> None:
    claimed = await leased_job(db, "job-l")
    await enqueue_job(db, job_ref="job-q", request_ref="req-q", max_attempts=1)
    assert await cancel_job(db, job_ref="job-q") is True
    assert await cancel_job(db, job_ref="job-q") is False
    assert await cancel_job(db, job_ref="job-l") is True
    row = await job(db, "job-l")
    assert (row["scoring_state"], row["active_lease_ref"]) == ("cancelled", None)
    with pytest.raises(NotLeased):
        await COMPLETION.apply(
            db, job_ref="job-l", fencing_token=claimed.fencing_token, event=details
        )
    done = await leased_job(db, "job-d")
    await COMPLETION.apply(db, job_ref="job-d", fencing_token=done.fencing_token, event=details)
    with pytest.raises(NotCancellable):
        await cancel_job(db, job_ref="job-d")


@pytest.mark.parametrize(
    ("attempt", "expected"), [(0, 0), (1, 100), (2, 200), (3, 400), (5, 1000), (200, 1000)]
)
def test_exponential_backoff(attempt: int, expected: int) -> None:
    assert exponential_backoff_ms(attempt, base_ms=100, cap_ms=1000) == expected
