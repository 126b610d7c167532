"""The plumbing behind the public calls: one call of a SQL function of migration 0012, in the
caller's transaction or one of ours, and its ``outbox_relay_outcome`` rows read back as
results or as the errors they stand for."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final

import asyncpg

from scoring.errors import (
    ConflictingCompletion,
    ConflictingFailure,
    ConflictingReplay,
    EventIdMismatch,
    EventTooLarge,
    InvalidArgument,
    InvalidEnvelope,
    LeaseExpired,
    NotLeased,
    ScoringWriteError,
    StaleLease,
    UnknownJob,
    WriterNotMigrated,
)
from scoring.outcomes import Enqueue, Failure, FailureOutcome

# The migration that creates the functions; tests/scoring/test_functions.py holds it equal
# to the file in migrations/ (this package may not import that one).
REQUIRED_MIGRATION: Final = "0012_scoring_functions"
FUNCTIONS: Final = (
    "outbox_relay_complete_job",
    "outbox_relay_fail_job_permanently",
    "outbox_relay_fail_retryable",
    "outbox_relay_expire_leases",
)
# Raised by the functions for a conflicting replay found after the transition was written.
CONFLICTING_REPLAY_SQLSTATE: Final = "OR001"

Row = Mapping[str, Any]


@asynccontextmanager
async def outcome_transaction(conn: asyncpg.Connection) -> AsyncIterator[bool]:
    """Run in the caller's transaction when one is open (yields True), else in our own READ COMMITTED one."""
    if conn.is_in_transaction():
        yield True
        return
    async with conn.transaction(isolation="read_committed"):
        yield False


async def call(conn: asyncpg.Connection, sql: str, *args: object, job_ref: str | None) -> list[Row]:
    """Run one of the functions' statements in the caller's transaction or our own; its rows."""
    try:
        async with outcome_transaction(conn):
            return list(await conn.fetch(sql, *args))
    except asyncpg.UndefinedFunctionError as exc:
        if not any(name in exc.message for name in FUNCTIONS):
            raise
        raise WriterNotMigrated(
            f"the database lacks migration {REQUIRED_MIGRATION}, whose functions the scoring "
            "writer calls: run `outbox-relay migrate`",
            migration=REQUIRED_MIGRATION,
            job_ref=job_ref,
        ) from exc
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != CONFLICTING_REPLAY_SQLSTATE:
            raise
        # The function has aborted the transaction: in ours it rolled back, and a caller's
        # can only roll back now, so a completion can never commit without its event.
        raise ConflictingReplay(
            str(exc.message), job_ref=job_ref, event_id=uuid.UUID(str(exc.detail))
        ) from exc


def refusal(row: Row) -> ScoringWriteError:
    """The error a refused row stands for, with its structured fields."""
    code, field, message = row["refusal"], row["refusal_field"], row["refusal_message"]
    job_ref = row["job_ref"]
    detail: dict[str, Any] = json.loads(row["refusal_detail"]) if row["refusal_detail"] else {}
    match code:
        case "invalid_argument":
            return InvalidArgument(message, field=field, job_ref=job_ref)
        case "invalid_envelope":
            return InvalidEnvelope(message, field=field, job_ref=job_ref)
        case "event_id_mismatch":
            return EventIdMismatch(message, field=field, job_ref=job_ref)
        case "event_too_large":
            return EventTooLarge(
                message,
                field=field,
                job_ref=job_ref,
                size_bytes=detail["size_bytes"],
                limit_bytes=detail["limit_bytes"],
            )
        case "unknown_job":
            return UnknownJob(message, job_ref=job_ref)
        case "not_leased":
            return NotLeased(message, job_ref=job_ref, state=detail["state"])
        case "stale_lease":
            return StaleLease(
                message, job_ref=job_ref, given=detail["given"], current=detail["current"]
            )
        case "lease_expired":
            return LeaseExpired(
                message,
                job_ref=job_ref,
                expired_at_unix_ms=detail["expired_at_unix_ms"],
                now_unix_ms=detail["now_unix_ms"],
            )
        case "conflicting_completion":
            return ConflictingCompletion(message, job_ref=job_ref)
        case "conflicting_failure":
            return ConflictingFailure(message, job_ref=job_ref)
        case "conflicting_replay":
            return ConflictingReplay(
                message, job_ref=job_ref, event_id=uuid.UUID(detail["event_id"])
            )
        case _:
            # A code a newer schema added: still a refusal, nothing written.
            return ScoringWriteError(f"{code}: {message}", job_ref=job_ref)


def settled(row: Row) -> Row:
    """The row, unless it is a refusal: then its error is raised."""
    if row["outcome"] == "refused":
        raise refusal(row)
    return row


def failure_outcome(row: Row) -> FailureOutcome:
    """A quarantine, or its exact replay, with its event."""
    return FailureOutcome(
        row["job_ref"],
        Failure.QUARANTINED if row["outcome"] == "quarantined" else Failure.DUPLICATE,
        Enqueue(row["enqueue"]),
        row["event_id"],
        row["occurred_at_unix_ms"],
    )
