"""relay/signals.py: moments a test waits for, off until a test enables them."""

from __future__ import annotations

import anyio
import pytest

from relay.signals import RelaySignals, Signal


async def test_a_signal_that_is_off_keeps_nothing_and_cannot_be_waited_for() -> None:
    signal: Signal[int] = Signal()
    signal.signal(1)
    with pytest.raises(RuntimeError, match="enable it"):
        await signal.next()
    signal.enable()
    signal.signal(2)
    assert await signal.next() == 2  # the value from before it was enabled was not kept


async def test_values_are_kept_in_order_until_taken() -> None:
    signal: Signal[str] = Signal()
    signal.enable()
    for value in ("a", "b", "c"):
        signal.signal(value)
    signal.enable()  # enabling again keeps what is queued
    assert [await signal.next() for _ in range(3)] == ["a", "b", "c"]


async def test_a_waiting_test_wakes_when_the_moment_comes() -> None:
    signal: Signal[int] = Signal()
    signal.enable()
    taken: list[int] = []

    async def wait() -> None:
        taken.append(await signal.next())

    async with anyio.create_task_group() as group:
        group.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert taken == []
        signal.signal(7)
    assert taken == [7]


def test_every_relay_has_its_own_signals_all_off() -> None:
    one, other = RelaySignals(), RelaySignals()
    one.lanes_owned.enable()
    one.lanes_owned.signal(64)
    other.lanes_owned.signal(64)
    assert one.lanes_owned is not other.lanes_owned
    assert one.sent is not other.sent and one.recorded is not other.recorded
    with pytest.raises(RuntimeError):
        anyio.run(other.lanes_owned.next)
