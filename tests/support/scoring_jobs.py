"""Scoring jobs in the database for tests: reach a state through the writer, read it back."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from contracts.envelope import JobCompleted, JobFailed, JsonValue
from scoring.errors import ConflictingCompletion, ConflictingFailure
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.events import COMPLETED_EVENT_TYPE, FAILED_EVENT_TYPE
from scoring.worker import ClaimedJob, claim_next_due, enqueue_job
from scoring.writer import (
    Completion,
    CompletionOutcome,
    EventDetails,
    Failure,
    FailureOutcome,
    complete_job,
    fail_job_permanently,
)
from tests.support.expected_privileges import SCORING_EVENT_COLUMNS


async def leased_job(
    conn: asyncpg.Connection,
    job_ref: str = "job-1",
    *,
    max_attempts: int = 3,
    lease_ms: int = 60_000,
) -> ClaimedJob:
    """Queue ``job_ref`` and claim it; it must be the oldest due job."""
    assert await enqueue_job(
        conn, job_ref=job_ref, request_ref=f"req-{job_ref}", max_attempts=max_attempts
    )
    claimed = await claim_next_due(conn, worker_ref="worker-a", lease_ms=lease_ms)
    assert claimed is not None
    assert claimed.job_ref == job_ref
    return claimed


EXPIRE_NOW_SQL = """
UPDATE scoring_job_state
SET active_lease_expires_at_unix_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1000
WHERE scoring_job_ref = $1 AND scoring_state = 'leased'
"""


async def expire_lease(conn: asyncpg.Connection, job_ref: str) -> None:
    """Move the lease expiry a second into the past by the database clock."""
    assert await conn.execute(EXPIRE_NOW_SQL, job_ref) == "UPDATE 1"


async def job(conn: asyncpg.Connection, job_ref: str = "job-1") -> dict[str, Any]:
    """The job row, with updated_at in unix ms."""
    record = await conn.fetchrow(
        "SELECT *, floor(extract(epoch FROM updated_at) * 1000)::bigint AS updated_at_unix_ms"
        " FROM scoring_job_state WHERE scoring_job_ref = $1",
        job_ref,
    )
    assert record is not None
    return dict(record)


async def events(conn: asyncpg.Connection, job_ref: str | None = None) -> list[dict[str, Any]]:
    """Pending outbox rows (of one job, or all), oldest first."""
    rows = await conn.fetch(
        "SELECT * FROM outbox WHERE $1::text IS NULL OR aggregateid = $1 ORDER BY seq", job_ref
    )
    return [dict(r) for r in rows]


async def receipts(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Delivery receipts (published events)."""
    return [dict(r) for r in await conn.fetch("SELECT * FROM outbox_receipt ORDER BY id")]


PUBLISH_SQL = """
WITH moved AS (DELETE FROM outbox WHERE id = $1 RETURNING *)
INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic, kafka_partition,
                            kafka_offset, created_at)
SELECT id, aggregatetype, aggregateid, type, 'outbox.event.' || aggregatetype, 0, seq, created_at
FROM moved
"""


async def publish(conn: asyncpg.Connection, event_id: object) -> None:
    """Do what the relay does on delivery: move the row to outbox_receipt in one statement."""
    assert await conn.execute(PUBLISH_SQL, event_id) == "INSERT 0 1"


