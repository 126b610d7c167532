"""The fetch loop's pass decisions (relay/passes.py), one case per race the integration
tests stage against the real services. No services: the clock, the fetched rows and what
notifications said are passed in."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from relay.inflight import InFlightWindow
from relay.passes import (
    HINTS_PER_POLL,
    QUIET_MS,
    Accepted,
    Fetched,
    FetchPlan,
    Passes,
    within_bound,
)
from relay.records import MAX_FETCHED_ROW_BYTES, OutboxRow, RecordMapper
from tests.support.rows import make_row

POLL_MS = 1_000
BATCH = 3
BUDGET = 1_000  # bytes a fetch transfers, plus one row
LANES = frozenset({0, 1})


def row(
    seq: int,
    key: str | None = None,
    lane: int = 0,
    holds_key: bool = False,
    size: int | None = 10,
    earlier: int | None = None,
) -> OutboxRow:
    return make_row(
        seq=seq,
        aggregateid=key or f"k{seq}",
        lane=lane,
        holds_key=holds_key,
        size=size,
        earlier=earlier,
    )


_HOLD_OF = RecordMapper(topic_template="t.{aggregatetype}", ce_source="urn:t").hold_of


def new_window(capacity: int) -> InFlightWindow:
    return InFlightWindow(capacity, hold_of=_HOLD_OF)


def keyed(key: str) -> OutboxRow:
    return row(0, key=key)


def failed(*keys: str) -> list[OutboxRow]:
    """One failed row per key given (all go to the same topic)."""
    return [keyed(key) for key in keys]


def rows(*seqs: int) -> list[OutboxRow]:
    return [row(seq) for seq in seqs]


def seqs(found: Iterable[OutboxRow]) -> list[int]:
    return [r.seq for r in found]


def new_passes(window: InFlightWindow | None = None) -> Passes:
    return Passes(
        window or new_window(4),
        poll_interval_ms=POLL_MS,
        batch_size=BATCH,
        fetch_max_bytes=BUDGET,
    )


def fetch(
    passes: Passes,
    found: list[OutboxRow],
    *,
    now: float = 0.0,
    lowest: int | None = None,
    requested: bool = False,
    hinted: bool = False,
    until: float = 0.0,
    bound: int | None = None,
) -> Fetched:
    """Plan and run one fetch as the loop does (start, plan, leave_out, mark, fetched)."""
    passes.start(
        now, full_pass_requested=requested, full_pass_hinted=hinted, full_passes_until=until
    )
    plan = passes.plan(LANES, now, lowest)
    left_out = passes.leave_out(plan)
    window = passes._window
    return passes.fetched(plan, found, mark=window.fetch_mark(), left_out=left_out, bound=bound)


def accept(passes: Passes, fetched: Fetched) -> Accepted:
    return passes.accept(fetched)


def settle_cursor_fetches(passes: Passes, *, now: float = 0.0) -> None:
    """A full pass whose one fetch was not full: the fetches after it are cursor fetches."""
    accepted = accept(passes, fetch(passes, rows(1, 2), now=now, bound=2))
    assert not accepted.full
    passes.ended()


# -- pure helpers -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("found", "bound", "kept", "cut"),
    [
        ([], 5, [], False),
        ([4, 5], 5, [4, 5], False),  # up to the bound: nothing cut
        ([4, 5, 6, 9], 5, [4, 5], True),  # above it: the pass ends before 6
        ([6, 7], 5, [], True),
        ([4, 9], None, [4, 9], False),  # the bound is not known: nothing is cut
    ],
)
def test_a_pass_s_later_fetch_sends_nothing_above_its_bound(
    found: list[int], bound: int | None, kept: list[int], cut: bool
) -> None:
    result, was_cut = within_bound(rows(*found), bound)
    assert (seqs(result), was_cut) == (kept, cut)


# -- when a pass starts from the beginning ------------------------------------------------------
async def test_the_first_fetch_opens_a_full_pass_from_the_beginning() -> None:
    passes = new_passes()
    fetched = fetch(passes, rows(1, 2, 3), bound=3)
    assert fetched.plan == FetchPlan(LANES, 0, BATCH, cursor_fetch=False, opens_pass=True)
    assert passes.in_full_pass


async def test_a_full_pass_s_fetches_follow_from_the_cursor_while_full() -> None:
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1, 2, 3), bound=9))
    assert accepted.full and passes.cursor == 3
    second = fetch(passes, rows(4, 5), now=0.1)
    assert second.plan == FetchPlan(LANES, 3, BATCH, cursor_fetch=False, opens_pass=False)
    accepted = accept(passes, second)
    assert seqs(accepted.rows) == [4, 5] and not accepted.full
    assert passes.cursor == 5


async def test_after_a_short_fetch_the_next_fetch_is_a_cursor_fetch() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, rows(3), now=0.2)
    assert fetched.plan == FetchPlan(LANES, 2, BATCH, cursor_fetch=True, opens_pass=False)


@pytest.mark.parametrize(
    ("why", "now", "requested", "until"),
    [
        ("a poll interval after the pass began", POLL_MS / 1000, False, 0.0),
        ("asked for (a poll, a notification without seqs)", 0.2, True, 0.0),
        ("a recorded failure waits for its retry", 0.2, False, 0.5),
    ],
)
async def test_a_full_pass_comes_when_due(
    why: str, now: float, requested: bool, until: float
) -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, rows(3), now=now, requested=requested, until=until)
    assert fetched.plan.start == 0 and fetched.plan.opens_pass, why


async def test_no_full_pass_while_nothing_is_due() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, rows(3), now=POLL_MS / 1000 - 0.01)
    assert fetched.plan.start == 2 and not fetched.plan.opens_pass


async def test_full_passes_are_due_until_the_retry_deadline_and_not_after() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    assert fetch(passes, [], now=0.1, until=0.5).plan.opens_pass
    accept(passes, fetch(passes, [], now=0.1))  # the pass's first fetch: nothing read
    passes.ended()
    passes.cursor = 7  # as if a fetch had read up to 7 since
    assert passes.full_pass_due(0.4, requested=False)  # the deadline is kept, not consumed
    assert not passes.full_pass_due(0.6, requested=False)


async def test_lanes_gained_since_the_last_fetch_need_a_full_pass() -> None:
    passes = new_passes()
    assert not passes.lanes_gained({0, 1, 2})  # at the beginning already
    settle_cursor_fetches(passes)
    assert not passes.lanes_gained({0})  # a lane handed back: nothing behind the cursor
    assert passes.lanes_gained({0, 1, 2})  # a hand-over brought lane 2 with its backlog


async def test_rows_a_fetch_left_out_bring_the_next_pass_from_the_beginning() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, [row(3, lane=0), row(4, lane=5)], now=0.1)
    accepted = accept(passes, fetched)
    # Lane 5 was handed back meanwhile: its row is stepped over.
    assert seqs(passes.sendable(accepted.rows, {0}, fetched.mark)) == [3]
    assert passes.full_pass_due(0.2, requested=False)
    fetched = fetch(passes, [], now=0.2)
    assert fetched.plan.start == 0
    assert not passes.full_pass_due(0.3, requested=False)  # the new pass took it


async def test_a_pass_that_began_while_keys_were_held_is_irregular() -> None:
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    window.hold(failed("k-failed"))  # its failure is not recorded yet
    assert passes.full_pass_due(0.1, requested=False)


# -- cursor fetches: late commits and notifications ---------------------------------------------
async def test_a_row_whose_earlier_pending_row_was_not_read_waits_for_it() -> None:
    """A late commit below the start (its transaction committed after the cursor passed
    its seq): the statement names it as the row's earlier pending row, and the row is not
    sent before it. The next fetch starts just below it, at once."""
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, [row(5, key="late"), row(6, key="k6")], now=0.1)
    assert fetched.plan.check_below == 2
    fetched = passes.fetched(
        fetched.plan,
        [row(5, key="late", earlier=1), row(6, key="k6")],  # fewer than the limit
        mark=fetched.mark,
        left_out=frozenset(),
    )
    accepted = accept(passes, fetched)
    assert seqs(accepted.rows) == [6]
    assert accepted.full  # the next fetch follows at once, not on the next wake-up
    again = fetch(passes, [], now=0.2)
    assert again.plan.start == 0 and again.plan.cursor_fetch


async def test_an_earlier_row_in_flight_is_no_late_commit() -> None:
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    window.admit([row(2, key="k")])  # sent, not recorded yet
    fetched = fetch(passes, [row(3, key="k", earlier=2)], now=0.1)
    assert fetched.left_out == frozenset({2})
    accepted = accept(passes, fetched)
    assert seqs(accepted.rows) == [3]


async def test_an_earlier_row_sent_while_a_prefetch_ran_is_no_late_commit() -> None:
    """A prefetch's statement starts before the batch read just before it is admitted to
    the window: that batch's rows are not in its left-out set, yet in flight."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    prefetch = passes.prefetch_plan([0, 1])
    left_out = passes.leave_out(prefetch)
    window.admit([row(2, key="k")])  # the batch before it goes in flight now
    fetched = passes.fetched(
        prefetch, [row(3, key="k", earlier=2)], mark=window.fetch_mark(), left_out=left_out
    )
    assert 2 not in fetched.left_out
    assert seqs(accept(passes, fetched).rows) == [3]


