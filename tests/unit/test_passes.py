"""The fetch loop's pass decisions (relay/passes.py), one case per race the integration
tests stage against the real services. No services and no event loop: the clock, the
fetched rows and what notifications said are passed in, and every decision comes back as a
value."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from relay.inflight import InFlightWindow
from relay.passes import (
    HINTS_PER_POLL,
    QUIET_MS,
    READ_REMEMBERED,
    Accepted,
    Fetch,
    Fetched,
    FetchKind,
    FetchPlan,
    News,
    Passes,
    ReplaceProducer,
    ResolveHolds,
    Wait,
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


def in_flight(window: InFlightWindow, batch: list[OutboxRow]) -> None:
    """The batch is sent and not recorded yet, in a slot of its own."""
    slot = window.try_take_slot()
    assert slot is not None
    window.admit(batch, slot)


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
    lanes: frozenset[int] = LANES,
) -> Fetched:
    """Decide, plan and run one fetch as the loop does (next, plan, open_fetch, fetched)."""
    news = News(requested, hinted, until, lowest)
    decision = passes.next(now, sorted(lanes), news, producer_broken=False, holds_resolved=True)
    assert decision == Fetch(lanes)
    plan = passes.plan(lanes, now)
    left_out, mark = passes.open_fetch(plan)
    return passes.fetched(plan, found, mark=mark, left_out=left_out, bound=bound)


def fetched_at(passes: Passes, found: list[OutboxRow], started_at: float) -> Fetched:
    """A fetch planned without news, whose statement started at ``started_at``."""
    plan = passes.plan(LANES, started_at)
    left_out, mark = passes.open_fetch(plan)
    return passes.fetched(plan, found, mark=mark, left_out=left_out, started_at=started_at)


def accept(passes: Passes, fetched: Fetched) -> Accepted:
    return passes.accept(fetched)


def settle_cursor_fetches(passes: Passes, *, now: float = 0.0) -> None:
    """A full pass whose one fetch was not full: the fetches after it are cursor fetches."""
    accepted = accept(passes, fetch(passes, rows(1, 2), now=now, bound=2))
    assert not accepted.more_now and not passes.in_full_pass


def prefetch(passes: Passes, accepted: Accepted, now: float = 0.0) -> FetchPlan:
    """The prefetch the loop starts after ``accepted`` (there must be one)."""
    plan = passes.prefetch(now, accepted, sorted(LANES), producer_broken=False, slot_free=True)
    assert plan is not None
    return plan


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
def test_the_first_fetch_opens_a_full_pass_from_the_beginning() -> None:
    passes = new_passes()
    fetched = fetch(passes, rows(1, 2, 3), bound=3)
    assert fetched.plan == FetchPlan(LANES, 0, BATCH, FetchKind.OPENS_PASS)
    assert passes.in_full_pass


def test_a_full_pass_s_fetches_follow_from_the_cursor_while_full() -> None:
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1, 2, 3), bound=9))
    assert accepted.more_now and passes.cursor == 3
    second = fetch(passes, rows(4, 5), now=0.1)
    assert second.plan == FetchPlan(LANES, 3, BATCH, FetchKind.IN_PASS)
    accepted = accept(passes, second)
    assert seqs(accepted.rows) == [4, 5] and not accepted.more_now
    assert passes.cursor == 5


def test_after_a_short_fetch_the_next_fetch_is_a_cursor_fetch() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, rows(3), now=0.2)
    assert fetched.plan == FetchPlan(LANES, 2, BATCH, FetchKind.CURSOR)


@pytest.mark.parametrize(
    ("why", "now", "requested", "until"),
    [
        ("a poll interval after the pass began", POLL_MS / 1000, False, 0.0),
        ("asked for (a poll, a notification without seqs)", 0.2, True, 0.0),
        ("a recorded failure waits for its retry", 0.2, False, 0.5),
    ],
)
def test_a_full_pass_comes_when_due(why: str, now: float, requested: bool, until: float) -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, rows(3), now=now, requested=requested, until=until)
    assert fetched.plan.start == 0 and fetched.plan.kind is FetchKind.OPENS_PASS, why


def test_no_full_pass_while_nothing_is_due() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    fetched = fetch(passes, rows(3), now=POLL_MS / 1000 - 0.01)
    assert fetched.plan.start == 2 and fetched.plan.kind is not FetchKind.OPENS_PASS


def test_full_passes_are_due_until_the_retry_deadline_and_not_after() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    assert fetch(passes, [], now=0.1, until=0.5).plan.kind is FetchKind.OPENS_PASS
    accept(passes, fetch(passes, [], now=0.1))  # the pass's first fetch: nothing read
    passes.cursor = 7  # as if a fetch had read up to 7 since
    assert passes.full_pass_due(0.4, requested=False)  # the deadline is kept, not consumed
    assert not passes.full_pass_due(0.6, requested=False)


def test_lanes_gained_since_the_last_fetch_need_a_full_pass() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    # a lane handed back: nothing behind the cursor
    shrunk = fetch(passes, [], now=0.1, lanes=frozenset({0}))
    assert shrunk.plan.kind is FetchKind.CURSOR
    accept(passes, shrunk)
    # lanes 1 and 2 came (back) with a backlog the cursor has moved past
    grown = fetch(passes, [], now=0.2, lanes=frozenset({0, 1, 2}))
    assert grown.plan.kind is FetchKind.OPENS_PASS


def test_the_loop_is_told_to_wait_replace_resolve_or_fetch() -> None:
    """Before a fetch: the quiet after one that read nothing, a producer to replace, no
    lane to fetch from, holds to resolve, then the fetch; each a value, nothing run."""
    passes = new_passes()
    settle_cursor_fetches(passes)
    accept(passes, fetched_at(passes, [], started_at=5.0))  # read nothing
    lanes = sorted(LANES)

    def decide(now: float, **facts: bool) -> object:
        told = {"producer_broken": False, "holds_resolved": True} | facts
        return passes.next(now, lanes, News(), **told)

    assert passes.quiet_left(5.0) == pytest.approx(QUIET_MS / 1000)
    assert decide(5.0) == Wait(passes.quiet_left(5.0), for_news=False)
    later = 5.0 + QUIET_MS / 1000
    assert decide(later, producer_broken=True) == ReplaceProducer()
    assert passes.next(later, [], News(), producer_broken=False, holds_resolved=True) == Wait(
        POLL_MS / 1000, for_news=True
    )
    assert decide(later, holds_resolved=False) == ResolveHolds(LANES)
    assert decide(later) == Fetch(LANES)


def test_a_full_pass_asked_for_is_kept_until_a_fetch_from_the_beginning_covers_it() -> None:
    """News taken while the loop waits for something else (a producer, holds) is not lost:
    the pass opens when the loop fetches next; the fetch from the beginning answers it."""
    passes = new_passes()
    settle_cursor_fetches(passes)
    lanes = sorted(LANES)
    asked = News(full_pass_requested=True)
    assert passes.next(0.1, lanes, asked, producer_broken=False, holds_resolved=False) == (
        ResolveHolds(LANES)
    )
    opened = fetch(passes, [], now=0.2, bound=2)
    assert opened.plan.kind is FetchKind.OPENS_PASS
    accept(passes, opened)
    assert fetch(passes, [], now=0.4).plan.kind is FetchKind.CURSOR  # answered


def test_rows_a_fetch_left_out_bring_the_next_pass_from_the_beginning() -> None:
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


def test_a_pass_that_began_while_keys_were_held_is_irregular() -> None:
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    window.hold(failed("k-failed"))  # its failure is not recorded yet
    assert passes.full_pass_due(0.1, requested=False)


# -- cursor fetches: late commits and notifications ---------------------------------------------
def test_a_row_whose_earlier_pending_row_was_not_read_waits_for_it() -> None:
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
    assert accepted.more_now  # the next fetch follows at once, not on the next wake-up
    again = fetch(passes, [], now=0.2)
    assert again.plan.start == 0 and again.plan.kind is FetchKind.CURSOR


def test_an_earlier_row_in_flight_is_no_late_commit() -> None:
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    in_flight(window, [row(2, key="k")])  # sent, not recorded yet
    fetched = fetch(passes, [row(3, key="k", earlier=2)], now=0.1)
    assert fetched.left_out == frozenset({2})
    accepted = accept(passes, fetched)
    assert seqs(accepted.rows) == [3]


def test_an_earlier_row_sent_while_a_prefetch_ran_is_no_late_commit() -> None:
    """A prefetch's statement starts before the batch read just before it is admitted to
    the window: that batch's rows are not in its left-out set, yet in flight."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    accepted = accept(passes, fetch(passes, rows(3, 4, 5), now=0.1))  # full: read ahead
    ahead = prefetch(passes, accepted, now=0.1)
    assert ahead.kind is FetchKind.CURSOR and ahead.check_below == 5
    left_out, mark = passes.open_fetch(ahead)
    in_flight(window, [row(5, key="k")])  # the batch before it goes in flight now
    fetched = passes.fetched(ahead, [row(6, key="k", earlier=5)], mark=mark, left_out=left_out)
    assert 5 not in fetched.left_out
    assert seqs(accept(passes, fetched).rows) == [6]


