"""What a caller passes, made ready to send: the event's details, and the checks only this side
can make (the Python types, text PostgreSQL cannot hold, values JSON cannot carry).

Every rule about the values themselves (refs, codes, the envelope, the trace context, the
sizes the outbox's door takes) is the SQL functions' (migration 0012): the same for every
language that calls them. The checks of enqueue and claim, which write no event, stay here.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from typing import Final

from contracts.envelope import EnvelopeError, check_ref
from contracts.limits import MAX_AGGREGATEID_BYTES
from scoring.errors import InvalidArgument, InvalidEnvelope
from scoring.tracing import current_trace_context

AGGREGATE_TYPE: Final = "scoring_job"
COMPLETED_EVENT_TYPE: Final = "scoring.result.completed"
FAILED_EVENT_TYPE: Final = "scoring.job.failed"
# Millisecond durations stay within a signed 32-bit range (about 24.8 days): far beyond
# any sane lease or backoff, and no risk of overflowing a bigint expiry.
MAX_DURATION_MS: Final = 2**31 - 1
# Kafka's default max.message.bytes is 1,048,588; this leaves room for the record's key,
# the CloudEvents headers and the batch overhead. The functions' parameter has the same
# default (tests/scoring/test_functions.py holds them equal).
DEFAULT_MAX_EVENT_BYTES: Final = 1_000_000
_BIGINT_MIN: Final = -(2**63)
_BIGINT_MAX: Final = 2**63 - 1
# An integer this long can only be a number no double carries; the encoder is spared it.
_MAX_INTEGER_BITS: Final = 1100


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
    # the key, headers and batch overhead. The default fits Kafka's default (1 MiB); above
    # contracts.limits.MAX_RECORD_BYTES it is refused.
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES


# -- enqueue and claim (no event) ----------------------------------------------------------------


def validate_ref(field: str, value: object, *, job_ref: str | None = None) -> str:
    """A ref as the scoring service's CHECKs accept it, else :class:`InvalidArgument`."""
    try:
        return check_ref(field, value)
    except EnvelopeError as exc:
        raise InvalidArgument(str(exc), field=field, job_ref=job_ref) from None


def validate_job_ref(value: object) -> str:
    """A new job's ref: a ref, and no longer than its event's Kafka key may be."""
    job_ref = validate_ref("job_ref", value)
    size = len(job_ref.encode("utf-8"))
    if size > MAX_AGGREGATEID_BYTES:
        raise InvalidArgument(
            f"job_ref: is {size} bytes, at most {MAX_AGGREGATEID_BYTES} allowed (it becomes "
            "the event's Kafka key)",
            field="job_ref",
        )
    return job_ref


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


# -- what can be sent ----------------------------------------------------------------------------


def sendable_text(field: str, value: object, *, job_ref: str | None = None) -> str:
    """A ``str`` that PostgreSQL's text can hold (no NUL, no lone surrogate)."""
    if not isinstance(value, str):
        raise InvalidArgument(
            f"{field}: must be a string, not {type(value).__name__}", field=field, job_ref=job_ref
        )
    problem = _text_problem(value)
    if problem is not None:
        raise InvalidArgument(f"{field}: {problem}", field=field, job_ref=job_ref)
    return value