async def test_an_earlier_row_recorded_while_the_fetch_ran_is_no_late_commit() -> None:
    """In flight when the statement started, recorded (deleted) by the time its rows come
    back: the statement still saw it pending."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    await window.take_slot()
    window.admit([row(2, key="k")])
    fetched = fetch(passes, [row(3, key="k", earlier=2)], now=0.1)
    window.release([row(2, key="k")], [])
    assert seqs(accept(passes, fetched).rows) == [3]


async def test_a_pass_s_fetch_does_not_ask_for_earlier_rows() -> None:
    """A pass's later fetches are kept by its bound; the statement is spared the lookup."""
    passes = new_passes()
    first = fetch(passes, rows(1, 2, 3), bound=9)
    assert first.plan.check_below == 0
    accept(passes, first)
    assert fetch(passes, rows(4), now=0.1).plan.check_below == 0


async def test_a_notified_seq_below_the_cursor_moves_the_start_within_the_hint_budget() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    starts = []
    for n in range(HINTS_PER_POLL + 2):
        passes.cursor = 9
        starts.append(fetch(passes, [], now=0.1 + n / 100, lowest=5).plan.start)
    assert starts == [4] * HINTS_PER_POLL + [9, 9]  # forged floods cost a bounded number
    # A poll interval later (a new pass has begun meanwhile) the budget is back.
    later = 0.1 + POLL_MS / 1000
    settle_cursor_fetches(passes, now=later)
    passes.cursor = 9
    assert fetch(passes, [], now=later + 0.05, lowest=5).plan.start == 4


