"""The scoring outcome writer: a fenced completion (or permanent failure) of a leased
scoring job and its outbox event, committed in one READ COMMITTED transaction.

Order inside the transaction: lock the job row, decide (pure, :mod:`scoring.transitions`),
apply the fenced transition, then enqueue the event idempotently under an id derived
only from the job and its outcome. Everything the caller passes is validated first, so
a refused call writes nothing.
"""

from __future__ import annotations

import asyncpg

from contracts.envelope import JsonValue
from scoring.events import (
    DEFAULT_MAX_EVENT_BYTES,
    EventDetails,
    prepare_completion_event,
    prepare_failure_event,
    validate_cause_code,
    validate_fencing_token,
    validate_ref,
)
from scoring.outcomes import Completion, CompletionOutcome, Enqueue, Failure, FailureOutcome
from scoring.sql import COMPLETE_JOB_SQL
from scoring.store import (
    enqueue_event,
    fail_under_lock,
    fenced_transition,
    lock_job,
    outcome_transaction,
)
from scoring.transitions import Decision, JobRow, decide_completion, decide_permanent_failure

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
    validate_ref("job_ref", job_ref)
    validate_fencing_token(fencing_token, job_ref=job_ref)
    validate_ref("result_ref", result_ref, job_ref=job_ref)
    prepared = prepare_completion_event(
        job_ref=job_ref, result_ref=result_ref, payload=payload, event=event
    )
    async with outcome_transaction(conn) as caller_owned:
        row = await lock_job(conn, job_ref)
        if decide_completion(job_ref, row, fencing_token, result_ref) is Decision.APPLY:
            occurred = await fenced_transition(
                conn, row, COMPLETE_JOB_SQL, job_ref, fencing_token, result_ref
            )
            completion = Completion.COMPLETED
        else:
            occurred, completion = row.updated_at_unix_ms, Completion.DUPLICATE
        enqueue = await enqueue_event(conn, prepared, occurred, caller_owned=caller_owned)
    return CompletionOutcome(job_ref, completion, enqueue, prepared.event_id, occurred)


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
    validate_ref("job_ref", job_ref)
    validate_fencing_token(fencing_token, job_ref=job_ref)
    validate_cause_code(cause_code, job_ref=job_ref)
    prepared = prepare_failure_event(
        job_ref=job_ref, cause_code=cause_code, detail=detail, event=event
    )

    async def decide(row: JobRow) -> Decision:
        return decide_permanent_failure(job_ref, row, fencing_token, cause_code)

    return await fail_under_lock(
        conn, prepared, decide, fencing_token=fencing_token, lease_must_be_expired=False
    )
