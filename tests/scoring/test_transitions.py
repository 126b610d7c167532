"""Table-driven tests of the pure outcome decisions (no database)."""

from __future__ import annotations

import dataclasses

import pytest

from scoring.errors import (
    ConflictingCompletion,
    ConflictingFailure,
    LeaseExpired,
    NotLeased,
    ScoringWriteError,
    StaleLease,
)
from scoring.transitions import (
    Decision,
    JobRow,
    decide_completion,
    decide_permanent_failure,
    decide_retryable_failure,
    expiry_applies,
)

NOW = 1_700_000_000_000

LEASED = JobRow(
    state="leased",
    attempt_count=2,
    max_attempts=3,
    active_fencing_token=2,
    lease_expires_at_unix_ms=NOW + 1000,
    next_attempt_at_unix_ms=None,
    result_ref=None,
    completed_fencing_token=None,
    last_failure_code="boom",
    updated_at_unix_ms=NOW - 10,
    now_unix_ms=NOW,
)
COMPLETED = dataclasses.replace(
    LEASED,
    state="completed",
    active_fencing_token=None,
    lease_expires_at_unix_ms=None,
    result_ref="r-1",
    completed_fencing_token=2,
)
QUARANTINED = dataclasses.replace(
    LEASED,
    state="quarantined",
    active_fencing_token=None,
    lease_expires_at_unix_ms=None,
    last_failure_code="bad_input",
)
RETRY = dataclasses.replace(
    LEASED,
    state="retry_scheduled",
    active_fencing_token=None,
    lease_expires_at_unix_ms=None,
    next_attempt_at_unix_ms=NOW + 5,
)
EXPIRED = dataclasses.replace(LEASED, lease_expires_at_unix_ms=NOW - 1)
LAST_ATTEMPT = dataclasses.replace(LEASED, attempt_count=3, active_fencing_token=3)

Outcome = Decision | type[ScoringWriteError]


@pytest.mark.parametrize(
    ("row", "fence", "result_ref", "expected"),
    [
        (LEASED, 2, "r-1", Decision.APPLY),
        (dataclasses.replace(LEASED, lease_expires_at_unix_ms=NOW), 2, "r-1", Decision.APPLY),
        (EXPIRED, 2, "r-1", LeaseExpired),
        (LEASED, 1, "r-1", StaleLease),
        (EXPIRED, 1, "r-1", StaleLease),  # the fence is judged before the clock
        (RETRY, 2, "r-1", NotLeased),
        (dataclasses.replace(LEASED, state="queued"), 2, "r-1", NotLeased),
        (COMPLETED, 2, "r-1", Decision.DUPLICATE),
        (COMPLETED, 2, "r-2", ConflictingCompletion),
        (COMPLETED, 1, "r-1", ConflictingCompletion),
        (QUARANTINED, 2, "r-1", ConflictingCompletion),
    ],
)
def test_completion(row: JobRow, fence: int, result_ref: str, expected: Outcome) -> None:
    _check(lambda: decide_completion("job-1", row, fence, result_ref), expected)


@pytest.mark.parametrize(
    ("row", "fence", "cause", "expected"),
    [
        (LEASED, 2, "bad_input", Decision.APPLY),
        (EXPIRED, 2, "bad_input", LeaseExpired),
        (LEASED, 3, "bad_input", StaleLease),
        (RETRY, 2, "bad_input", NotLeased),
        (QUARANTINED, 2, "bad_input", Decision.DUPLICATE),
        (QUARANTINED, 2, "other", ConflictingFailure),
        (QUARANTINED, 1, "bad_input", ConflictingFailure),
        (COMPLETED, 2, "bad_input", ConflictingFailure),
    ],
)
def test_permanent_failure(row: JobRow, fence: int, cause: str, expected: Outcome) -> None:
    _check(lambda: decide_permanent_failure("job-1", row, fence, cause), expected)


@pytest.mark.parametrize(
    ("row", "fence", "cause", "expected"),
    [
        (LEASED, 2, "boom", Decision.RETRY),
        (LAST_ATTEMPT, 3, "boom", Decision.APPLY),  # budget spent: quarantine
        (EXPIRED, 2, "boom", LeaseExpired),
        (LEASED, 1, "boom", StaleLease),
        (RETRY, 2, "boom", Decision.DUPLICATE_RETRY),
        (RETRY, 2, "other", NotLeased),
        (RETRY, 1, "boom", NotLeased),
        (dataclasses.replace(QUARANTINED, last_failure_code="boom"), 2, "boom", Decision.DUPLICATE),
        (QUARANTINED, 2, "boom", ConflictingFailure),
        (COMPLETED, 2, "boom", ConflictingFailure),
    ],
)
def test_retryable_failure(row: JobRow, fence: int, cause: str, expected: Outcome) -> None:
    _check(lambda: decide_retryable_failure("job-1", row, fence, cause), expected)


@pytest.mark.parametrize(
    ("row", "fence", "expected"),
    [(EXPIRED, 2, True), (EXPIRED, 1, False), (LEASED, 2, False), (RETRY, 2, False)],
)
def test_expiry_applies_only_to_the_same_expired_lease(
    row: JobRow, fence: int, expected: bool
) -> None:
    assert expiry_applies(row, fence) is expected


def test_refusals_carry_structured_fields() -> None:
    with pytest.raises(LeaseExpired) as expired:
        decide_completion("job-1", EXPIRED, 2, "r-1")
    assert (expired.value.job_ref, expired.value.expired_at_unix_ms, expired.value.now_unix_ms) == (
        "job-1",
        NOW - 1,
        NOW,
    )
    with pytest.raises(StaleLease) as stale:
        decide_completion("job-1", LEASED, 1, "r-1")
    assert (stale.value.given, stale.value.current) == (1, 2)


def _check(decide: object, expected: Outcome) -> None:
    assert callable(decide)
    if isinstance(expected, Decision):
        assert decide() is expected
    else:
        with pytest.raises(expected):
            decide()