async def test_a_notified_seq_up_to_a_batch_below_the_start_moves_it_past_the_budget() -> None:
    """Concurrent writers commit a few seqs late all the time: reading a batch again costs
    what a cursor fetch costs, so those hints are always honoured."""
    passes = new_passes()
    settle_cursor_fetches(passes)
    starts = []
    for n in range(HINTS_PER_POLL + 2):
        passes.cursor = 9
        starts.append(fetch(passes, [], now=0.1 + n / 100, lowest=9 - BATCH + 1).plan.start)
    assert starts == [9 - BATCH] * (HINTS_PER_POLL + 2)
    # and they leave the budget for hints from further below untouched
    passes.cursor = 9
    assert fetch(passes, [], now=0.2, lowest=2).plan.start == 1


async def test_a_notification_without_seqs_brings_a_full_pass_within_the_hint_budget() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    opened = []
    for n in range(HINTS_PER_POLL + 2):
        passes.cursor = 9
        opened.append(fetch(passes, [], now=0.1 + n / 100, hinted=True).plan.opens_pass)
    assert opened == [True] * HINTS_PER_POLL + [False, False]


async def test_a_notification_above_the_cursor_does_not_move_the_start() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    assert fetch(passes, [], now=0.1, lowest=50).plan.start == 2


async def test_a_full_pass_s_fetch_sends_every_row_it_reads() -> None:
    """After a restart the backlog's rows were never notified: a full pass sends them."""
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1, 2, 3), bound=3))
    assert seqs(accepted.rows) == [1, 2, 3]


async def test_a_cursor_that_went_back_for_a_late_commit_returns_to_where_it_was() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, rows(1, 2, 3), bound=20))
    accept(passes, fetch(passes, rows(8, 9), now=0.1))  # not full: cursor 9
    passes.ended()
    assert passes.cursor == 9
    fetched = fetch(passes, rows(5), now=0.2, lowest=5)  # below the late seq 5
    accepted = accept(passes, fetched)
    assert seqs(accepted.rows) == [5]
    assert passes.cursor == 9