def test_an_earlier_row_recorded_while_the_fetch_ran_is_no_late_commit() -> None:
    """In flight when the statement started, recorded (deleted) by the time its rows come
    back: the statement still saw it pending."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    in_flight(window, [row(2, key="k")])
    fetched = fetch(passes, [row(3, key="k", earlier=2)], now=0.1)
    window.release([row(2, key="k")], [])
    assert seqs(accept(passes, fetched).rows) == [3]


def _full_pass_plan(passes: Passes) -> FetchPlan:
    """A full pass asked for (a poll) and planned: its first fetch, from the beginning."""
    news = News(True)
    passes.next(0.2, sorted(LANES), news, producer_broken=False, holds_resolved=True)
    plan = passes.plan(LANES, 0.2)
    assert plan.start == 0
    return plan


def test_a_pass_names_the_rows_in_flight_it_may_meet_up_to_its_limit() -> None:
    """What the statement brings without content: the rows in flight above the fetch's
    start, at most as many as it reads."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    for batch in ([3, 4, 6], [8, 9]):
        accept(passes, fetch(passes, rows(*batch), now=0.1))
        in_flight(window, rows(*batch))
    plan = _full_pass_plan(passes)
    assert plan.limit == 3
    left_out, mark = passes.open_fetch(plan)
    assert passes.met_in_flight(plan, left_out) == [3, 4, 6]
    mark.close()


