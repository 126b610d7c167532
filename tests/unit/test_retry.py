"""Which publish failures are retried, and how long the relay waits. Pure."""

from __future__ import annotations

import random
import re

import pytest
from aiokafka import errors as kafka_errors

from relay.errors import BatchTooLarge, RecordRejected, TopicLookupPending, TopicNotFound
from relay.retry import (
    BROKER_UNAVAILABLE,
    HELD_BEHIND_FAILURE,
    NOT_BROKER_FAILURES,
    PRODUCER_STATE,
    RECORD_TOO_LARGE,
    FailureClass,
    backoff_ms,
    classify_failure,
    retry_delay_ms,
)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (kafka_errors.MessageSizeTooLargeError(), FailureClass("record_too_large", False)),
        (kafka_errors.RecordListTooLargeError(), FailureClass("record_too_large", False)),
        (kafka_errors.TopicAuthorizationFailedError(), FailureClass("authorization", False)),
        (kafka_errors.ClusterAuthorizationFailedError(), FailureClass("authorization", False)),
        (kafka_errors.InvalidTopicError(), FailureClass("invalid_topic", False)),
        (kafka_errors.KafkaTimeoutError(), FailureClass("broker_timeout", True)),
        (TimeoutError(), FailureClass("broker_timeout", True)),
        (kafka_errors.KafkaConnectionError(), FailureClass("broker_unavailable", True)),
        (ConnectionResetError(), FailureClass("broker_unavailable", True)),
        # nothing knows it: spends an attempt, so a row that always fails ends quarantined
        (RuntimeError("boom"), FailureClass("unexpected:RuntimeError", False)),
        # a missing topic spends attempts and ends in quarantine; its first lookup does not
        (TopicNotFound("t"), FailureClass("unknown_topic", False)),
        (TopicLookupPending("t"), FailureClass("topic_lookup", True)),
        # several records refused together: none is shown too large on its own
        (BatchTooLarge("t"), FailureClass("batch_too_large", True)),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else "",
)
def test_known_failures(exc: BaseException, expected: FailureClass) -> None:
    assert classify_failure(exc) == expected


def test_topic_lookups_oversized_and_held_back_batches_never_count_as_the_broker_failing() -> None:
    names = {failure.name for failure in NOT_BROKER_FAILURES}
    assert names == {"topic_lookup", "batch_too_large", "held_behind_failure"}
    assert all(failure.retriable for failure in NOT_BROKER_FAILURES)


@pytest.mark.parametrize("cause", ["invalid_topic", "invalid_headers", "record_too_large"])
def test_record_rejected_keeps_its_cause_and_is_final(cause: str) -> None:
    assert classify_failure(RecordRejected(cause, "x")) == FailureClass(cause, retriable=False)


def test_other_kafka_errors_get_a_snake_case_name_and_their_retriable_flag() -> None:
    failure = classify_failure(kafka_errors.NotLeaderForPartitionError())
    assert failure == FailureClass("not_leader_for_partition", retriable=True)
    assert kafka_errors.NotLeaderForPartitionError.retriable is True
    final = classify_failure(kafka_errors.UnsupportedVersionError())
    assert final == FailureClass("unsupported_version", retriable=False)


# The broker errors relay/retry.py classes itself; every other Kafka error keeps its name
# and aiokafka's own ``retriable`` flag.
OWN_CLASSES: dict[type[kafka_errors.KafkaError], FailureClass] = {
    kafka_errors.MessageSizeTooLargeError: FailureClass("record_too_large", False),
    kafka_errors.RecordListTooLargeError: FailureClass("record_too_large", False),
    kafka_errors.TopicAuthorizationFailedError: FailureClass("authorization", False),
    kafka_errors.ClusterAuthorizationFailedError: FailureClass("authorization", False),
    kafka_errors.TransactionalIdAuthorizationFailed: FailureClass("authorization", False),
    kafka_errors.InvalidTopicError: FailureClass("invalid_topic", False),
    kafka_errors.OutOfOrderSequenceNumber: FailureClass("producer_state", True),
    kafka_errors.UnknownProducerId: FailureClass("producer_state", True),
    kafka_errors.InvalidProducerEpoch: FailureClass("producer_state", True),
    kafka_errors.InvalidProducerIdMapping: FailureClass("producer_state", True),
    kafka_errors.KafkaTimeoutError: FailureClass("broker_timeout", True),
    kafka_errors.KafkaConnectionError: FailureClass("broker_unavailable", True),
}
# Where the relay departs from aiokafka's flag on purpose: a producer-side timeout and a
# producer whose sequence state the broker lost are retried (on a fresh producer).
RETRIED_AGAINST_THE_FLAG = {
    kafka_errors.KafkaTimeoutError,
    kafka_errors.OutOfOrderSequenceNumber,
    kafka_errors.UnknownProducerId,
    kafka_errors.InvalidProducerEpoch,
    kafka_errors.InvalidProducerIdMapping,
}


