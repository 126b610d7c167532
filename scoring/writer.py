"""The scoring outcome writer: a fenced completion (or permanent failure) of a leased
scoring job and its outbox event, committed in one READ COMMITTED transaction.

Order inside the transaction: lock the job row, decide (pure, :mod:`scoring.transitions`),
apply the fenced transition, then enqueue the event idempotently under an id derived
only from the job and its outcome. Everything the caller passes is validated first, so
a refused call writes nothing.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import asyncpg
import msgspec

from contracts.envelope import (
    Envelope,
    EnvelopeError,
    JsonValue,
    canonical_json,
    check_ref,
    check_token,
    payload_digest,
)
from scoring.errors import (
    ConflictingReplay,
    EventIdMismatch,
    InvalidArgument,
    InvalidEnvelope,
    LeaseExpired,
    UnknownJob,
)
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.sql import (
    ABORT_CALLER_TRANSACTION_SQL,
    COMPLETE_JOB_SQL,
    DATABASE_CLOCK_SQL,
    FIND_EVENT_SQL,
    INSERT_EVENT_SQL,
    LOCK_JOB_SQL,
    QUARANTINE_JOB_SQL,
)
from scoring.transitions import (
    Decision,
    JobRow,
    decide_completion,
    decide_permanent_failure,
)

AGGREGATE_TYPE: Final = "scoring_job"
COMPLETED_EVENT_TYPE: Final = "scoring.result.completed"
FAILED_EVENT_TYPE: Final = "scoring.job.failed"
CAUSE_CODE_MAX_BYTES: Final = 128

_TRACEPARENT_HEX: Final = frozenset("0123456789abcdef")


# -- public types ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EventDetails:
    """What the caller says about the event; the writer adds id, subject, time and digest."""

    source: str
    tenant_ref: str
    correlation_ref: str
    schema_version: str
    causation_ref: str | None = None
    event_type: str | None = None  # None: COMPLETED_EVENT_TYPE or FAILED_EVENT_TYPE
    traceparent: str | None = None
    event_id: uuid.UUID | None = None  # when given, must equal the derived id


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


# -- validation --------------------------------------------------------------------------


def validate_ref(field: str, value: object, *, job_ref: str | None = None) -> str:
    """A ref as the scoring service's CHECKs accept it, else :class:`InvalidArgument`."""
    try:
        return check_ref(field, value)
    except EnvelopeError as exc:
        raise InvalidArgument(str(exc), field=field, job_ref=job_ref) from None


def validate_fencing_token(value: object, *, job_ref: str) -> int:
    """A fencing token is a positive integer (the attempt count of the lease)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(
            f"fencing_token: must be a positive integer, not {value!r}",
            field="fencing_token",
            job_ref=job_ref,
        )
    return value


def validate_cause_code(value: object, *, job_ref: str | None = None) -> str:
    """A failure cause is a short machine code (no whitespace, at most 128 bytes)."""
    try:
        return check_token("cause_code", value, max_bytes=CAUSE_CODE_MAX_BYTES)
    except EnvelopeError as exc:
        raise InvalidArgument(str(exc), field="cause_code", job_ref=job_ref) from None


def _check_traceparent(value: str) -> None:
    # W3C Trace Context: version-traceid-parentid-flags, lowercase hex, version ff and
    # all-zero ids invalid.
    parts = value.split("-")
    shape = [len(p) for p in parts] == [2, 32, 16, 2] and all(
        set(p) <= _TRACEPARENT_HEX for p in parts
    )
    if not shape or parts[0] == "ff" or set(parts[1]) == {"0"} or set(parts[2]) == {"0"}:
        raise EnvelopeError(
            "traceparent", "must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"
        )


@dataclass(frozen=True, slots=True)
class PreparedEvent:
    """A validated event, complete but for the outcome time, which the transition supplies."""

    event_id: uuid.UUID
    job_ref: str
    envelope: Envelope  # occurred_at_unix_ms is a placeholder until stamped
    data: dict[str, JsonValue]
    traceparent: str | None

    def body(self, occurred_at_unix_ms: int) -> str:
        """The outbox payload: ``{"envelope": …, "data": …}`` as canonical JSON text."""
        envelope = msgspec.structs.replace(self.envelope, occurred_at_unix_ms=occurred_at_unix_ms)
        body = {"envelope": msgspec.to_builtins(envelope), "data": self.data}
        return canonical_json(body).decode("utf-8")


def prepare_event(
    *,
    job_ref: str,
    kind: OutcomeKind,
    outcome_ref: str,
    data: dict[str, JsonValue],
    details: EventDetails,
) -> PreparedEvent:
    """Validate everything about the event before any write; :class:`InvalidEnvelope` names the field."""
    event_id = terminal_event_id(job_ref, kind, outcome_ref)
    if details.event_id is not None and details.event_id != event_id:
        raise EventIdMismatch(
            f"event_id {details.event_id} differs from the id derived from the job and its "
            f"outcome ({event_id}); a different id would publish a second event",
            field="event_id",
            job_ref=job_ref,
        )
    event_type = details.event_type
    if event_type is None:
        event_type = COMPLETED_EVENT_TYPE if kind is OutcomeKind.COMPLETED else FAILED_EVENT_TYPE
    try:
        if details.traceparent is not None:
            _check_traceparent(details.traceparent)
        digest = payload_digest(data)
        envelope = Envelope(
            event_ref=str(event_id),
            event_type=event_type,
            schema_version=details.schema_version,
            source=details.source,
            tenant_ref=details.tenant_ref,
            subject_ref=job_ref,
            occurred_at_unix_ms=1,  # placeholder: the database clock stamps the outcome
            correlation_ref=details.correlation_ref,
            causation_ref=details.causation_ref,
            payload_digest=digest,
        )
    except EnvelopeError as exc:
        raise InvalidEnvelope(str(exc), field=exc.field, job_ref=job_ref) from None
    return PreparedEvent(event_id, job_ref, envelope, data, details.traceparent)


# -- transaction plumbing ----------------------------------------------------------------


@asynccontextmanager
async def outcome_transaction(conn: asyncpg.Connection) -> AsyncIterator[bool]:
    """Run in the caller's transaction when one is open (yields True), else in our own READ COMMITTED one."""
    if conn.is_in_transaction():
        yield True
        return
    async with conn.transaction(isolation="read_committed"):
        yield False


