"""Errors of the scoring outcome writer and worker SDK; all derive from :class:`ScoringWriteError`."""

from __future__ import annotations

import uuid

from contracts.errors import OutboxRelayError, SchemaNotMigrated


class ScoringWriteError(OutboxRelayError):
    """Root of every refusal of the scoring writer; ``job_ref`` names the job when known."""

    def __init__(self, message: str, *, job_ref: str | None = None) -> None:
        super().__init__(message)
        self.job_ref = job_ref


class InvalidArgument(ScoringWriteError, ValueError):
    """An argument was refused before anything was written; ``field`` names it."""

    def __init__(self, message: str, *, field: str, job_ref: str | None = None) -> None:
        super().__init__(message, job_ref=job_ref)
        self.field = field


class InvalidEnvelope(InvalidArgument):
    """The event's envelope or payload is invalid; nothing was written."""


class EventTooLarge(InvalidEnvelope):
    """The event's payload is larger than the broker would take; nothing was written."""

    def __init__(
        self, message: str, *, field: str, job_ref: str, size_bytes: int, limit_bytes: int
    ) -> None:
        super().__init__(message, field=field, job_ref=job_ref)
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes


class EventIdMismatch(InvalidEnvelope):
    """A caller-supplied event id differs from the one derived from the job and its outcome."""


class UnknownJob(ScoringWriteError):
    """No scoring job has this ref."""


class NotLeased(ScoringWriteError):
    """The job is not leased (``state`` says what it is), so no worker may finish it."""

    def __init__(self, message: str, *, job_ref: str, state: str) -> None:
        super().__init__(message, job_ref=job_ref)
        self.state = state


class StaleLease(ScoringWriteError):
    """The caller's fencing token is not the job's current one: another claim superseded it."""

    def __init__(self, message: str, *, job_ref: str, given: int, current: int | None) -> None:
        super().__init__(message, job_ref=job_ref)
        self.given = given
        self.current = current


class LeaseExpired(ScoringWriteError):
    """The lease expired by the database clock before the outcome arrived."""

    def __init__(
        self, message: str, *, job_ref: str, expired_at_unix_ms: int, now_unix_ms: int
    ) -> None:
        super().__init__(message, job_ref=job_ref)
        self.expired_at_unix_ms = expired_at_unix_ms
        self.now_unix_ms = now_unix_ms


class ConflictingCompletion(ScoringWriteError):
    """The job already has a different terminal outcome than this completion."""


class ConflictingFailure(ScoringWriteError):
    """The job already has a different terminal outcome than this failure."""


class ConflictingReplay(ScoringWriteError):
    """An outbox event with the derived id exists with different content; the transaction was rolled back."""

    def __init__(self, message: str, *, job_ref: str | None, event_id: uuid.UUID) -> None:
        super().__init__(message, job_ref=job_ref)
        self.event_id = event_id


class NotCancellable(ScoringWriteError):
    """The job already reached a terminal outcome (completed or quarantined)."""

    def __init__(self, message: str, *, job_ref: str, state: str) -> None:
        super().__init__(message, job_ref=job_ref)
        self.state = state


class WriterNotMigrated(ScoringWriteError, SchemaNotMigrated):
    """The database lacks the migration whose SQL functions the writer calls (``migration``
    names it); ``outbox-relay migrate`` adds it. Nothing was written."""

    def __init__(self, message: str, *, migration: str, job_ref: str | None = None) -> None:
        super().__init__(message, job_ref=job_ref)
        self.migration = migration