def sendable_integer(field: str, value: object, *, job_ref: str | None = None) -> int:
    """An ``int`` (not a ``bool``) within PostgreSQL's bigint."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not _BIGINT_MIN <= value <= _BIGINT_MAX
    ):
        raise InvalidArgument(
            f"{field}: must be an integer within a bigint, not {value!r}",
            field=field,
            job_ref=job_ref,
        )
    return value


def json_text(field: str, value: object, *, job_ref: str) -> str:
    """``value`` as JSON text for a jsonb argument; what JSON cannot carry is
    :class:`InvalidEnvelope` naming where (``payload.result.score``)."""
    try:
        _check_json(value, field)
    except RecursionError:
        raise InvalidEnvelope(
            f"{field}: nests too deep to send", field=field, job_ref=job_ref
        ) from None
    except EnvelopeError as exc:
        raise InvalidEnvelope(str(exc), field=exc.field, job_ref=job_ref) from None
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _text_problem(value: str) -> str | None:
    if "\x00" in value:
        return "must not contain NUL (PostgreSQL text cannot hold it)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def _check_json(value: object, path: str) -> None:
    # Exact types: a tuple or a set is a caller's mistake, not an array.
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value.bit_length() > _MAX_INTEGER_BITS:
            raise EnvelopeError(
                path, "is beyond the range of an IEEE-754 double; send it as a string"
            )
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise EnvelopeError(path, "NaN and infinities are not JSON numbers")
    elif isinstance(value, str):
        problem = _text_problem(value)
        if problem is not None:
            raise EnvelopeError(path, problem)
    elif type(value) is list:
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
    elif type(value) is dict:
        for key, item in value.items():
            if not isinstance(key, str):
                raise EnvelopeError(path, f"object keys must be strings, not {type(key).__name__}")
            problem = _text_problem(key)
            if problem is not None:
                # the key stays out of the path, which would carry it into the message
                raise EnvelopeError(path, f"an object key {problem}")
            _check_json(item, f"{path}.{key}")
    else:
        raise EnvelopeError(path, f"{type(value).__name__} is not a JSON value")


@dataclass(frozen=True, slots=True)
class EventArguments:
    """The event's details as the SQL functions take them (``EventDetails`` flattened)."""

    source: str
    tenant_ref: str
    correlation_ref: str
    schema_version: str
    causation_ref: str | None
    event_type: str | None
    traceparent: str | None
    tracestate: str | None
    event_id: uuid.UUID | None
    max_event_bytes: int

    def as_tuple(self) -> tuple[object, ...]:
        """In the order the writer's statements bind them (``$5`` … ``$14``, scoring/sql.py)."""
        return (
            self.source,
            self.tenant_ref,
            self.correlation_ref,
            self.schema_version,
            self.causation_ref,
            self.event_type,
            self.traceparent,
            self.tracestate,
            self.event_id,
            self.max_event_bytes,
        )


def event_arguments(details: EventDetails, *, job_ref: str | None = None) -> EventArguments:
    """Ready to send: the types checked, and the trace context of the current span when the
    caller gave none."""
    if not isinstance(details, EventDetails):
        raise InvalidArgument(
            f"event: must be an EventDetails, not {type(details).__name__}",
            field="event",
            job_ref=job_ref,
        )
    traceparent, tracestate = details.traceparent, details.tracestate
    if traceparent is None and tracestate is None and (current := current_trace_context()):
        traceparent, tracestate = current

    def optional(field: str, value: object) -> str | None:
        return None if value is None else sendable_text(field, value, job_ref=job_ref)

    if details.event_id is not None and not isinstance(details.event_id, uuid.UUID):
        raise InvalidEnvelope(
            f"event_id: must be a uuid.UUID, not {type(details.event_id).__name__}",
            field="event_id",
            job_ref=job_ref,
        )
    return EventArguments(
        source=sendable_text("source", details.source, job_ref=job_ref),
        tenant_ref=sendable_text("tenant_ref", details.tenant_ref, job_ref=job_ref),
        correlation_ref=sendable_text("correlation_ref", details.correlation_ref, job_ref=job_ref),
        schema_version=sendable_text("schema_version", details.schema_version, job_ref=job_ref),
        causation_ref=optional("causation_ref", details.causation_ref),
        event_type=optional("event_type", details.event_type),
        traceparent=optional("traceparent", traceparent),
        tracestate=optional("tracestate", tracestate),
        event_id=details.event_id,
        max_event_bytes=sendable_integer(
            "max_event_bytes", details.max_event_bytes, job_ref=job_ref
        ),
    )