def test_a_fetch_from_above_the_rows_in_flight_names_none() -> None:
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    accept(passes, fetch(passes, rows(3, 4), now=0.1))
    in_flight(window, rows(3, 4))
    plan = passes.plan(LANES, 0.2)
    assert plan.kind is FetchKind.CURSOR and plan.start == 4
    left_out, mark = passes.open_fetch(plan)
    assert left_out == frozenset({3, 4})  # left out all the same (a row's earlier one)
    assert passes.met_in_flight(plan, left_out) == []
    mark.close()


def test_a_row_met_in_flight_costs_the_fetch_what_its_stand_in_brings() -> None:
    """The statement brought it without content: the byte count is its id, key, type and
    routing, as the statement counted it, not its stored size."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    big = row(3, key="k")._replace(size=4_000)
    accept(passes, fetch(passes, [big], now=0.1))
    in_flight(window, [big])
    plan = _full_pass_plan(passes)
    left_out, mark = passes.open_fetch(plan)
    met = frozenset(passes.met_in_flight(plan, left_out))
    again = passes.fetched(
        plan, [big._replace(payload=None)], mark=mark, left_out=left_out, met=met
    )
    assert again.rows == []
    stand_in = 36 + len(big.aggregatetype) + len("k") + len(big.type) + len(big.topic or "")
    assert again.transferred_bytes == stand_in


def test_a_pass_s_fetch_does_not_ask_for_earlier_rows() -> None:
    """A pass's later fetches are kept by its bound; the statement is spared the lookup."""
    passes = new_passes()
    first = fetch(passes, rows(1, 2, 3), bound=9)
    assert first.plan.check_below == 0
    accept(passes, first)
    assert fetch(passes, rows(4), now=0.1).plan.check_below == 0