async def lock_job(conn: asyncpg.Connection, job_ref: str) -> JobRow:
    """Lock the job row for the rest of the transaction and read it with the database clock."""
    record = await conn.fetchrow(LOCK_JOB_SQL, job_ref)
    if record is None:
        raise UnknownJob(f"no scoring job {job_ref!r}", job_ref=job_ref)
    return JobRow(
        state=record["scoring_state"],
        attempt_count=record["attempt_count"],
        max_attempts=record["max_attempts"],
        active_fencing_token=record["active_fencing_token"],
        lease_expires_at_unix_ms=record["active_lease_expires_at_unix_ms"],
        next_attempt_at_unix_ms=record["next_attempt_at_unix_ms"],
        result_ref=record["result_ref"],
        completed_fencing_token=record["completed_fencing_token"],
        last_failure_code=record["last_failure_code"],
        updated_at_unix_ms=record["updated_at_unix_ms"],
        now_unix_ms=record["now_unix_ms"],
    )


async def lease_expired_meanwhile(
    conn: asyncpg.Connection, job_ref: str, row: JobRow
) -> LeaseExpired:
    """The refusal when a fenced UPDATE matched nothing although the locked row was decided live."""
    # The locked row matched the decision, so the fenced UPDATE can only have missed
    # because the database clock passed the expiry in between.
    now = int(await conn.fetchval(DATABASE_CLOCK_SQL))
    expiry = row.lease_expires_at_unix_ms or 0
    return LeaseExpired(
        f"job {job_ref!r}: lease expired at {expiry} (database clock {now})",
        job_ref=job_ref,
        expired_at_unix_ms=expiry,
        now_unix_ms=now,
    )


def _same_event(record: Any, event: PreparedEvent) -> bool:
    envelope = event.envelope
    if (
        record["aggregatetype"] != AGGREGATE_TYPE
        or record["aggregateid"] != event.job_ref
        or record["type"] != envelope.event_type
    ):
        return False
    if record["published"]:
        return True
    # Time, correlation, causation and trace context describe the attempt, not the
    # outcome, so a replay may differ in them; the digest covers the data.
    return bool(
        record["tenant_ref"] == envelope.tenant_ref
        and record["schema_version"] == envelope.schema_version
        and record["payload_digest"] == envelope.payload_digest
    )


