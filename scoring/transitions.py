"""Pure decisions over a locked scoring-job row: may this outcome be applied, is it a
replay, or must it be refused? No I/O here, so every rule has a fast table-driven test.

The order of checks follows the scoring service: an already-terminal job is judged
first (an exact replay is a duplicate even after the lease window), then the state,
then the fence, then the lease expiry by the database clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scoring.errors import (
    ConflictingCompletion,
    ConflictingFailure,
    LeaseExpired,
    NotLeased,
    StaleLease,
)


@dataclass(frozen=True, slots=True)
class JobRow:
    """The columns of a locked ``scoring_job_state`` row the decisions read, plus the database clock."""

    state: str
    attempt_count: int
    max_attempts: int
    active_fencing_token: int | None
    lease_expires_at_unix_ms: int | None
    next_attempt_at_unix_ms: int | None
    result_ref: str | None
    completed_fencing_token: int | None
    last_failure_code: str | None
    updated_at_unix_ms: int
    now_unix_ms: int


class Decision(enum.Enum):
    """What to do with a requested outcome."""

    APPLY = "apply"  # transition the leased job
    DUPLICATE = "duplicate"  # the job already has exactly this outcome
    RETRY = "retry"  # retryable failure with budget left: schedule the next attempt
    DUPLICATE_RETRY = "duplicate_retry"  # this retryable failure was already recorded


def lease_is_expired(row: JobRow) -> bool:
    """Expired means the expiry is earlier than the database clock, as the health probe counts it."""
    return (
        row.lease_expires_at_unix_ms is not None and row.lease_expires_at_unix_ms < row.now_unix_ms
    )


def check_live_lease(job_ref: str, row: JobRow, fencing_token: int) -> None:
    """Refuse unless the job is leased under ``fencing_token`` and the lease has not expired."""
    if row.state != "leased":
        raise NotLeased(
            f"job {job_ref!r} is {row.state}, not leased", job_ref=job_ref, state=row.state
        )
    if row.active_fencing_token != fencing_token:
        raise StaleLease(
            f"job {job_ref!r}: fencing token {fencing_token} is stale "
            f"(current {row.active_fencing_token})",
            job_ref=job_ref,
            given=fencing_token,
            current=row.active_fencing_token,
        )
    if lease_is_expired(row):
        assert row.lease_expires_at_unix_ms is not None  # lease_is_expired checked it
        raise LeaseExpired(
            f"job {job_ref!r}: lease expired at {row.lease_expires_at_unix_ms} "
            f"(database clock {row.now_unix_ms})",
            job_ref=job_ref,
            expired_at_unix_ms=row.lease_expires_at_unix_ms,
            now_unix_ms=row.now_unix_ms,
        )


def decide_completion(job_ref: str, row: JobRow, fencing_token: int, result_ref: str) -> Decision:
    """APPLY or DUPLICATE for a completion, else raise the refusal."""
    if row.state == "completed":
        if row.result_ref == result_ref and row.completed_fencing_token == fencing_token:
            return Decision.DUPLICATE
        raise ConflictingCompletion(
            f"job {job_ref!r} already completed with another result or fence",
            job_ref=job_ref,
        )
    if row.state == "quarantined":
        raise ConflictingCompletion(
            f"job {job_ref!r} already failed permanently ({row.last_failure_code})",
            job_ref=job_ref,
        )
    check_live_lease(job_ref, row, fencing_token)
    return Decision.APPLY


def _judge_terminal_failure(
    job_ref: str, row: JobRow, fencing_token: int, cause_code: str
) -> Decision | None:
    """DUPLICATE for an exact replay of a quarantine, a refusal for a conflicting outcome."""
    if row.state == "quarantined":
        # A quarantined job keeps attempt_count, which was the fence of the lease it ended.
        if row.last_failure_code == cause_code and row.attempt_count == fencing_token:
            return Decision.DUPLICATE
        raise ConflictingFailure(
            f"job {job_ref!r} already failed permanently with another cause or fence",
            job_ref=job_ref,
        )
    if row.state == "completed":
        raise ConflictingFailure(f"job {job_ref!r} already completed", job_ref=job_ref)
    return None


def decide_permanent_failure(
    job_ref: str, row: JobRow, fencing_token: int, cause_code: str
) -> Decision:
    """APPLY or DUPLICATE for a permanent failure, else raise the refusal."""
    terminal = _judge_terminal_failure(job_ref, row, fencing_token, cause_code)
    if terminal is not None:
        return terminal
    check_live_lease(job_ref, row, fencing_token)
    return Decision.APPLY


def decide_retryable_failure(
    job_ref: str, row: JobRow, fencing_token: int, cause_code: str
) -> Decision:
    """RETRY while budget is left, APPLY (quarantine) when it is spent; replays are duplicates."""
    terminal = _judge_terminal_failure(job_ref, row, fencing_token, cause_code)
    if terminal is not None:
        return terminal
    if (
        row.state == "retry_scheduled"
        and row.attempt_count == fencing_token
        and row.last_failure_code == cause_code
    ):
        return Decision.DUPLICATE_RETRY
    check_live_lease(job_ref, row, fencing_token)
    if row.attempt_count >= row.max_attempts:
        return Decision.APPLY
    return Decision.RETRY


def expiry_applies(row: JobRow, fencing_token: int) -> bool:
    """True when the lease under ``fencing_token`` is still held and has expired: the sweeper may act."""
    return (
        row.state == "leased"
        and row.active_fencing_token == fencing_token
        and lease_is_expired(row)
    )