def test_a_notified_seq_below_the_cursor_moves_the_start_within_the_hint_budget() -> None:
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


def test_a_notified_seq_up_to_a_batch_below_the_start_moves_it_past_the_budget() -> None:
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


def test_a_notification_without_seqs_brings_a_full_pass_within_the_hint_budget() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    opened = []
    for n in range(HINTS_PER_POLL + 2):
        passes.cursor = 9
        opened.append(
            fetch(passes, [], now=0.1 + n / 100, hinted=True).plan.kind is FetchKind.OPENS_PASS
        )
    assert opened == [True] * HINTS_PER_POLL + [False, False]


def test_a_notification_above_the_cursor_does_not_move_the_start() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    assert fetch(passes, [], now=0.1, lowest=50).plan.start == 2


def notified(
    *ranges: tuple[int, int],
    full_pass_requested: bool = False,
    full_pass_hinted: bool = False,
    full_passes_until: float = 0.0,
) -> News:
    """The news of notifications naming these seqs (lowest, highest each), and more."""
    return News(
        full_pass_requested,
        full_pass_hinted,
        full_passes_until,
        lowest_notified=min(low for low, _ in ranges),
        notified=ranges,
    )


def test_a_notification_of_rows_a_fetch_has_read_asks_for_no_fetch() -> None:
    """The fetch read the rows before their notifications came: waking for them would
    read nothing, and the quiet after an empty fetch would hold back the next commit."""
    passes = new_passes()
    settle_cursor_fetches(passes)  # read 1, 2
    accept(passes, fetch(passes, rows(4, 5, 7), now=0.1))
    assert not passes.asks_for_fetch(notified((4, 4), (5, 5), (7, 7), (4, 5)))
    assert not passes.asks_for_fetch(notified((1, 2)))
    # the cursor stays, and the next fetch starts from it, not below the seqs notified
    assert passes.plan(LANES, 0.2).start == 7


@pytest.mark.parametrize(
    ("news", "why"),
    [
        (notified((4, 4), (6, 6)), "a seq no fetch read: a row not read yet, or a late commit"),
        (notified((4, 6)), "a statement's range with a seq no fetch read"),
        (notified((8, 8)), "above what was read"),
        (notified((4, 4), full_pass_hinted=True), "with a hint of a full pass"),
        (notified((4, 4), full_pass_requested=True), "with the relay's own full pass"),
        (notified((4, 4), full_passes_until=5.0), "with failures waiting for retries"),
        (News(lowest_notified=4, notified=None), "more notifications than listed"),
        (News(), "a wake-up with no notification"),
    ],
)
def test_any_other_news_asks_for_a_fetch(news: News, why: str) -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    accept(passes, fetch(passes, rows(4, 5, 7), now=0.1))
    assert passes.asks_for_fetch(news), why


def test_a_notification_below_the_cursor_that_asks_for_a_fetch_moves_its_start() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    accept(passes, fetch(passes, rows(4, 5, 7), now=0.1))
    assert passes.asks_for_fetch(notified((6, 6)))  # 6 committed late, after 7 was read
    assert passes.plan(LANES, 0.2).start == 5