async def enqueue_event(
    conn: asyncpg.Connection, event: PreparedEvent, occurred_at_unix_ms: int, *, caller_owned: bool
) -> Enqueue:
    """Insert the event unless it is already there (pending or published); a different event under the id is :class:`ConflictingReplay`."""
    # Look first, in its own statement: if the relay is moving this very row to
    # outbox_receipt right now, the look still sees the row; had we only relied on
    # ON CONFLICT, the insert would wait for the move and then succeed, duplicating it.
    existing = await conn.fetch(FIND_EVENT_SQL, event.event_id)
    if not existing:
        envelope = event.envelope
        inserted = await conn.fetchval(
            INSERT_EVENT_SQL,
            event.event_id,
            AGGREGATE_TYPE,
            event.job_ref,
            envelope.event_type,
            event.body(occurred_at_unix_ms),
            envelope.tenant_ref,
            envelope.schema_version,
            envelope.correlation_ref,
            envelope.causation_ref,
            event.traceparent,
        )
        if inserted is not None:
            return Enqueue.INSERTED
        existing = await conn.fetch(FIND_EVENT_SQL, event.event_id)  # a concurrent writer won
    if existing and all(_same_event(record, event) for record in existing):
        return Enqueue.DUPLICATE
    error = ConflictingReplay(
        f"job {event.job_ref!r}: outbox event {event.event_id} exists with different content; "
        "the transaction was rolled back",
        job_ref=event.job_ref,
        event_id=event.event_id,
    )
    if caller_owned:
        try:
            await conn.execute(ABORT_CALLER_TRANSACTION_SQL)
        except asyncpg.RaiseError as exc:
            raise error from exc
    raise error


# -- public API --------------------------------------------------------------------------


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
    data: dict[str, JsonValue] = {
        "outcome": "completed",
        "scoring_job_ref": job_ref,
        "result_ref": result_ref,
        "result": payload,
    }
    prepared = prepare_event(
        job_ref=job_ref,
        kind=OutcomeKind.COMPLETED,
        outcome_ref=result_ref,
        data=data,
        details=event,
    )
    async with outcome_transaction(conn) as caller_owned:
        row = await lock_job(conn, job_ref)
        if decide_completion(job_ref, row, fencing_token, result_ref) is Decision.APPLY:
            occurred = await conn.fetchval(COMPLETE_JOB_SQL, job_ref, fencing_token, result_ref)
            if occurred is None:
                raise await lease_expired_meanwhile(conn, job_ref, row)
            completion = Completion.COMPLETED
        else:
            occurred, completion = row.updated_at_unix_ms, Completion.DUPLICATE
        enqueue = await enqueue_event(conn, prepared, int(occurred), caller_owned=caller_owned)
    return CompletionOutcome(job_ref, completion, enqueue, prepared.event_id, int(occurred))


async def record_permanent_failure(
    conn: asyncpg.Connection,
    prepared: PreparedEvent,
    row: JobRow,
    decision: Decision,
    *,
    fencing_token: int,
    cause_code: str,
    lease_must_be_expired: bool,
    caller_owned: bool,
) -> FailureOutcome:
    """Quarantine the locked job (or confirm a duplicate) and enqueue its failure event."""
    job_ref = prepared.job_ref
    if decision is Decision.APPLY:
        occurred = await conn.fetchval(
            QUARANTINE_JOB_SQL, job_ref, fencing_token, cause_code, lease_must_be_expired
        )
        if occurred is None:
            raise await lease_expired_meanwhile(conn, job_ref, row)
        failure = Failure.QUARANTINED
    else:
        occurred, failure = row.updated_at_unix_ms, Failure.DUPLICATE
    enqueue = await enqueue_event(conn, prepared, int(occurred), caller_owned=caller_owned)
    return FailureOutcome(job_ref, failure, enqueue, prepared.event_id, int(occurred))


def prepare_failure_event(
    *, job_ref: str, cause_code: str, detail: JsonValue, event: EventDetails
) -> PreparedEvent:
    """Validate a permanent-failure event (``scoring.job.failed`` unless overridden)."""
    data: dict[str, JsonValue] = {
        "outcome": "failed",
        "scoring_job_ref": job_ref,
        "cause_code": cause_code,
        "detail": detail,
    }
    return prepare_event(
        job_ref=job_ref, kind=OutcomeKind.FAILED, outcome_ref=cause_code, data=data, details=event
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
    validate_ref("job_ref", job_ref)
    validate_fencing_token(fencing_token, job_ref=job_ref)
    validate_cause_code(cause_code, job_ref=job_ref)
    prepared = prepare_failure_event(
        job_ref=job_ref, cause_code=cause_code, detail=detail, event=event
    )
    async with outcome_transaction(conn) as caller_owned:
        row = await lock_job(conn, job_ref)
        decision = decide_permanent_failure(job_ref, row, fencing_token, cause_code)
        return await record_permanent_failure(
            conn,
            prepared,
            row,
            decision,
            fencing_token=fencing_token,
            cause_code=cause_code,
            lease_must_be_expired=False,
            caller_owned=caller_owned,
        )
