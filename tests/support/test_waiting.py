"""tests/support/waiting.py: a wait returns what it waited for, or fails naming it."""

from __future__ import annotations

import threading

import anyio
import pytest

from relay.signals import Signal
from tests.support.waiting import (
    described,
    wait_for_signal,
    wait_until,
    wait_until_blocking,
)


async def test_a_wait_returns_the_predicate_s_first_truthy_answer() -> None:
    answers = iter([0, None, [], 3])
    assert await wait_until(lambda: next(answers), what="an answer", interval=0) == 3


async def test_an_async_predicate_is_awaited() -> None:
    calls = 0

    async def third_call() -> bool:
        nonlocal calls
        calls += 1
        return calls == 3

    assert await wait_until(third_call, what="the third call", interval=0) is True


async def test_a_wait_that_runs_out_names_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"^not within 0\.1 s: every lane held$"):
        await wait_until(lambda: False, what="every lane held", timeout=0.1)


async def test_a_predicate_that_hangs_runs_out_too() -> None:
    async def hangs() -> bool:
        await anyio.sleep_forever()
        return True  # pragma: no cover

    with anyio.fail_after(5), pytest.raises(AssertionError, match="the answer that never came"):
        await wait_until(hangs, what="the answer that never came", timeout=0.1)


async def test_a_wait_without_what_is_named_by_its_predicate() -> None:
    def drained() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"not within 0\.05 s: .*drained$"):
        await wait_until(drained, timeout=0.05)
    with pytest.raises(AssertionError, match=r"not within 0\.05 s: lambda: len\(\[1, 2\]\) == 3$"):
        await wait_until(lambda: len([1, 2]) == 3, timeout=0.05)


def test_a_lambda_is_named_by_its_own_text_only() -> None:
    assert described(lambda: max(1, 2) > 3) == "lambda: max(1, 2) > 3"
    predicates = [lambda: "first", lambda: "second"]  # two on one line: the first is named
    assert described(predicates[0]) == 'lambda: "first"'


def test_the_blocking_wait_for_code_outside_an_event_loop() -> None:
    ready = threading.Event()
    threading.Timer(0.05, ready.set).start()
    assert wait_until_blocking(ready.is_set, what="the timer", timeout=5) is True
    with pytest.raises(AssertionError, match=r"^not within 0\.05 s: never$"):
        wait_until_blocking(lambda: None, what="never", timeout=0.05)


async def test_a_signal_wait_skips_the_values_it_does_not_want() -> None:
    owned: Signal[int] = Signal()
    owned.enable()
    for value in (10, 40, 64, 64):
        owned.signal(value)
    assert await wait_for_signal(owned, where=lambda n: n == 64, what="every lane") == 64
    assert await owned.next() == 64  # what came after it is still there


async def test_a_signal_wait_that_runs_out_names_what_it_waited_for() -> None:
    owned: Signal[int] = Signal()
    owned.enable()
    owned.signal(3)
    with pytest.raises(AssertionError, match=r"^not within 0\.1 s: every lane held$"):
        await wait_for_signal(owned, where=lambda n: n == 64, what="every lane held", timeout=0.1)
