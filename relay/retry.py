"""Retry decisions: which broker errors are worth retrying and how long to wait. Pure."""

from __future__ import annotations

import random
from dataclasses import dataclass

import asyncpg
from aiokafka import errors as kafka_errors

from relay.errors import (
    BatchTooLarge,
    PredecessorFailed,
    ProducerWasReset,
    RecordRejected,
    TopicLookupPending,
    TopicNotFound,
)


@dataclass(frozen=True, slots=True)
class FailureClass:
    """A stable, secret-free name for a publish failure, and whether waiting can cure it."""

    name: str
    retriable: bool
    # No attempt can ever succeed with the relay's settings: quarantined at once.
    final: bool = False

    @property
    def label(self) -> str:
        """The name without its detail (an unexpected error's type): a metric label."""
        return self.name.partition(":")[0]


RECORD_TOO_LARGE = FailureClass("record_too_large", retriable=False)
# Larger than the producer can ever send (its request size), found before sending; a row
# far larger is not even fetched whole.
TOO_LARGE = FailureClass("too_large", retriable=False, final=True)
# Routed to a topic outside --allowed-topics.
TOPIC_NOT_ALLOWED = FailureClass("topic_not_allowed", retriable=False, final=True)
# Its id is that of an event already published with another key, aggregatetype or type:
# consumers that deduplicate on the id would drop it, and its receipt would re-point the
# other event's.
DUPLICATE_ID = FailureClass("duplicate_id", retriable=False, final=True)
# A fetch of it alone failed, again, while the rows around it fetched (relay/narrowing.py);
# or the door could not measure it, stored before the door, while others were measured.
UNFETCHABLE = FailureClass("unfetchable", retriable=False, final=True)
UNMEASURABLE = FailureClass("unmeasurable", retriable=False, final=True)
AUTHORIZATION = FailureClass("authorization", retriable=False)
INVALID_TOPIC = FailureClass("invalid_topic", retriable=False)
INVALID_HEADERS = FailureClass("invalid_headers", retriable=False)
BROKER_TIMEOUT = FailureClass("broker_timeout", retriable=True)
BROKER_UNAVAILABLE = FailureClass("broker_unavailable", retriable=True)
LANE_LOST = FailureClass("lane_lost", retriable=True)
# The idempotent producer's sequence state no longer matches the broker's (typically
# after a broker restart lost in-flight batches). Nothing is wrong with the events:
# retry them, on a fresh producer.
PRODUCER_STATE = FailureClass("producer_state", retriable=True)
# The broker has no such topic and refuses to create it: spends an attempt, so the rows
# are quarantined after --max-attempts unless the topic appears.
UNKNOWN_TOPIC = FailureClass("unknown_topic", retriable=False)
# The topic's first lookup is still running; nothing is known to be wrong yet.
TOPIC_LOOKUP = FailureClass("topic_lookup", retriable=True)
# A batch was larger than its topic accepts; sent again in smaller batches.
BATCH_TOO_LARGE = FailureClass("batch_too_large", retriable=True)
# An earlier batch of the partition failed, so this one was kept back to keep key order.
HELD_BEHIND_FAILURE = FailureClass("held_behind_failure", retriable=True)
# The relay gave up waiting for the broker (or its lease or drain time ran out) and reset
# the producer, so nothing it held can land later.
PRODUCER_RESET = FailureClass("producer_reset", retriable=True)

# A row whose created_at no RFC 3339 time can carry (relay/records.py).
INVALID_CREATED_AT = FailureClass("invalid_created_at", retriable=False)

# Every class with a fixed name that the relay counts (a lost lane is not counted): their
# counters exist from the start (relay/metrics.py), so a rule's increase() sees a class's
# first failures; a counter made at its first use would start at that value.
NAMED_CLASSES = (
    RECORD_TOO_LARGE,
    TOO_LARGE,
    TOPIC_NOT_ALLOWED,
    DUPLICATE_ID,
    UNFETCHABLE,
    UNMEASURABLE,
    AUTHORIZATION,
    INVALID_TOPIC,
    INVALID_HEADERS,
    INVALID_CREATED_AT,
    UNKNOWN_TOPIC,
    BROKER_TIMEOUT,
    BROKER_UNAVAILABLE,
    PRODUCER_STATE,
    TOPIC_LOOKUP,
    BATCH_TOO_LARGE,
    HELD_BEHIND_FAILURE,
    PRODUCER_RESET,
)

# Retriable failures that say nothing about the broker answering: they never count toward
# the streak of failed batches that makes the relay unready.
NOT_BROKER_FAILURES = frozenset({TOPIC_LOOKUP, BATCH_TOO_LARGE, HELD_BEHIND_FAILURE})