def _bare_kafka_errors() -> list[tuple[type[kafka_errors.KafkaError], BaseException]]:
    kinds = {
        kind
        for kind in vars(kafka_errors).values()
        if isinstance(kind, type) and issubclass(kind, kafka_errors.KafkaError)
    }  # a set: aiokafka names some classes twice (aliases)
    errors = []
    for kind in kinds:
        try:
            errors.append((kind, kind()))
        except TypeError:
            continue  # needs constructor arguments; not raised bare by the producer
    return sorted(errors, key=lambda e: e[0].__name__)


def test_every_kafka_error_class_maps_to_a_stable_snake_case_name() -> None:
    snake = re.compile(r"^[a-z][a-z0-9_]*$")
    errors = _bare_kafka_errors()
    assert len(errors) > 50  # aiokafka's error module was read, not an empty loop
    against_the_flag = set()
    for kind, exc in errors:
        failure = classify_failure(exc)
        assert snake.match(failure.name), (kind.__name__, failure.name)
        own = next((c for base, c in OWN_CLASSES.items() if issubclass(kind, base)), None)
        if own is not None:
            assert failure == own, kind.__name__
        else:
            assert failure.retriable is bool(kind.retriable), (kind.__name__, failure)
        if failure.retriable is not bool(kind.retriable):
            against_the_flag.add(kind)
    assert against_the_flag == RETRIED_AGAINST_THE_FLAG


def test_message_text_does_not_change_the_class() -> None:
    a = classify_failure(kafka_errors.KafkaConnectionError("password=hunter2 at host"))
    b = classify_failure(kafka_errors.KafkaConnectionError())
    assert a == b
    assert "hunter2" not in a.name


# -- backoff ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("base", "cap"), [(500, 60_000), (100, 1_000), (1, 1), (7, 5_000)])
def test_backoff_stays_within_its_bounds(base: int, cap: int) -> None:
    rng = random.Random(20260101)
    for attempt in range(0, 80):
        ceiling = min(cap, base * 2**attempt)
        for _ in range(25):
            wait = backoff_ms(attempt, base_ms=base, cap_ms=cap, rng=rng)
            assert min(base // 2, ceiling) <= wait <= ceiling, (attempt, wait)
            assert wait <= cap


def test_backoff_grows_then_saturates_at_the_cap() -> None:
    rng = random.Random(1)
    first = [backoff_ms(0, base_ms=500, cap_ms=60_000, rng=rng) for _ in range(200)]
    late = [backoff_ms(20, base_ms=500, cap_ms=60_000, rng=rng) for _ in range(200)]
    assert max(first) <= 500
    assert max(late) <= 60_000
    assert max(late) > 30_000  # jitter spreads over the whole capped range
    assert min(late) >= 250


def test_backoff_is_jittered_and_reproducible_with_a_seed() -> None:
    a = [backoff_ms(5, base_ms=100, cap_ms=10_000, rng=random.Random(7)) for _ in range(3)]
    assert len(set(a)) == 1  # the same seed, the same wait
    rng = random.Random(7)
    spread = {backoff_ms(5, base_ms=100, cap_ms=10_000, rng=rng) for _ in range(50)}
    assert len(spread) > 10


def test_backoff_handles_odd_attempt_numbers() -> None:
    rng = random.Random(3)
    assert 250 <= backoff_ms(-3, base_ms=500, cap_ms=60_000, rng=rng) <= 500
    assert 250 <= backoff_ms(10**9, base_ms=500, cap_ms=60_000, rng=rng) <= 60_000


def test_backoff_without_an_rng_uses_the_module_random() -> None:
    for attempt in range(10):
        assert 50 <= backoff_ms(attempt, base_ms=100, cap_ms=2_000) <= 2_000


@pytest.mark.parametrize(
    "error",
    [
        kafka_errors.OutOfOrderSequenceNumber,
        kafka_errors.UnknownProducerId,
        kafka_errors.InvalidProducerEpoch,
    ],
)
def test_producer_sequence_errors_are_retried_on_a_fresh_producer(error: type[Exception]) -> None:
    failure = classify_failure(error())
    assert failure is PRODUCER_STATE
    assert failure.retriable


@pytest.mark.parametrize(
    ("failure", "step"),
    [
        (HELD_BEHIND_FAILURE, 0),  # says nothing about the broker: the base delay
        (BROKER_UNAVAILABLE, 4),  # the broker's failing: as long as its streak
        (RECORD_TOO_LARGE, 2),  # permanent: as many attempts as the row spent
    ],
)
def test_a_failed_row_waits_by_what_its_failure_says(failure: FailureClass, step: int) -> None:
    delay = retry_delay_ms(
        failure,
        failure_streak=4,
        attempts=2,
        base_ms=100,
        cap_ms=60_000,
        rng=random.Random(5),
    )
    assert delay == backoff_ms(step, base_ms=100, cap_ms=60_000, rng=random.Random(5))


@pytest.mark.parametrize("cause", ["too_large", "topic_not_allowed"])
def test_a_row_no_attempt_can_publish_is_quarantined_at_once(cause: str) -> None:
    failure = classify_failure(RecordRejected(cause, "detail"))
    assert failure.final and not failure.retriable
    assert failure.name == cause


def test_an_unexpected_error_s_metric_label_leaves_its_type_out() -> None:
    assert classify_failure(KeyError("x")).label == "unexpected"
    assert classify_failure(kafka_errors.KafkaTimeoutError()).label == "broker_timeout"