def test_only_the_last_fetches_seqs_are_remembered() -> None:
    passes = new_passes(new_window(4))
    found = [row(seq) for seq in range(10, 10 + READ_REMEMBERED + 1)]
    fetched_at(passes, found, 0.0)
    assert passes.asks_for_fetch(notified((10, 10)))  # forgotten: the oldest
    assert not passes.asks_for_fetch(notified((11, 11)))
    last = 10 + READ_REMEMBERED
    assert passes.asks_for_fetch(notified((1, last)))  # a range wider than remembered


def test_a_full_pass_s_fetch_sends_every_row_it_reads() -> None:
    """After a restart the backlog's rows were never notified: a full pass sends them."""
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1, 2, 3), bound=3))
    assert seqs(accepted.rows) == [1, 2, 3]


def test_a_cursor_that_went_back_for_a_late_commit_returns_to_where_it_was() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, rows(1, 2, 3), bound=20))
    accept(passes, fetch(passes, rows(8, 9), now=0.1))  # not full: cursor 9
    assert passes.cursor == 9
    fetched = fetch(passes, rows(5), now=0.2, lowest=5)  # below the late seq 5
    accepted = accept(passes, fetched)
    assert seqs(accepted.rows) == [5]
    assert passes.cursor == 9


# -- the pass's bound -----------------------------------------------------------------------------
def test_a_pass_s_later_fetch_that_meets_its_bound_ends_the_pass() -> None:
    """A row the pass's first fetch stepped over (not yet committed) lies behind the
    cursor; its key's next row took a seq above the bound: the pass must not send it."""
    passes = new_passes()
    first = accept(passes, fetch(passes, rows(1, 2, 3), bound=4))
    assert first is not None and first.more_now
    accepted = accept(passes, fetch(passes, rows(4, 5, 6), now=0.1))
    assert seqs(accepted.rows) == [4]
    assert accepted.cut and accepted.more_now  # the next pass starts from the beginning at once
    assert passes.prefetch(0.1, accepted, [0, 1], producer_broken=False, slot_free=True) is None
    assert fetch(passes, [], now=0.2).plan.kind is FetchKind.OPENS_PASS


def test_a_cut_short_fetch_still_lets_the_next_pass_follow_at_once() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, rows(1, 2, 3), bound=4))
    accepted = accept(passes, fetch(passes, rows(4, 5), now=0.1))  # not full, but cut
    assert accepted.cut and accepted.more_now


def test_only_the_pass_s_first_fetch_sets_its_bound() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, rows(1, 2, 3), bound=3))
    accepted = accept(passes, fetch(passes, rows(4, 5, 6), now=0.1, bound=99))
    assert accepted.cut and seqs(accepted.rows) == []


def test_the_bound_is_read_ahead_once_half_a_poll_interval_into_the_pass() -> None:
    passes = new_passes()
    settle_cursor_fetches(passes)
    assert not passes.take_bound_refresh(POLL_MS / 2000 - 0.01)
    assert passes.take_bound_refresh(POLL_MS / 2000)
    assert not passes.take_bound_refresh(POLL_MS / 2000 + 0.1)  # already being read
    passes.bound_read(42)
    assert not passes.take_bound_refresh(POLL_MS / 2000 + 0.2)  # one is waiting
    assert passes.take_spare_bound() == 42
    assert passes.take_spare_bound() is None
    assert passes.take_bound_refresh(POLL_MS / 2000 + 0.3)
    passes.bound_read(None)  # the read failed: the next pass reads its own
    assert passes.take_spare_bound() is None


# -- rows in flight and held keys -----------------------------------------------------------------
def test_a_fetch_that_goes_back_leaves_out_the_rows_in_flight() -> None:
    window = new_window(4)
    passes = new_passes(window)
    accept(passes, fetch(passes, rows(1, 2, 3), bound=20))
    in_flight(window, rows(1, 2, 3))  # sent, not recorded yet
    ahead = fetch(passes, rows(4, 5), now=0.1)
    assert ahead.plan.start == 3 and seqs(ahead.rows) == [4, 5]  # nothing in flight past 3
    accept(passes, ahead)
    again = fetch(passes, rows(2, 3, 6), now=POLL_MS / 1000)  # a new pass meets them
    assert again.plan.start == 0
    assert seqs(again.rows) == [6]
    assert again.last_seq == 6 and again.limit_reached  # the statement's rows, not the ones kept


