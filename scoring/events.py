"""What a caller passes, checked before any write: refs, fences, codes, durations, and the
outcome event, prepared in full but for the time the transition will stamp on it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final

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
from scoring.errors import EventIdMismatch, EventTooLarge, InvalidArgument, InvalidEnvelope
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.tracing import current_trace_context

AGGREGATE_TYPE: Final = "scoring_job"
COMPLETED_EVENT_TYPE: Final = "scoring.result.completed"
FAILED_EVENT_TYPE: Final = "scoring.job.failed"
CAUSE_CODE_MAX_BYTES: Final = 128
# Millisecond durations stay within a signed 32-bit range (about 24.8 days): far beyond
# any sane lease or backoff, and no risk of overflowing a bigint expiry.
MAX_DURATION_MS: Final = 2**31 - 1
# Kafka's default max.message.bytes is 1,048,588; this leaves room for the record's key,
# the CloudEvents headers and the batch overhead.
DEFAULT_MAX_EVENT_BYTES: Final = 1_000_000
# The outcome time stamped into the envelope later has at most this many digits.
_OCCURRED_AT_PLACEHOLDER: Final = 9_999_999_999_999

_TRACEPARENT_HEX: Final = frozenset("0123456789abcdef")
_TRACESTATE_MAX: Final = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class EventDetails:
    """What the caller says about the event; the writer adds id, subject, time and digest."""

    source: str
    tenant_ref: str
    correlation_ref: str
    schema_version: str
    causation_ref: str | None = None
    event_type: str | None = None  # None: COMPLETED_EVENT_TYPE or FAILED_EVENT_TYPE
    # W3C trace context; without one, the current OpenTelemetry span's, when there is one
    # (scoring/tracing.py).
    traceparent: str | None = None
    tracestate: str | None = None  # only with a traceparent
    event_id: uuid.UUID | None = None  # when given, must equal the derived id
    # The largest outbox payload accepted: keep it under the topic's max.message.bytes less
    # the key, headers and batch overhead. The default fits Kafka's default (1 MiB).
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES


# -- arguments ---------------------------------------------------------------------------


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


def validate_duration_ms(field: str, value: object, *, minimum: int) -> int:
    """An integer in ``minimum..MAX_DURATION_MS`` (a duration in ms, or a count such as ``max_attempts``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not minimum <= value <= MAX_DURATION_MS
    ):
        raise InvalidArgument(
            f"{field}: must be an integer in {minimum}..{MAX_DURATION_MS}, not {value!r}",
            field=field,
        )
    return value


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


def _check_tracestate(value: str, *, with_traceparent: bool) -> None:
    # W3C Trace Context: list members of printable ASCII, 512 characters at most, and only
    # beside a traceparent (the outbox's CHECK takes the first two).
    if not with_traceparent:
        raise EnvelopeError("tracestate", "needs a traceparent")
    if len(value) > _TRACESTATE_MAX or not (value.isascii() and value.isprintable()):
        raise EnvelopeError(
            "tracestate", f"must be at most {_TRACESTATE_MAX} characters of printable ASCII"
        )


# -- the event ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedEvent:
    """A validated event, complete but for the outcome time, which the transition supplies."""

    event_id: uuid.UUID
    job_ref: str
    outcome_ref: str  # the result_ref or cause_code the id derives from
    envelope: Envelope  # occurred_at_unix_ms is a placeholder until stamped
    data: dict[str, JsonValue]
    traceparent: str | None
    tracestate: str | None = None

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
    traceparent, tracestate = details.traceparent, details.tracestate
    if traceparent is None and tracestate is None and (current := current_trace_context()):
        traceparent, tracestate = current
    try:
        if traceparent is not None:
            _check_traceparent(traceparent)
        if tracestate is not None:
            _check_tracestate(tracestate, with_traceparent=traceparent is not None)
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
    prepared = PreparedEvent(
        event_id, job_ref, outcome_ref, envelope, data, traceparent, tracestate
    )
    size = len(prepared.body(_OCCURRED_AT_PLACEHOLDER).encode("utf-8"))
    if size > details.max_event_bytes:
        raise EventTooLarge(
            f"the event would be {size} bytes, over the {details.max_event_bytes}-byte limit "
            "(EventDetails.max_event_bytes): the broker could never publish it",
            field="payload" if kind is OutcomeKind.COMPLETED else "detail",
            job_ref=job_ref,
            size_bytes=size,
            limit_bytes=details.max_event_bytes,
        )
    return prepared


def prepare_completion_event(
    *, job_ref: str, result_ref: str, payload: JsonValue, event: EventDetails
) -> PreparedEvent:
    """Validate a completion event (``scoring.result.completed`` unless overridden)."""
    data: dict[str, JsonValue] = {
        "outcome": "completed",
        "scoring_job_ref": job_ref,
        "result_ref": result_ref,
        "result": payload,
    }
    return prepare_event(
        job_ref=job_ref,
        kind=OutcomeKind.COMPLETED,
        outcome_ref=result_ref,
        data=data,
        details=event,
    )


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