# -- the pass's bound -----------------------------------------------------------------------------
async def test_a_pass_s_later_fetch_that_meets_its_bound_ends_the_pass() -> None:
    """A row the pass's first fetch stepped over (not yet committed) lies behind the
    cursor; its key's next row took a seq above the bound: the pass must not send it."""
    passes = new_passes()
    first = accept(passes, fetch(passes, rows(1, 2, 3), bound=4))
    assert first is not None and first.full
    accepted = accept(passes, fetch(passes, rows(4, 5, 6), now=0.1))
    assert seqs(accepted.rows) == [4]
    assert accepted.cut and accepted.full  # the next pass starts from the beginning at once
    assert not passes.may_prefetch(0.1, accepted, [0, 1], producer_broken=False, slot_free=True)


async def test_a_cut_short_fetch_still_lets_the_next_pass_follow_at_once() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, rows(1, 2, 3), bound=4))
    accepted = accept(passes, fetch(passes, rows(4, 5), now=0.1))  # not full, but cut
    assert accepted.cut and accepted.full


async def test_only_the_pass_s_first_fetch_sets_its_bound() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, rows(1, 2, 3), bound=3))
    accepted = accept(passes, fetch(passes, rows(4, 5, 6), now=0.1, bound=99))
    assert accepted.cut and seqs(accepted.rows) == []


async def test_the_bound_is_read_ahead_once_half_a_poll_interval_into_the_pass() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    assert not passes.bound_refresh_due(POLL_MS / 2000 - 0.01)
    assert passes.bound_refresh_due(POLL_MS / 2000)
    assert not passes.bound_refresh_due(POLL_MS / 2000 + 0.1)  # already being read
    passes.bound_read(42)
    assert not passes.bound_refresh_due(POLL_MS / 2000 + 0.2)  # one is waiting
    assert passes.take_spare_bound() == 42
    assert passes.take_spare_bound() is None
    assert passes.bound_refresh_due(POLL_MS / 2000 + 0.3)
    passes.bound_read(None)  # the read failed: the next pass reads its own
    assert passes.take_spare_bound() is None


# -- rows in flight and held keys -----------------------------------------------------------------
async def test_a_fetch_that_goes_back_leaves_out_the_rows_in_flight() -> None:
    window = new_window(4)
    passes = new_passes(window)
    accept(passes, fetch(passes, rows(1, 2, 3), bound=20))
    window.admit(rows(1, 2, 3))  # sent, not recorded yet
    ahead = fetch(passes, rows(4, 5), now=0.1)
    assert ahead.plan.start == 3 and seqs(ahead.rows) == [4, 5]  # nothing in flight past 3
    accept(passes, ahead)
    passes.ended()
    again = fetch(passes, rows(2, 3, 6), now=POLL_MS / 1000)  # a new pass meets them
    assert again.plan.start == 0
    assert seqs(again.rows) == [6]
    assert again.last_seq == 6 and again.full  # the statement's rows, not the ones kept


async def test_a_row_held_behind_a_retry_published_within_the_pass_is_not_sent() -> None:
    """The pass's first fetch reads the key's row waiting for its retry (the database
    holds the key's next row back, so the cursor passes it). Once that row is published
    and released in the same pass, a later fetch of the pass would read the key's rows
    after the cursor: they wait for the next pass, which reads the stepped-over row first."""
    window = new_window(4)
    passes = new_passes(window)
    retried = row(1, key="k", holds_key=True)
    first = fetch(passes, [retried, row(3, key="other"), row(4, key="other2")], bound=9)
    accepted = accept(passes, first)
    assert accepted.full
    # The next fetch is read ahead while this one is sent; its statement is slow.
    assert passes.may_prefetch(0.0, accepted, [0, 1], producer_broken=False, slot_free=True)
    prefetch = passes.prefetch_plan([0, 1])
    prefetch_mark = window.fetch_mark()
    sent = passes.sendable(accepted.rows, LANES, first.mark)
    window.fetch_done(first.mark)
    assert seqs(sent) == [1, 3, 4]
    window.admit(sent)
    window.release(sent, [])  # published and recorded: the database's hold lifts
    later = passes.fetched(
        prefetch, [row(5, key="k"), row(6, key="other")], mark=prefetch_mark, left_out=frozenset()
    )
    accepted = accept(passes, later)
    assert seqs(passes.sendable(accepted.rows, LANES, later.mark)) == [6]
    window.fetch_done(later.mark)
    # And a fetch planned after the release starts the next pass from the beginning.
    assert fetch(passes, [], now=0.1).plan.start == 0


