"""What a notification's payload hints to the fetch loop, and where its next fetch starts."""

from __future__ import annotations

import pytest

from relay.passes import News, fetch_start
from relay.wakeups import NOTIFIED_LISTED, WakeUp, notified_seqs


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
        ("1,2\n", None),
        ("٣,٤", None),  # digits of another script
        ("²,³", None),  # that int() would refuse
        ("1," + "9" * 20, None),  # past bigint
        ("1," + "9" * 5000, None),  # past what int() converts
        ("1,9223372036854775807", (1, 9223372036854775807)),
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


def test_a_payload_without_seqs_hints_at_a_full_pass_and_taking_the_news_forgets_it() -> None:
    wake = WakeUp()
    assert wake.take_news() == News()
    wake.notified("5,9")
    wake.notified("3,4")
    assert wake.take_news() == News(lowest_notified=3, notified=((5, 9), (3, 4)))
    assert wake.take_news() == News()  # handed to the passes, which keep it from there
    wake.notified("")
    assert wake.is_set()
    # a hint, not the relay's own request
    assert wake.take_news() == News(full_pass_hinted=True)
    assert wake.take_news() == News()


def test_the_relay_s_own_full_pass_request_is_told_apart_from_a_hint() -> None:
    wake = WakeUp()
    wake.request_full_pass()
    wake.request_full_passes_until(12.5)
    wake.request_full_passes_until(3.0)  # the later deadline holds
    assert wake.take_news() == News(full_pass_requested=True, full_passes_until=12.5)
    assert wake.take_news() == News()


def test_past_the_listed_notifications_only_the_lowest_seq_is_kept() -> None:
    wake = WakeUp()
    for seq in range(NOTIFIED_LISTED, 0, -1):
        wake.notified(f"{seq},{seq}")
    listed = wake.take_news()
    assert listed.notified is not None and len(listed.notified) == NOTIFIED_LISTED
    for seq in range(NOTIFIED_LISTED + 1, 0, -1):
        wake.notified(f"{seq},{seq}")
    assert wake.take_news() == News(lowest_notified=1, notified=None)
    assert wake.take_news() == News()