def test_a_row_held_behind_a_retry_published_within_the_pass_is_not_sent() -> None:
    """The pass's first fetch reads the key's row waiting for its retry (the database
    holds the key's next row back, so the cursor passes it). Once that row is published
    and released in the same pass, a later fetch of the pass would read the key's rows
    after the cursor: they wait for the next pass, which reads the stepped-over row first."""
    window = new_window(4)
    passes = new_passes(window)
    retried = row(1, key="k", holds_key=True)
    first = fetch(passes, [retried, row(3, key="other"), row(4, key="other2")], bound=9)
    accepted = accept(passes, first)
    assert accepted.more_now
    # The next fetch is read ahead while this one is sent; its statement is slow.
    ahead = prefetch(passes, accepted)
    left_out, prefetch_mark = passes.open_fetch(ahead)
    sent = passes.sendable(accepted.rows, LANES, first.mark)
    first.mark.close()
    assert seqs(sent) == [1, 3, 4]
    in_flight(window, sent)
    window.release(sent, [])  # published and recorded: the database's hold lifts
    later = passes.fetched(
        ahead, [row(5, key="k"), row(6, key="other")], mark=prefetch_mark, left_out=left_out
    )
    accepted = accept(passes, later)
    assert seqs(passes.sendable(accepted.rows, LANES, later.mark)) == [6]
    later.mark.close()
    # And a fetch planned after the release starts the next pass from the beginning.
    assert fetch(passes, [], now=0.1).plan.start == 0


def test_a_key_released_since_the_pass_began_waits_for_the_next_pass() -> None:
    """The pass's fetches follow each other as prefetches (no new plan in between). A key
    released after the pass began may have rows the pass stepped over: a fetch that starts
    after the release still leaves the key out."""
    window = new_window(4)
    passes = new_passes(window)
    window.hold(failed("k"))
    first = fetch(passes, rows(1, 2, 3), bound=99)
    accepted = accept(passes, first)
    assert accepted.more_now
    first.mark.close()
    in_flight(window, [row(0, key="k")])
    window.release([row(0, key="k")], failed("k"))  # released after the pass began
    ahead = prefetch(passes, accepted)
    left_out, mark = passes.open_fetch(ahead)
    later = passes.fetched(ahead, [row(4, key="k"), row(5, key="j")], mark=mark, left_out=left_out)
    accepted = accept(passes, later)
    assert seqs(passes.sendable(accepted.rows, LANES, later.mark)) == [5]


def test_a_fetch_whose_snapshot_predates_a_release_does_not_send_that_key() -> None:
    """The failure is recorded while the fetch's statement runs: the statement may still
    see the key free, and the in-memory hold is gone by the time its rows come back."""
    window = new_window(4)
    passes = new_passes(window)
    settle_cursor_fetches(passes)
    window.hold(failed("k"))
    fetched = fetch(passes, [row(3, key="k"), row(4, key="free")], now=0.1)  # snapshot
    in_flight(window, [row(1, key="k")])
    window.release([row(1, key="k")], failed("k"))  # recorded: the hold moves on
    accepted = accept(passes, fetched)
    assert seqs(passes.sendable(accepted.rows, LANES, fetched.mark)) == [4]


def test_a_held_key_s_rows_are_left_out_and_the_others_go() -> None:
    window = new_window(4)
    passes = new_passes(window)
    window.hold(failed("k"))
    fetched = fetch(passes, [row(1, key="k"), row(2, key="j")], bound=9)
    accepted = accept(passes, fetched)
    assert seqs(passes.sendable(accepted.rows, LANES, fetched.mark)) == [2]


