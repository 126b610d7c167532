"""The in-flight window: slots, rows in flight, held keys, waiting for it to empty. No services."""

from __future__ import annotations

import anyio
import pytest

from relay.inflight import InFlightWindow
from relay.records import OutboxRow, RecordMapper
from tests.support.rows import make_row

# Rows of aggregatetype "order" go to "t.order": a failed one holds its key there.
_HOLD_OF = RecordMapper(topic_template="t.{aggregatetype}", ce_source="urn:t").hold_of


def new_window(capacity: int) -> InFlightWindow:
    return InFlightWindow(capacity, hold_of=_HOLD_OF)


def row(seq: int, lane: int = 0, key: str = "k", aggregatetype: str = "order") -> OutboxRow:
    return make_row(seq=seq, lane=lane, aggregateid=key, aggregatetype=aggregatetype)


def keyed(key: str) -> OutboxRow:
    """A row of ``key`` on the topic every row of these tests goes to."""
    return row(0, key=key)


def is_held(window: InFlightWindow, row: OutboxRow) -> bool:
    """The row's key is held on its topic now."""
    hold = window.hold_of(row)
    return hold is not None and hold in window.held()


def failed(*keys: str) -> list[OutboxRow]:
    """One failed row per key given."""
    return [keyed(key) for key in keys]


async def test_a_new_window_is_empty_with_every_slot_free() -> None:
    window = new_window(2)
    assert window.empty()
    assert window.lanes() == set()
    assert window.slot_free()
    await window.wait_empty()  # returns at once


async def test_slots_run_out_at_capacity_and_come_back_on_release_or_give_back() -> None:
    window = new_window(2)
    with await window.take_slot():
        assert window.slot_free()
        fetched_nothing = await window.take_slot()
        assert not window.slot_free()
        assert window.try_take_slot() is None
        fetched_nothing.give_back()  # a batch that fetched nothing
        fetched_nothing.give_back()  # once only
        assert window.slot_free()
    assert window.slot_free()  # the first one came back at the end of its block
    taken = window.try_take_slot()
    assert taken is not None and window.try_take_slot() is not None
    assert not window.slot_free()
    with taken:
        window.admit([row(1)], taken)
    assert not window.slot_free()  # its batch took it: the block's end gave nothing back
    window.release([row(1)], [])
    assert window.slot_free()


async def test_admitted_rows_keep_their_lanes_until_their_batch_is_released() -> None:
    window = new_window(2)
    first, second = [row(1, lane=3), row(2, lane=5)], [row(3, lane=5)]
    for batch in (first, second):
        window.admit(batch, await window.take_slot())
    assert window.lanes() == {3, 5}
    window.release(first, [])
    assert not window.empty()
    assert window.lanes() == {5}
    window.release(second, [])
    assert window.empty()


async def test_a_key_stays_held_until_each_of_its_failures_is_released() -> None:
    window = new_window(2)
    window.hold(failed("a", "a", "b"))
    assert is_held(window, keyed("a")) and is_held(window, keyed("b"))
    assert not is_held(window, keyed("c"))
    await window.take_slot()
    window.release([], failed("a", "b"))
    assert is_held(window, keyed("a"))
    assert not is_held(window, keyed("b"))
    await window.take_slot()
    window.release([], failed("a"))
    assert not is_held(window, keyed("a"))


async def test_wait_empty_returns_when_the_last_batch_is_released() -> None:
    window = new_window(2)
    first, second = [row(1)], [row(2)]
    for batch in (first, second):
        window.admit(batch, await window.take_slot())
    returned = anyio.Event()

    async def waiter() -> None:
        await window.wait_empty()
        returned.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            window.release(first, [])
            await anyio.wait_all_tasks_blocked()
            assert not returned.is_set()  # one batch still in flight
            window.release(second, [])
    assert returned.is_set()


async def test_wait_empty_waits_again_after_the_window_refilled() -> None:
    window = new_window(1)
    window.admit([row(1)], await window.take_slot())
    window.release([row(1)], [])  # emptied once
    window.admit([row(2)], await window.take_slot())
    with pytest.raises(TimeoutError), anyio.fail_after(0.05):
        await window.wait_empty()


async def test_seqs_and_held_keys_show_what_is_in_flight_now() -> None:
    window = new_window(2)
    window.admit([row(3, key="a"), row(5, key="b")], await window.take_slot())
    window.hold(failed("a"))
    seqs, held = window.seqs(), window.held()
    assert seqs == {3, 5}
    assert ("t.order", "a") in held and ("t.order", "b") not in held
    window.release([row(3, key="a"), row(5, key="b")], failed("a"))
    assert window.seqs() == frozenset()
    assert seqs == {3, 5}  # a snapshot: a fetch keeps leaving out what was in flight
    assert ("t.order", "a") not in held  # a live view: a submission sees holds as they are


# -- keys released while a fetch was open --------------------------------------------------
async def held_then_released(window: InFlightWindow, key: str) -> None:
    window.admit([row(1, key=key)], await window.take_slot())
    window.hold(failed(key))
    window.release([row(1, key=key)], failed(key))


