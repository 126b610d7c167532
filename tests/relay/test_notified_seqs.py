"""What a notification's payload tells the fetch loop, and where its next fetch starts."""

from __future__ import annotations

import pytest

from relay.wakeups import WakeUp, fetch_start, notified_seqs


@pytest.mark.parametrize(
    ("payload", "seqs"),
    [
        ("7,7", (7, 7)),
        ("3,12", (3, 12)),
        ("", None),  # an older trigger, or a redrive's wake-up
        ("12,3", None),
        ("0,4", None),  # seq starts at 1
        ("-1,4", None),
        ("4", None),
        ("4,", None),
        ("a,b", None),
        ("1,2,3", None),
        (" 1,2", None),
    ],
)
def test_notified_seqs(payload: str, seqs: tuple[int, int] | None) -> None:
    assert notified_seqs(payload) == seqs


@pytest.mark.parametrize(
    ("cursor", "lowest", "start"),
    [
        (100, None, 100),  # nothing notified: from the cursor
        (100, 150, 100),  # notified after the cursor: the cursor is below it already
        (100, 101, 100),
        (100, 100, 99),  # a late commit at the cursor's own seq would be passed over
        (100, 40, 39),  # a late commit: go back below it
        (0, 40, 0),
        (100, 1, 0),
    ],
)
def test_fetch_start(cursor: int, lowest: int | None, start: int) -> None:
    assert fetch_start(cursor, lowest) == start


def test_a_payload_without_seqs_asks_for_a_full_pass_and_a_fetch_from_zero_answers_it() -> None:
    wake = WakeUp()
    wake.notified("5,9")
    wake.notified("3,4")
    assert (wake.lowest_notified(), wake.heard_up_to, wake.full_pass_requested()) == (3, 9, False)
    assert wake.take_start(100) == 2
    assert wake.lowest_notified() is None  # covered by the fetch that starts now
    wake.notified("")
    assert wake.full_pass_requested() and wake.is_set()
    assert wake.take_start(50) == 50  # the fetch loop decides; a cursor fetch leaves it
    assert wake.full_pass_requested()
    assert wake.take_start(0) == 0
    assert not wake.full_pass_requested()