async def test_a_key_released_since_the_pass_began_waits_for_the_next_pass() -> None:
    """The pass's fetches follow each other as prefetches (no new plan in between). A key
    released after the pass began may have rows the pass stepped over: a fetch that starts
    after the release still leaves the key out."""
    window = new_window(4)
    passes = new_passes(window)
    window.hold(failed("k"))
    first = fetch(passes, rows(1, 2, 3), bound=99)
    accepted = accept(passes, first)
    assert accepted.full
    window.fetch_done(first.mark)
    window.admit([row(0, key="k")])
    window.release([row(0, key="k")], failed("k"))  # released after the pass began
    prefetch = passes.prefetch_plan([0, 1])
    later = passes.fetched(
        prefetch, [row(4, key="k"), row(5, key="j")], mark=window.fetch_mark(), left_out=frozenset()
    )
    accepted = accept(passes, later)
    assert seqs(passes.sendable(accepted.rows, LANES, later.mark)) == [5]


async def test_a_fetch_whose_snapshot_predates_a_release_does_not_send_that_key() -> None:
    """The failure is recorded while the fetch's statement runs: the statement may still
    see the key free, and the in-memory hold is gone by the time its rows come back."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    window.hold(failed("k"))
    fetched = fetch(passes, [row(3, key="k"), row(4, key="free")], now=0.1)  # snapshot
    window.admit([row(1, key="k")])
    window.release([row(1, key="k")], failed("k"))  # recorded: the hold moves on
    accepted = accept(passes, fetched)
    assert seqs(passes.sendable(accepted.rows, LANES, fetched.mark)) == [4]


async def test_a_held_key_s_rows_are_left_out_and_the_others_go() -> None:
    window = new_window(4)
    passes = new_passes(window)
    window.hold(failed("k"))
    fetched = fetch(passes, [row(1, key="k"), row(2, key="j")], bound=9)
    accepted = accept(passes, fetched)
    assert seqs(passes.sendable(accepted.rows, LANES, fetched.mark)) == [2]


async def test_while_nothing_is_held_every_row_of_a_held_lane_goes() -> None:
    passes = new_passes()
    fetched = fetch(passes, [row(1, key="k"), row(2, key="k")], bound=9)
    accepted = accept(passes, fetched)
    assert seqs(passes.sendable(accepted.rows, LANES, fetched.mark)) == [1, 2]
    assert not passes.full_pass_due(0.1, requested=False)


# -- prefetch ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("why", "now", "lanes", "broken", "slot_free", "expected"),
    [
        ("a full fetch within the pass", 0.1, [0, 1], False, True, True),
        ("the pass is a poll interval old", POLL_MS / 1000, [0, 1], False, True, False),
        ("no lane left", 0.1, [], False, True, False),
        ("a lane gained since the fetch", 0.1, [0, 1, 2], False, True, False),
        ("the producer must be replaced", 0.1, [0, 1], True, True, False),
        ("no slot free", 0.1, [0, 1], False, False, False),
    ],
)
async def test_the_next_fetch_is_read_ahead_only_while_the_pass_runs_on(
    why: str, now: float, lanes: list[int], broken: bool, slot_free: bool, expected: bool
) -> None:
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1, 2, 3), bound=9))
    assert accepted.full
    decided = passes.may_prefetch(now, accepted, lanes, producer_broken=broken, slot_free=slot_free)
    assert decided is expected, why


async def test_a_short_fetch_is_not_followed_by_a_prefetch() -> None:
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1), bound=9))
    assert not accepted.full
    assert not passes.may_prefetch(0.1, accepted, [0, 1], producer_broken=False, slot_free=True)


async def test_a_prefetch_reads_from_the_cursor_as_the_pass_s_kind_of_fetch() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, rows(1, 2, 3), bound=9))
    assert passes.prefetch_plan([0, 1]) == FetchPlan(
        LANES, 3, BATCH, cursor_fetch=False, opens_pass=False
    )


async def test_closing_lets_the_pass_s_mark_go() -> None:
    window = new_window(4)
    passes = new_passes(window)
    fetched = fetch(passes, [], bound=0)
    window.fetch_done(fetched.mark)
    window.hold(failed("k"))
    window.release([], failed("k"))  # released while the pass is open: remembered
    assert not window.holds_nothing()
    passes.close()
    window.fetch_done(window.fetch_mark())  # any later fetch prunes what nobody needs
    assert window.holds_nothing()


# -- sizes ----------------------------------------------------------------------------------------
async def test_a_fetch_cut_by_its_byte_budget_is_full_and_the_next_asks_for_a_whole_batch() -> None:
    """The statement printed nothing past the budget (the sizes were measured at the door),
    so asking for a whole batch again costs nothing it does not return."""
    passes = new_passes()
    big = [row(1, size=600), row(2, size=600)]  # the second crossed the budget: cut there
    fetched = fetch(passes, big, bound=9)
    assert fetched.full and fetched.transferred_bytes == 1_200
    accept(passes, fetched)
    assert fetch(passes, [row(3, size=600)], now=0.1).plan.limit == BATCH


async def test_a_row_too_large_to_fetch_whole_counts_what_it_brings_toward_the_budget() -> None:
    passes = new_passes()
    large = row(1, size=MAX_FETCHED_ROW_BYTES + 1)
    fetched = fetch(passes, [large, row(2, size=10)], bound=9)
    brought = 36 + len(large.aggregatetype) + len(large.aggregateid) + len(large.type)
    assert fetched.transferred_bytes == brought + 10 and not fetched.full


async def test_a_row_stored_before_the_door_and_not_measured_is_not_sent_but_read_again() -> None:
    passes = new_passes()
    fetched = fetch(passes, [row(1, size=None), row(2)], bound=9)
    sent = passes.sendable(accept(passes, fetched).rows, LANES, fetched.mark)
    assert seqs(sent) == [2]
    passes.ended()
    passes.start(0.1, full_pass_requested=False)
    assert passes.plan(LANES, 0.1).start == 0  # the next pass reads it from the beginning


async def test_a_row_whose_outcome_cannot_be_recorded_is_never_sent_again() -> None:
    passes = new_passes()
    passes.leave_out_for_good(2)
    fetched = fetch(passes, rows(1, 2, 3), bound=9)
    sent = passes.sendable(accept(passes, fetched).rows, LANES, fetched.mark)
    assert seqs(sent) == [1, 3]
    assert passes.left_out_for_good == 1
    assert not passes.full_pass_due(0.1, requested=False)  # not a row stepped over


async def test_a_pass_that_found_nothing_moves_the_cursor_to_its_bound() -> None:
    """An empty outbox: the fetches after it start at the bound as cursor fetches, rather
    than from the beginning on every wake-up."""
    passes = new_passes()
    accept(passes, fetch(passes, [], bound=41))
    passes.ended()
    nxt = fetch(passes, [], now=0.1)
    assert (nxt.plan.start, nxt.plan.cursor_fetch, nxt.plan.opens_pass) == (41, True, False)


async def test_a_pass_whose_bound_is_unknown_keeps_its_cursor() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, [], bound=None))
    passes.ended()
    assert fetch(passes, [], now=0.1).plan.opens_pass


async def test_after_a_fetch_that_read_nothing_the_next_waits_a_little() -> None:
    """A stream of notifications announcing nothing costs a fetch per QUIET_MS at most."""
    passes = new_passes()
    accept(
        passes,
        passes.fetched(passes.plan(LANES, 0.0), [], mark=0, left_out=frozenset(), started_at=5.0),
    )
    assert passes.quiet_left(5.0) == pytest.approx(QUIET_MS / 1000)
    assert passes.quiet_left(5.0 + QUIET_MS / 1000) == 0.0  # long after: at once


async def test_after_a_fetch_that_read_rows_the_next_waits_for_nothing() -> None:
    passes = new_passes()
    found = passes.fetched(
        passes.plan(LANES, 0.0), rows(1), mark=0, left_out=frozenset(), started_at=5.0
    )
    accept(passes, found)
    assert passes.quiet_left(5.0) == 0.0
