"""The scoring outcome writer: a fenced completion (or permanent failure) of a leased
scoring job and its outbox event, committed in one READ COMMITTED transaction.

The rules live in SQL (migration 0012, ``outbox_relay_complete_job`` and
``outbox_relay_fail_job_permanently``): lock the job row, decide, apply the fenced
transition, then enqueue the event idempotently under an id derived only from the job and
its outcome. This module checks what only Python can (types, values JSON cannot carry),
makes one call, and turns the row it returns into an outcome or the refusal's error. A
refused call writes nothing.
"""

from __future__ import annotations

import asyncpg

from contracts.envelope import JsonValue
from scoring.events import (
    DEFAULT_MAX_EVENT_BYTES,
    EventDetails,
    event_arguments,
    json_text,
    sendable_integer,
    sendable_text,
)
from scoring.outcomes import Completion, CompletionOutcome, Enqueue, Failure, FailureOutcome
from scoring.sql import COMPLETE_JOB_SQL, FAIL_JOB_PERMANENTLY_SQL
from scoring.store import call, failure_outcome, settled

# The names docs/writer.md documents under scoring.writer; they live in scoring.events
# and scoring.outcomes.
__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "Completion",
    "CompletionOutcome",
    "Enqueue",
    "EventDetails",
    "Failure",
    "FailureOutcome",
    "complete_job",
    "fail_job_permanently",
]


async def complete_job(
    conn: asyncpg.Connection,
    *,
    job_ref: str,
    fencing_token: int,
    result_ref: str,
    payload: JsonValue = None,
    event: EventDetails,
) -> CompletionOutcome:
    """Complete a leased job and enqueue its ``scoring.result.completed`` event atomically."""
    job_ref = sendable_text("job_ref", job_ref)
    arguments = (
        job_ref,
        sendable_integer("fencing_token", fencing_token, job_ref=job_ref),
        sendable_text("result_ref", result_ref, job_ref=job_ref),
        json_text("payload.result", payload, job_ref=job_ref),
        *event_arguments(event, job_ref=job_ref).as_tuple(),
    )
    [row] = await call(conn, COMPLETE_JOB_SQL, *arguments, job_ref=job_ref)
    row = settled(row)
    return CompletionOutcome(
        row["job_ref"],
        Completion(row["outcome"]),
        Enqueue(row["enqueue"]),
        row["event_id"],
        row["occurred_at_unix_ms"],
    )


async def fail_job_permanently(
    conn: asyncpg.Connection,
    *,
    job_ref: str,
    fencing_token: int,
    cause_code: str,
    event: EventDetails,
    detail: JsonValue = None,
) -> FailureOutcome:
    """Quarantine a leased job with ``cause_code`` and enqueue its failure event atomically."""
    job_ref = sendable_text("job_ref", job_ref)
    arguments = (
        job_ref,
        sendable_integer("fencing_token", fencing_token, job_ref=job_ref),
        sendable_text("cause_code", cause_code, job_ref=job_ref),
        json_text("payload.detail", detail, job_ref=job_ref),
        *event_arguments(event, job_ref=job_ref).as_tuple(),
    )
    [row] = await call(conn, FAIL_JOB_PERMANENTLY_SQL, *arguments, job_ref=job_ref)
    return failure_outcome(settled(row))
