"""The SQL functions' decisions, table-driven: each case puts one job in place, in a state the
scoring service's CHECKs allow, and asks for an outcome through the Python API (one call of
the function). The order of checks follows the scoring service: an already terminal job
first (an exact replay is a duplicate even after the lease window), then the state, the
fence, and the lease's expiry by the database clock. A refusal writes nothing."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import asyncpg
import pytest

from scoring.errors import (
    ConflictingCompletion,
    ConflictingFailure,
    LeaseExpired,
    NotLeased,
    ScoringWriteError,
    StaleLease,
)
from scoring.worker import RetryScheduled, expire_leases, fail_retryable
from scoring.writer import (
    Completion,
    CompletionOutcome,
    EventDetails,
    Failure,
    FailureOutcome,
    complete_job,
    fail_job_permanently,
)
from tests.support.scoring_jobs import events, job


@dataclasses.dataclass(frozen=True)
class Shape:
    """A job row as the scoring service may leave it; times are relative to the database clock."""

    state: str
    attempt_count: int
    max_attempts: int = 3
    fence: int | None = None  # active_fencing_token, when leased
    expires_in_ms: int | None = None
    result_ref: str | None = None
    completed_fencing_token: int | None = None
    last_failure_code: str | None = None
    next_attempt_in_ms: int | None = None


LEASED = Shape("leased", 2, fence=2, expires_in_ms=60_000, last_failure_code="boom")
EXPIRED = dataclasses.replace(LEASED, expires_in_ms=-1_000)
LAST_ATTEMPT = dataclasses.replace(LEASED, attempt_count=3, fence=3)
EXPIRED_LAST_ATTEMPT = dataclasses.replace(LAST_ATTEMPT, expires_in_ms=-1_000)
COMPLETED = Shape("completed", 2, result_ref="r-1", completed_fencing_token=2)
QUARANTINED = Shape("quarantined", 2, last_failure_code="bad_input")
RETRY = Shape("retry_scheduled", 2, last_failure_code="boom", next_attempt_in_ms=5)
QUEUED = Shape("queued", 0)

PUT_JOB_SQL = """
WITH clock AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms)
INSERT INTO scoring_job_state (
    scoring_job_ref, scoring_request_ref, scoring_state, attempt_count, max_attempts,
    next_attempt_at_unix_ms, last_failure_code, active_worker_ref, active_lease_ref,
    active_fencing_token, active_lease_expires_at_unix_ms, result_ref, completed_fencing_token)
SELECT $1, 'req-1', $2, $3, $4, clock.now_ms + $5::bigint, $6,
       CASE WHEN $2 = 'leased' THEN 'worker-a' END, CASE WHEN $2 = 'leased' THEN 'lease-1' END,
       $7, clock.now_ms + $8::bigint, $9, $10
