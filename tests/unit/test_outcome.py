"""Sorting a batch by the broker's answers into published and failed rows, and the ledger of
when failed batches' keys were held. Pure."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import errors as kafka_errors

from relay.errors import RecordRejected
from relay.outcome import (
    Acknowledgement,
    Delayed,
    FailedRow,
    Landed,
    PublishedGroup,
    ToRecord,
    halves,
    rows_in,
    sort_outcome,
)
from relay.publisher import HoldLedger, SubmittedBatch
from relay.records import OutboxRow
from relay.retry import BROKER_TIMEOUT, BROKER_UNAVAILABLE, PRODUCER_STATE, FailureClass
from tests.support.rows import make_row

ROWS: list[OutboxRow] = [make_row(seq=seq, aggregateid=f"k{seq}") for seq in range(6)]


def test_landed_batches_are_published_groups_with_their_rows_in_batch_order() -> None:
    outcome = sort_outcome(
        [
            Acknowledgement([ROWS[0], ROWS[2]], Landed("t", 1, 40)),
            Acknowledgement([ROWS[1], ROWS[3]], Landed("t", 0, 7)),
        ],
        [],
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
        [
            Acknowledgement([ROWS[0]], Landed("t", 0, 1)),
            Acknowledgement([ROWS[1], ROWS[2]], kafka_errors.KafkaConnectionError()),
            Acknowledgement([ROWS[3]], TimeoutError()),  # never answered in time
        ],
        [],
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
        [Acknowledgement([ROWS[0]], kafka_errors.KafkaTimeoutError())],
        [
            (ROWS[4], RecordRejected("invalid_topic", "bad name")),
            (ROWS[5], kafka_errors.KafkaConnectionError()),
        ],
    )
    assert outcome.refused == [FailedRow(ROWS[0], BROKER_TIMEOUT)]
    assert outcome.rejected == [
        FailedRow(ROWS[4], FailureClass("invalid_topic", retriable=False)),
        FailedRow(ROWS[5], BROKER_UNAVAILABLE),
    ]
    assert outcome.failed == outcome.refused + outcome.rejected


def test_a_sequence_error_from_the_broker_breaks_the_producer() -> None:
    outcome = sort_outcome(
        [Acknowledgement([ROWS[0]], kafka_errors.OutOfOrderSequenceNumber())], []
    )
    assert outcome.refused == [FailedRow(ROWS[0], PRODUCER_STATE)]
    assert outcome.producer_broken


def test_a_sequence_error_before_sending_does_not_break_the_producer() -> None:
    outcome = sort_outcome([], [(ROWS[0], kafka_errors.UnknownProducerId())])
    assert outcome.rejected == [FailedRow(ROWS[0], PRODUCER_STATE)]
    assert not outcome.producer_broken


# -- the hold ledger (relay/publisher.py) ----------------------------------------------------------
async def test_a_batch_built_after_its_predecessor_s_keys_were_held_may_go() -> None:
    ledger = HoldLedger()
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[None] = loop.create_future()
    before = ledger.next_number()  # built while the failed batch's keys were not held
    ledger.held([SubmittedBatch(failed, [])])
    after = ledger.next_number()
    assert not ledger.held_before(failed, before)
    assert ledger.held_before(failed, after)


async def test_a_batch_whose_keys_were_never_held_holds_every_later_one_back() -> None:
    ledger = HoldLedger()
    never_held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert not ledger.held_before(never_held, ledger.next_number())


def test_an_outcome_refused_for_its_content_is_halved_into_slices_of_consecutive_offsets() -> None:
    """Recorded apart, a refused statement's rows stay in partition-batch slices (one
    receipt entry each), down to a single row, never exploded into one group per row."""
    failed = Delayed(FailedRow(ROWS[5], BROKER_TIMEOUT), 100)
    part: list[ToRecord] = [PublishedGroup("t", 0, 10, ROWS[:4]), failed]
    assert rows_in(part) == 5
    first, second = halves(part)
    assert (first, second) == ([PublishedGroup("t", 0, 10, ROWS[:4])], [failed])
    left, right = halves(first)
    assert left == [PublishedGroup("t", 0, 10, ROWS[:2])]
    assert right == [PublishedGroup("t", 0, 12, ROWS[2:4])]  # offsets run on
    # down to one row each: offset 13 is ROWS[3]'s, as in the whole group
    assert halves(right) == (
        [PublishedGroup("t", 0, 12, [ROWS[2]])],
        [PublishedGroup("t", 0, 13, [ROWS[3]])],
    )


@pytest.mark.parametrize(
    "one",
    [PublishedGroup("t", 0, 1, [ROWS[0]]), Delayed(FailedRow(ROWS[0], BROKER_TIMEOUT), 1)],
    ids=["published", "failed"],
)
def test_one_row_cannot_be_halved(one: ToRecord) -> None:
    assert rows_in([one]) == 1
    with pytest.raises(ValueError, match="one row"):
        halves([one])