_BY_TYPE: tuple[tuple[type[BaseException], FailureClass], ...] = (
    (kafka_errors.MessageSizeTooLargeError, RECORD_TOO_LARGE),
    (kafka_errors.RecordListTooLargeError, RECORD_TOO_LARGE),
    (kafka_errors.TopicAuthorizationFailedError, AUTHORIZATION),
    (kafka_errors.ClusterAuthorizationFailedError, AUTHORIZATION),
    (kafka_errors.TransactionalIdAuthorizationFailed, AUTHORIZATION),
    (kafka_errors.InvalidTopicError, INVALID_TOPIC),
    (TopicNotFound, UNKNOWN_TOPIC),
    (TopicLookupPending, TOPIC_LOOKUP),
    (BatchTooLarge, BATCH_TOO_LARGE),
    (PredecessorFailed, HELD_BEHIND_FAILURE),
    (ProducerWasReset, PRODUCER_RESET),
    (kafka_errors.OutOfOrderSequenceNumber, PRODUCER_STATE),
    (kafka_errors.UnknownProducerId, PRODUCER_STATE),
    (kafka_errors.InvalidProducerEpoch, PRODUCER_STATE),
    (kafka_errors.InvalidProducerIdMapping, PRODUCER_STATE),
    (kafka_errors.KafkaTimeoutError, BROKER_TIMEOUT),
    (TimeoutError, BROKER_TIMEOUT),
    (kafka_errors.KafkaConnectionError, BROKER_UNAVAILABLE),
    (ConnectionError, BROKER_UNAVAILABLE),
)


_FINAL_CAUSES = {failure.name: failure for failure in (TOO_LARGE, TOPIC_NOT_ALLOWED, DUPLICATE_ID)}
# The label of a failure nothing here knows (its name adds the error's type).
UNEXPECTED = "unexpected"
# Room for the type's name after "unexpected:" in last_error_class.
_TYPE_NAME_LIMIT = 100


def classify_failure(exc: BaseException) -> FailureClass:
    """Retryability is data (the error's type and ``retriable`` flag), never message text.

    An error nothing here knows spends an attempt like a permanent one, so a row that
    always fails that way ends quarantined as ``unexpected:<its type>``, instead of being
    retried for ever.
    """
    if isinstance(exc, RecordRejected):
        return _FINAL_CAUSES.get(exc.cause) or FailureClass(exc.cause, retriable=False)
    for kind, failure in _BY_TYPE:
        if isinstance(exc, kind):
            return failure
    if isinstance(exc, kafka_errors.KafkaError):
        name = type(exc).__name__.removesuffix("Error")
        snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
        return FailureClass(snake or "kafka", retriable=bool(exc.retriable))
    return FailureClass(f"{UNEXPECTED}:{type(exc).__name__[:_TYPE_NAME_LIMIT]}", retriable=False)


def backoff_ms(attempt: int, *, base_ms: int, cap_ms: int, rng: random.Random | None = None) -> int:
    """Exponential backoff with full jitter: uniform in [base/2, min(cap, base * 2**attempt)]."""
    ceiling = min(cap_ms, base_ms * (2 ** min(max(attempt, 0), 30)))
    floor = min(base_ms // 2, ceiling)
    return (rng or random).randint(floor, ceiling)


def retry_delay_ms(
    failure: FailureClass,
    *,
    failure_streak: int,
    attempts: int,
    base_ms: int,
    cap_ms: int,
    rng: random.Random | None = None,
) -> int:
    """How long a row that failed waits before its next try.

    A failure that says nothing about the broker waits the base delay; a retriable one
    waits longer the more batches in a row the broker failed (``failure_streak``); a
    permanent one longer the more attempts the row has spent.
    """
    if failure in NOT_BROKER_FAILURES:
        step = 0
    elif failure.retriable:
        step = failure_streak
    else:
        step = attempts
    return backoff_ms(step, base_ms=base_ms, cap_ms=cap_ms, rng=rng)


# SQLSTATE classes of a statement refused for the values it carries: data exceptions (22),
# integrity constraints (23) and program limits (54), such as an index entry too large.
_REFUSED_FOR_CONTENT = frozenset({"22", "23", "54"})


def refused_for_content(exc: BaseException) -> bool:
    """True when the database refused a statement for the values in it: retrying the same
    statement cannot succeed, unlike a lost connection or a server going down."""
    sqlstate = getattr(exc, "sqlstate", None) if isinstance(exc, asyncpg.PostgresError) else None
    return isinstance(sqlstate, str) and sqlstate[:2] in _REFUSED_FOR_CONTENT


# What else a read can fail with because of the rows it reads, as well as for load: too
# little memory or disk (53), its statement timeout (57014), damaged data (XX).
_PERHAPS_CONTENT = frozenset({"53", "XX"})
_STATEMENT_TIMEOUT = "57014"


def perhaps_content(exc: BaseException) -> bool:
    """True when a failed read could come from the content of the rows it read: then it is
    narrowed to the row (relay/narrowing.py) before it is tried again."""
    sqlstate = getattr(exc, "sqlstate", None) if isinstance(exc, asyncpg.PostgresError) else None
    return isinstance(sqlstate, str) and (
        sqlstate[:2] in _REFUSED_FOR_CONTENT
        or sqlstate[:2] in _PERHAPS_CONTENT
        or sqlstate == _STATEMENT_TIMEOUT
    )