FROM clock
"""

DETAILS = EventDetails(
    source="urn:scoring-worker", tenant_ref="tenant-a", correlation_ref="corr-1", schema_version="1"
)

# What the call returns (its enum), or the refusal it raises; for a retryable failure,
# also "retry" / "retry_duplicate" (a RetryScheduled).
Expected = enum.StrEnum | type[ScoringWriteError] | str


async def put(db: asyncpg.Connection, shape: Shape, job_ref: str = "job-1") -> None:
    await db.execute(
        PUT_JOB_SQL,
        job_ref,
        shape.state,
        shape.attempt_count,
        shape.max_attempts,
        shape.next_attempt_in_ms,
        shape.last_failure_code,
        shape.fence,
        shape.expires_in_ms,
        shape.result_ref,
        shape.completed_fencing_token,
    )


async def _decide(db: asyncpg.Connection, shape: Shape, call: Any, expected: Expected) -> object:
    """Put ``shape`` in place and call; a refusal must leave the job and the outbox as they were."""
    await put(db, shape)
    before = await job(db)
    if isinstance(expected, type):
        with pytest.raises(expected):
            await call()
        assert await job(db) == before, "a refusal changed the job"
        assert await events(db) == [], "a refusal wrote an event"
        return None
    return await call()


@pytest.mark.parametrize(
    ("shape", "fence", "result_ref", "expected"),
    [
        (LEASED, 2, "r-1", Completion.COMPLETED),
        (EXPIRED, 2, "r-1", LeaseExpired),
        (LEASED, 1, "r-1", StaleLease),
        (EXPIRED, 1, "r-1", StaleLease),  # the fence is judged before the clock
        (RETRY, 2, "r-1", NotLeased),
        (QUEUED, 1, "r-1", NotLeased),
        (COMPLETED, 2, "r-1", Completion.DUPLICATE),
        (COMPLETED, 2, "r-2", ConflictingCompletion),
        (COMPLETED, 1, "r-1", ConflictingCompletion),
        (QUARANTINED, 2, "r-1", ConflictingCompletion),
    ],
)
async def test_completion(
    db: asyncpg.Connection, shape: Shape, fence: int, result_ref: str, expected: Expected
) -> None:
    async def call() -> CompletionOutcome:
        return await complete_job(
            db, job_ref="job-1", fencing_token=fence, result_ref=result_ref, event=DETAILS
        )

    outcome = await _decide(db, shape, call, expected)
    if isinstance(outcome, CompletionOutcome):
        assert outcome.completion is expected
        assert (await job(db))["scoring_state"] == "completed"
        assert len(await events(db)) == 1


@pytest.mark.parametrize(
    ("shape", "fence", "cause", "expected"),
    [
        (LEASED, 2, "bad_input", Failure.QUARANTINED),
        (EXPIRED, 2, "bad_input", LeaseExpired),
        (LEASED, 3, "bad_input", StaleLease),
        (RETRY, 2, "bad_input", NotLeased),
        (QUARANTINED, 2, "bad_input", Failure.DUPLICATE),
        (QUARANTINED, 2, "other", ConflictingFailure),
        (QUARANTINED, 1, "bad_input", ConflictingFailure),
        (COMPLETED, 2, "bad_input", ConflictingFailure),
    ],
)
async def test_permanent_failure(
    db: asyncpg.Connection, shape: Shape, fence: int, cause: str, expected: Expected
) -> None:
    async def call() -> FailureOutcome:
        return await fail_job_permanently(
            db, job_ref="job-1", fencing_token=fence, cause_code=cause, event=DETAILS
        )

    outcome = await _decide(db, shape, call, expected)
    if isinstance(outcome, FailureOutcome):
        assert outcome.failure is expected
        assert (await job(db))["scoring_state"] == "quarantined"
        assert len(await events(db)) == 1


@pytest.mark.parametrize(
    ("shape", "fence", "cause", "expected"),
    [
        (LEASED, 2, "boom", "retry"),
        (LAST_ATTEMPT, 3, "boom", Failure.QUARANTINED),  # budget spent: quarantine
        (EXPIRED, 2, "boom", LeaseExpired),
        (LEASED, 1, "boom", StaleLease),
        (RETRY, 2, "boom", "retry_duplicate"),
        (RETRY, 2, "other", NotLeased),
        (RETRY, 1, "boom", NotLeased),
        (dataclasses.replace(QUARANTINED, last_failure_code="boom"), 2, "boom", Failure.DUPLICATE),
        (QUARANTINED, 2, "boom", ConflictingFailure),
        (COMPLETED, 2, "boom", ConflictingFailure),
    ],
)
async def test_retryable_failure(
    db: asyncpg.Connection, shape: Shape, fence: int, cause: str, expected: Expected
) -> None:
    async def call() -> RetryScheduled | FailureOutcome:
        return await fail_retryable(
            db,
            job_ref="job-1",
            fencing_token=fence,
            cause_code=cause,
            retry_delay_ms=60_000,
            event=DETAILS,
        )

    outcome = await _decide(db, shape, call, expected)
    if expected in ("retry", "retry_duplicate"):
        assert isinstance(outcome, RetryScheduled)
        assert outcome.duplicate is (expected == "retry_duplicate")
        row = await job(db)
        assert (row["scoring_state"], row["last_failure_code"]) == ("retry_scheduled", "boom")
        assert outcome.next_attempt_at_unix_ms == row["next_attempt_at_unix_ms"]
        assert await events(db) == []
    elif isinstance(outcome, FailureOutcome):
        assert outcome.failure is expected
        assert (await job(db))["scoring_state"] == "quarantined"
        assert len(await events(db)) == 1


@pytest.mark.parametrize(
    ("shape", "swept"),
    [
        (EXPIRED, "rescheduled"),
        (EXPIRED_LAST_ATTEMPT, "quarantined"),
        (LEASED, None),
        (RETRY, None),
        (COMPLETED, None),
    ],
)
async def test_lease_expiry_ends_only_expired_leases(
    db: asyncpg.Connection, shape: Shape, swept: str | None
) -> None:
    await put(db, shape)
    before = await job(db)
    result = await expire_leases(db, limit=10, event=DETAILS)
    after = await job(db)
    if swept is None:
        assert (result.rescheduled, result.quarantined, result.conflicts) == ((), (), ())
        assert after == before
        return
    if swept == "rescheduled":
        assert result.rescheduled == ("job-1",)
        assert (after["scoring_state"], after["last_failure_code"]) == (
            "retry_scheduled",
            "lease_expired",
        )
        assert await events(db) == []
    else:
        assert [q.job_ref for q in result.quarantined] == ["job-1"]
        assert (after["scoring_state"], after["last_failure_code"]) == (
            "quarantined",
            "lease_expired",
        )
        assert len(await events(db)) == 1
    assert after["active_lease_ref"] is None


async def test_refusals_carry_structured_fields(db: asyncpg.Connection) -> None:
    await put(db, EXPIRED)
    with pytest.raises(LeaseExpired) as expired:
        await complete_job(db, job_ref="job-1", fencing_token=2, result_ref="r-1", event=DETAILS)
    assert expired.value.job_ref == "job-1"
    assert 0 < expired.value.expired_at_unix_ms < expired.value.now_unix_ms
    assert expired.value.now_unix_ms - expired.value.expired_at_unix_ms >= 1_000
    with pytest.raises(StaleLease) as stale:
        await complete_job(db, job_ref="job-1", fencing_token=1, result_ref="r-1", event=DETAILS)
    assert (stale.value.given, stale.value.current) == (1, 2)
    await put(db, RETRY, "job-2")
    with pytest.raises(NotLeased) as not_leased:
        await complete_job(db, job_ref="job-2", fencing_token=2, result_ref="r-1", event=DETAILS)
    assert not_leased.value.state == "retry_scheduled"