def test_while_nothing_is_held_every_row_of_a_held_lane_goes() -> None:
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
def test_the_next_fetch_is_read_ahead_only_while_the_pass_runs_on(
    why: str, now: float, lanes: list[int], broken: bool, slot_free: bool, expected: bool
) -> None:
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1, 2, 3), bound=9))
    assert accepted.more_now
    ahead = passes.prefetch(now, accepted, lanes, producer_broken=broken, slot_free=slot_free)
    assert (ahead is not None) is expected, why


def test_a_short_fetch_is_not_followed_by_a_prefetch() -> None:
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1), bound=9))
    assert not accepted.more_now
    assert passes.prefetch(0.1, accepted, [0, 1], producer_broken=False, slot_free=True) is None


def test_a_prefetch_reads_from_the_cursor_as_the_pass_s_kind_of_fetch() -> None:
    passes = new_passes()
    accepted = accept(passes, fetch(passes, rows(1, 2, 3), bound=9))
    assert prefetch(passes, accepted) == FetchPlan(LANES, 3, BATCH, FetchKind.IN_PASS)


def test_closing_lets_the_pass_s_mark_go() -> None:
    window = new_window(4)
    passes = new_passes(window)
    fetched = fetch(passes, [], bound=0)
    fetched.mark.close()
    window.hold(failed("k"))
    window.release([], failed("k"))  # released while the pass is open: remembered
    assert not window.holds_nothing()
    passes.close()
    window.open_fetch().close()  # any later fetch prunes what nobody needs
    assert window.holds_nothing()


# -- sizes ----------------------------------------------------------------------------------------
def test_a_fetch_cut_by_its_byte_budget_is_full_and_the_next_asks_for_a_whole_batch() -> None:
    """The statement printed nothing past the budget (the sizes were measured at the door),
    so asking for a whole batch again costs nothing it does not return."""
    passes = new_passes()
    big = [row(1, size=600), row(2, size=600)]  # the second crossed the budget: cut there
    fetched = fetch(passes, big, bound=9)
    assert fetched.limit_reached and fetched.transferred_bytes == 1_200
    accept(passes, fetched)
    assert fetch(passes, [row(3, size=600)], now=0.1).plan.limit == BATCH


def test_a_row_too_large_to_fetch_whole_counts_what_it_brings_toward_the_budget() -> None:
    passes = new_passes()
    large = row(1, size=MAX_FETCHED_ROW_BYTES + 1)
    fetched = fetch(passes, [large, row(2, size=10)], bound=9)
    brought = 36 + len(large.aggregatetype) + len(large.aggregateid) + len(large.type)
    assert fetched.transferred_bytes == brought + 10 and not fetched.limit_reached


def test_a_row_stored_before_the_door_and_not_measured_is_not_sent_but_read_again() -> None:
    passes = new_passes()
    fetched = fetch(passes, [row(1, size=None), row(2)], bound=9)
    sent = passes.sendable(accept(passes, fetched).rows, LANES, fetched.mark)
    assert seqs(sent) == [2]
    # the next pass reads it from the beginning
    assert fetch(passes, [], now=0.1).plan.kind is FetchKind.OPENS_PASS


def test_a_row_whose_outcome_cannot_be_recorded_is_never_sent_again() -> None:
    passes = new_passes()
    passes.never_send(2)
    fetched = fetch(passes, rows(1, 2, 3), bound=9)
    sent = passes.sendable(accept(passes, fetched).rows, LANES, fetched.mark)
    assert seqs(sent) == [1, 3]
    assert passes.never_sent == 1
    assert not passes.full_pass_due(0.1, requested=False)  # not a row stepped over


def test_a_pass_that_found_nothing_moves_the_cursor_to_its_bound() -> None:
    """An empty outbox: the fetches after it start at the bound as cursor fetches, rather
    than from the beginning on every wake-up."""
    passes = new_passes()
    accept(passes, fetch(passes, [], bound=41))
    nxt = fetch(passes, [], now=0.1)
    assert (nxt.plan.start, nxt.plan.kind) == (41, FetchKind.CURSOR)