async def test_a_key_released_while_a_fetch_is_open_stays_held_from_its_rows() -> None:
    window = new_window(2)
    mark = window.open_fetch()
    await held_then_released(window, "k")
    assert not is_held(window, keyed("k"))
    assert window.held_since(keyed("k"), mark.at)
    assert not window.held_since(keyed("other"), mark.at)
    mark.close()
    later = window.open_fetch()  # a fetch after the release: the database holds the key
    assert not window.held_since(keyed("k"), later.at)


async def test_a_key_released_before_a_fetch_started_is_free_for_it() -> None:
    window = new_window(2)
    earlier = window.open_fetch()
    await held_then_released(window, "k")
    mark = window.open_fetch()
    assert window.held_since(keyed("k"), earlier.at)
    assert not window.held_since(keyed("k"), mark.at)


async def test_releases_are_forgotten_once_no_fetch_that_needs_them_is_open() -> None:
    window = new_window(2)
    first = window.open_fetch()
    await held_then_released(window, "k")
    second = window.open_fetch()
    second.close()
    assert window.held_since(keyed("k"), first.at)  # the first fetch is still open
    first.close()
    assert window._released_at == {}


async def test_a_release_with_no_fetch_open_is_not_remembered() -> None:
    window = new_window(2)
    await held_then_released(window, "k")
    assert window._released_at == {}


async def test_a_retried_row_recorded_mid_pass_keeps_its_key_out_of_that_pass() -> None:
    # The database held the key behind the retried row; the pass stepped over those rows.
    window = new_window(2)
    pass_mark = window.open_fetch()
    slot = await window.take_slot()
    retried = make_row(seq=1, aggregateid="k", aggregatetype="order", holds_key=True)
    window.admit([retried, row(2, key="other")], slot)
    fetch = window.open_fetch()
    fetch.close()
    window.release([retried, row(2, key="other")], [])
    assert window.held_since(keyed("k"), pass_mark.at)  # the rest of this pass leaves "k" alone
    assert not window.held_since(keyed("other"), pass_mark.at)  # an ordinary row lifts no hold
    pass_mark.close()
    assert not window.held_since(
        keyed("k"), window.open_fetch().at
    )  # the next pass reads it in order


async def test_a_retried_row_still_in_flight_releases_its_key_only_with_its_last_copy() -> None:
    window = new_window(2)
    pass_mark = window.open_fetch()
    first, second = (
        make_row(seq=s, aggregateid="k", aggregatetype="order", holds_key=True) for s in (1, 2)
    )
    window.admit([first], await window.take_slot())
    window.admit([second], await window.take_slot())
    window.release([first], [])
    assert not window.held_since(keyed("k"), pass_mark.at)
    window.release([second], [])
    assert window.held_since(keyed("k"), pass_mark.at)


async def test_holds_nothing_only_while_no_key_could_be_held_since_any_open_fetch() -> None:
    window = new_window(2)
    assert window.holds_nothing()
    mark = window.open_fetch()  # a fetch is open while the key is held and released
    window.hold(failed("a"))
    assert not window.holds_nothing()
    await window.take_slot()
    window.release([], failed("a"))
    # released after that fetch began: its rows of "a" are still held back
    assert window.held_since(keyed("a"), mark.at)
    assert not window.holds_nothing()
    mark.close()
    assert window.holds_nothing()
    assert not window.held_since(keyed("a"), window.open_fetch().at)


async def test_a_key_is_held_on_its_topic_only_and_a_row_that_can_go_nowhere_holds_nothing() -> (
    None
):
    """The in-memory hold is the database's: the key on the failed row's topic."""
    window = new_window(2)
    window.hold([row(1, key="k", aggregatetype="order"), row(2, key="j", aggregatetype="x y")])
    assert is_held(window, row(3, key="k", aggregatetype="order"))
    assert not is_held(window, row(4, key="k", aggregatetype="customer"))
    assert not is_held(window, row(5, key="j", aggregatetype="x y"))  # "t.x y": no topic
    assert window.held() == {("t.order", "k")}


def test_a_window_and_its_handles_need_no_event_loop_until_something_waits() -> None:
    """The fetch loop's decisions are tested without one (tests/unit/test_passes.py)."""
    window = new_window(1)
    slot = window.try_take_slot()
    assert slot is not None
    with window.open_fetch() as mark:
        window.admit([row(1, key="k")], slot)
        window.hold(failed("k"))
        window.release([row(1, key="k")], failed("k"))
        assert window.held_since(keyed("k"), mark.at)  # released while it was open
    assert window.holds_nothing()  # closed at the end of its block: nothing remembered
    assert window.empty() and window.slot_free()


async def test_a_slot_that_is_waited_for_comes_when_a_batch_is_released() -> None:
    window = new_window(1)
    window.admit([row(1)], await window.take_slot())
    got: list[object] = []

    async def taker() -> None:
        got.append(await window.take_slot())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(taker)
            await anyio.wait_all_tasks_blocked()
            assert got == []  # waiting: the one slot is in flight
            window.release([row(1)], [])
    assert len(got) == 1 and not window.slot_free()


async def test_a_mark_closed_twice_counts_once() -> None:
    window = new_window(2)
    first, second = window.open_fetch(), window.open_fetch()
    await held_then_released(window, "k")
    first.close()
    first.close()
    assert window.held_since(keyed("k"), second.at)  # the second fetch is still open
