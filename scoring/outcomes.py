"""What the public calls return: what happened to the job row, and to its outbox event."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass


class Completion(enum.StrEnum):
    """What happened to the job row on a completion call."""

    COMPLETED = "completed"
    DUPLICATE = "duplicate"


class Failure(enum.StrEnum):
    """What happened to the job row on a permanent-failure call."""

    QUARANTINED = "quarantined"
    DUPLICATE = "duplicate"


class Enqueue(enum.StrEnum):
    """What happened to the outbox event: inserted now, or already there (pending or published)."""

    INSERTED = "inserted"
    DUPLICATE = "duplicate"


@dataclass(frozen=True, slots=True)
class CompletionOutcome:
    """The (Completed | Duplicate, Inserted | Duplicate) pair of a completion, with the event id."""

    job_ref: str
    completion: Completion
    enqueue: Enqueue
    event_id: uuid.UUID
    occurred_at_unix_ms: int


@dataclass(frozen=True, slots=True)
class FailureOutcome:
    """The (Quarantined | Duplicate, Inserted | Duplicate) pair of a permanent failure."""

    job_ref: str
    failure: Failure
    enqueue: Enqueue
    event_id: uuid.UUID
    occurred_at_unix_ms: int


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A lease on one job: finish it with ``fencing_token`` before ``lease_expires_at_unix_ms``."""

    job_ref: str
    request_ref: str
    worker_ref: str
    lease_ref: str
    fencing_token: int
    max_attempts: int
    lease_expires_at_unix_ms: int


@dataclass(frozen=True, slots=True)
class RetryScheduled:
    """A retryable failure was recorded; the job is due again at ``next_attempt_at_unix_ms``."""

    job_ref: str
    next_attempt_at_unix_ms: int
    duplicate: bool  # True: this same failure had already been recorded


@dataclass(frozen=True, slots=True)
class LeaseExpiry:
    """What one ``expire_leases`` pass did."""

    rescheduled: tuple[str, ...]  # back to retry_scheduled, due now
    quarantined: tuple[FailureOutcome, ...]  # budget spent: quarantined with their event
    conflicts: tuple[str, ...]  # quarantine refused by ConflictingReplay; left leased