# -- the two terminal outcomes a worker can write ----------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One of the two terminal outcomes (completion / permanent failure), for tests that
    check the same scenario for both: how to write it, and what each side of it looks like."""

    name: str
    kind: OutcomeKind
    ref: str  # the outcome_ref: result_ref of a completion, cause_code of a failure
    ref_field: str
    invalid_ref: str  # a malformed result_ref / cause_code
    event_type: str
    state: str  # scoring_state after the outcome
    applied: enum.StrEnum  # Completion.COMPLETED / Failure.QUARANTINED
    duplicate: enum.StrEnum  # Completion.DUPLICATE / Failure.DUPLICATE
    conflict: type[Exception]  # what writing this outcome raises over a different terminal one
    settle_sql: str  # the job row's transition alone, as a non-atomic writer would do it

    def __str__(self) -> str:
        return self.name

    async def apply(
        self,
        conn: asyncpg.Connection,
        *,
        fencing_token: int,
        event: EventDetails,
        job_ref: str = "job-1",
        ref: str | None = None,
        data: JsonValue = None,
    ) -> CompletionOutcome | FailureOutcome:
        """Write this outcome (``data``: the completion's payload or the failure's detail)."""
        if self.kind is OutcomeKind.COMPLETED:
            return await complete_job(
                conn,
                job_ref=job_ref,
                fencing_token=fencing_token,
                result_ref=self.ref if ref is None else ref,
                payload=data,
                event=event,
            )
        return await fail_job_permanently(
            conn,
            job_ref=job_ref,
            fencing_token=fencing_token,
            cause_code=self.ref if ref is None else ref,
            detail=data,
            event=event,
        )

    def settled_row(self, fencing_token: int) -> dict[str, object]:
        """The outcome columns of the job row once this outcome is written under ``fencing_token``."""
        if self.kind is OutcomeKind.COMPLETED:
            return {"result_ref": self.ref, "completed_fencing_token": fencing_token}
        return {"result_ref": None, "completed_fencing_token": None, "last_failure_code": self.ref}

    def result(self, outcome: CompletionOutcome | FailureOutcome) -> enum.StrEnum:
        """What happened to the job row: ``outcome.completion`` or ``outcome.failure``."""
        if isinstance(outcome, CompletionOutcome):
            return outcome.completion
        return outcome.failure

    def event_id(self, job_ref: str = "job-1") -> uuid.UUID:
        return terminal_event_id(job_ref, self.kind, self.ref)

    def data(self, data: JsonValue, job_ref: str = "job-1") -> JobCompleted | JobFailed:
        """The decoded event data a consumer sees."""
        if self.kind is OutcomeKind.COMPLETED:
            return JobCompleted(scoring_job_ref=job_ref, result_ref=self.ref, result=data)
        return JobFailed(scoring_job_ref=job_ref, cause_code=self.ref, detail=data)

    async def event_row(
        self,
        conn: asyncpg.Connection,
        *,
        fencing_token: int,
        event: EventDetails,
        data: JsonValue = None,
        job_ref: str = "job-1",
    ) -> dict[str, Any]:
        """The outbox row this outcome would write now: written in a transaction that is
        rolled back, so nothing of it stays."""
        tr = conn.transaction()
        await tr.start()
        try:
            await self.apply(
                conn, fencing_token=fencing_token, event=event, data=data, job_ref=job_ref
            )
            [row] = await events(conn, job_ref)
        finally:
            await tr.rollback()
        return row


async def insert_event_row(conn: asyncpg.Connection, row: dict[str, Any]) -> None:
    """Write an event row directly, as an earlier partial (non-atomic) writer would have:
    the columns the scoring functions write."""
    await conn.execute(
        f"INSERT INTO outbox ({', '.join(SCORING_EVENT_COLUMNS)})"
        " VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11)",
        *(row[column] for column in SCORING_EVENT_COLUMNS),
    )


COMPLETION = Outcome(
    name="completion",
    kind=OutcomeKind.COMPLETED,
    ref="r-1",
    ref_field="result_ref",
    invalid_ref=" r",
    event_type=COMPLETED_EVENT_TYPE,
    state="completed",
    applied=Completion.COMPLETED,
    duplicate=Completion.DUPLICATE,
    conflict=ConflictingCompletion,
    settle_sql="""UPDATE scoring_job_state SET scoring_state = 'completed', result_ref = 'r-1',
           completed_fencing_token = attempt_count, active_worker_ref = NULL, active_lease_ref = NULL,
           active_fencing_token = NULL, active_lease_expires_at_unix_ms = NULL,
           updated_at = clock_timestamp() WHERE scoring_job_ref = 'job-1'""",
)

FAILURE = Outcome(
    name="permanent_failure",
    kind=OutcomeKind.FAILED,
    ref="bad_input",
    ref_field="cause_code",
    invalid_ref="has space",
    event_type=FAILED_EVENT_TYPE,
    state="quarantined",
    applied=Failure.QUARANTINED,
    duplicate=Failure.DUPLICATE,
    conflict=ConflictingFailure,
    settle_sql="""UPDATE scoring_job_state SET scoring_state = 'quarantined', last_failure_code = 'bad_input',
           active_worker_ref = NULL, active_lease_ref = NULL, active_fencing_token = NULL,
           active_lease_expires_at_unix_ms = NULL, updated_at = clock_timestamp()
           WHERE scoring_job_ref = 'job-1'""",
)

OUTCOMES = pytest.mark.parametrize("outcome", [COMPLETION, FAILURE], ids=str)
"""Run a test once per terminal outcome, as ``outcome: Outcome``."""


def other(outcome: Outcome) -> Outcome:
    """The other terminal outcome."""
    return FAILURE if outcome is COMPLETION else COMPLETION