def test_a_pass_whose_bound_is_unknown_keeps_its_cursor() -> None:
    passes = new_passes()
    accept(passes, fetch(passes, [], bound=None))
    assert fetch(passes, [], now=0.1).plan.kind is FetchKind.OPENS_PASS


def test_after_a_fetch_that_read_nothing_the_next_waits_a_little() -> None:
    """A stream of notifications announcing nothing costs a fetch per QUIET_MS at most."""
    passes = new_passes()
    accept(passes, fetched_at(passes, [], started_at=5.0))
    assert passes.quiet_left(5.0) == pytest.approx(QUIET_MS / 1000)
    assert passes.quiet_left(5.0 + QUIET_MS / 1000) == 0.0  # long after: at once


def test_after_a_fetch_that_read_rows_the_next_waits_for_nothing() -> None:
    passes = new_passes()
    accept(passes, fetched_at(passes, rows(1), started_at=5.0))
    assert passes.quiet_left(5.0) == 0.0


def test_a_poll_interval_without_news_brings_the_next_fetch_from_the_beginning() -> None:
    """The safety net: the loop waited a poll interval for news and none came."""
    passes = new_passes()
    settle_cursor_fetches(passes)
    assert fetch(passes, [], now=0.1).plan.kind is FetchKind.CURSOR
    passes.polled()
    assert fetch(passes, [], now=0.2).plan.kind is FetchKind.OPENS_PASS


def test_the_lowest_seq_notified_is_kept_across_decisions_until_a_fetch_is_planned() -> None:
    """Notifications heard while the loop resolved holds count with the later ones: the
    fetch starts below the lowest of all."""
    passes = new_passes()
    settle_cursor_fetches(passes)
    passes.cursor = 9
    held_up = passes.next(0.1, sorted(LANES), News(lowest_notified=7), **_NOT_BROKEN_UNRESOLVED)
    assert held_up == ResolveHolds(LANES)
    assert fetch(passes, [], now=0.2, lowest=8).plan.start == 6
    passes.cursor = 9
    assert fetch(passes, [], now=0.3).plan.start == 9  # taken by the fetch planned


_NOT_BROKEN_UNRESOLVED = {"producer_broken": False, "holds_resolved": False}


def test_a_full_pass_asked_for_while_a_cursor_fetch_is_planned_waits_for_the_next() -> None:
    """News heard as a cursor fetch is planned (the loop waited for a slot) is not answered
    by that fetch: only a fetch from the beginning covers a full pass asked for."""
    passes = new_passes()
    settle_cursor_fetches(passes)
    decided = passes.next(0.1, sorted(LANES), News(), producer_broken=False, holds_resolved=True)
    assert decided == Fetch(LANES)
    plan = passes.plan(LANES, 0.1, News(full_pass_requested=True))
    assert plan.kind is FetchKind.CURSOR
    left_out, mark = passes.open_fetch(plan)
    accept(passes, passes.fetched(plan, [], mark=mark, left_out=left_out))
    assert fetch(passes, [], now=0.2).plan.kind is FetchKind.OPENS_PASS


def test_a_new_pass_takes_a_new_mark_so_a_key_released_in_the_last_one_goes() -> None:
    window = new_window(4)
    passes = new_passes(window)
    first = fetch(passes, rows(1, 2, 3), bound=9)
    accept(passes, first)
    first.mark.close()
    in_flight(window, [row(0, key="k")])
    window.hold(failed("k"))
    window.release([row(0, key="k")], failed("k"))  # released while that pass was open
    later = fetch(passes, [row(4, key="k")], now=POLL_MS / 1000, bound=9)
    assert later.plan.kind is FetchKind.OPENS_PASS
    accepted = accept(passes, later)
    assert seqs(passes.sendable(accepted.rows, LANES, later.mark)) == [4]
