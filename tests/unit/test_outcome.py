"""Sorting a batch by the broker's answers into published and failed rows. Pure."""

from __future__ import annotations

from aiokafka import errors as kafka_errors

from relay.outcome import Acknowledgement, FailedRow, Landed, PublishedGroup, sort_outcome
from relay.records import OutboxRow, RecordRejected
from relay.retry import BROKER_TIMEOUT, BROKER_UNAVAILABLE, PRODUCER_STATE, FailureClass
from tests.unit.test_records import make_row

ROWS: list[OutboxRow] = [make_row(seq=seq, aggregateid=f"k{seq}") for seq in range(6)]


def test_landed_batches_are_published_groups_with_their_rows_in_member_order() -> None:
    outcome = sort_outcome(
        ROWS,
        [
            Acknowledgement([0, 2], Landed("t", 1, 40)),
            Acknowledgement([1, 3], Landed("t", 0, 7)),
        ],
        {},
    )
    assert outcome.published == [
        PublishedGroup("t", 1, 40, [ROWS[0], ROWS[2]]),
        PublishedGroup("t", 0, 7, [ROWS[1], ROWS[3]]),
    ]
    assert outcome.failed == []
    assert outcome.published_count == 4
    assert not outcome.producer_broken


def test_each_member_of_a_failed_batch_fails_with_the_batch_s_class() -> None:
    outcome = sort_outcome(
        ROWS,
        [
            Acknowledgement([0], Landed("t", 0, 1)),
            Acknowledgement([1, 2], kafka_errors.KafkaConnectionError()),
            Acknowledgement([3], TimeoutError()),  # never answered in time
        ],
        {},
    )
    assert outcome.published_count == 1
    assert outcome.refused == [
        FailedRow(ROWS[1], BROKER_UNAVAILABLE),
        FailedRow(ROWS[2], BROKER_UNAVAILABLE),
        FailedRow(ROWS[3], BROKER_TIMEOUT),
    ]
    assert outcome.rejected == []


def test_early_failures_come_after_the_broker_s_and_keep_their_own_class() -> None:
    outcome = sort_outcome(
        ROWS,
        [Acknowledgement([0], kafka_errors.KafkaTimeoutError())],
        {4: RecordRejected("invalid_topic", "bad name"), 5: kafka_errors.KafkaConnectionError()},
    )
    assert outcome.refused == [FailedRow(ROWS[0], BROKER_TIMEOUT)]
    assert outcome.rejected == [
        FailedRow(ROWS[4], FailureClass("invalid_topic", retriable=False)),
        FailedRow(ROWS[5], BROKER_UNAVAILABLE),
    ]
    assert outcome.failed == outcome.refused + outcome.rejected


def test_a_sequence_error_from_the_broker_breaks_the_producer() -> None:
    outcome = sort_outcome(
        ROWS, [Acknowledgement([0], kafka_errors.OutOfOrderSequenceNumber())], {}
    )
    assert outcome.refused == [FailedRow(ROWS[0], PRODUCER_STATE)]
    assert outcome.producer_broken


def test_a_sequence_error_before_sending_does_not_break_the_producer() -> None:
    outcome = sort_outcome(ROWS, [], {0: kafka_errors.UnknownProducerId()})
    assert outcome.rejected == [FailedRow(ROWS[0], PRODUCER_STATE)]
    assert not outcome.producer_broken
