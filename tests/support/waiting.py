"""Waiting in tests: for a condition to hold, or for a moment the relay signals.

Every wait has a limit and names what it waits for, so a test that fails on one says what
did not happen: ``not within 30 s: every event published`` (a wait given no ``what`` is
named by its predicate). Where the relay signals the moment itself (relay/signals.py),
:func:`wait_for_signal` waits for it instead of polling for its effect.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import anyio

if TYPE_CHECKING:
    from relay.signals import Signal


T = TypeVar("T")

INTERVAL_S = 0.05


def _not_within(timeout: float, what: str) -> AssertionError:
    return AssertionError(f"not within {timeout:g} s: {what}")


def described(predicate: Callable[..., object]) -> str:
    """What a wait given no ``what`` waited for: the predicate's name, or a lambda's own
    text (``lambda: _drained(db)``)."""
    name = getattr(predicate, "__qualname__", "")
    if name and "<lambda>" not in name:
        return name
    try:
        source = " ".join(inspect.getsource(predicate).split())
    except (OSError, TypeError):
        return repr(predicate)
    start = source.find("lambda")
    if start < 0:
        return source
    depth = 0
    for end in range(start, len(source)):
        char = source[end]
        if char in "([{":
            depth += 1
        elif char in ")]}" and depth > 0:
            depth -= 1
        elif char in ",)" and depth == 0:
            return source[start:end]
    return source[start:]


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    *,
    what: str | None = None,
    timeout: float = 30.0,
    interval: float = INTERVAL_S,
) -> T:
    """Poll ``predicate`` (plain or async) until it returns something truthy, and return
    that; fail naming ``what`` (else the predicate) after ``timeout`` seconds, also when a
    call hangs."""
    with anyio.move_on_after(timeout):
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result
            await anyio.sleep(interval)
    raise _not_within(timeout, what or described(predicate))


def wait_until_blocking(
    predicate: Callable[[], T],
    *,
    what: str | None = None,
    timeout: float = 30.0,
    interval: float = INTERVAL_S,
) -> T:
    """:func:`wait_until` for code outside an event loop (plain tests, a helper's thread)."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise _not_within(timeout, what or described(predicate))
        time.sleep(interval)


def _anything(_value: object) -> bool:
    return True


async def wait_for_signal(
    signal: Signal[T],
    *,
    what: str,
    where: Callable[[T], bool] = _anything,
    timeout: float = 30.0,
) -> T:
    """The next value ``signal`` gives for which ``where`` holds (those before it are
    taken); fail naming ``what`` after ``timeout`` seconds. Enable the signal before the
    moment can happen: a value from before it was enabled is not kept."""
    with anyio.move_on_after(timeout):
        while True:
            value = await signal.next()
            if where(value):
                return value
    raise _not_within(timeout, what)
