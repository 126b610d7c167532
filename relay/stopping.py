"""The stop, which ends whatever the relay awaits while it starts (:func:`unless_stopped`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from relay.errors import Stopped

T = TypeVar("T")


async def unless_stopped(stop: anyio.Event, step: Callable[[], Awaitable[T]]) -> T:
    """``step()``'s result, unless ``stop`` is set first: then the step is cancelled, has
    ended, and :class:`Stopped` is raised. The step's own exceptions pass unchanged.

    For the steps of starting that can wait for their own timeout (a connect to a server
    whose path stalls: 10 s for the database, the producer's request timeout and then the
    bootstrap check's 10 s for Kafka): a SIGTERM meanwhile must not wait for them, or the
    process outlives its drain timeout.
    """
    if stop.is_set():
        raise Stopped
    result: list[T] = []
    error: Exception | None = None
    async with anyio.create_task_group() as race:
        race.start_soon(_cancel_when_set, stop, race.cancel_scope)
        try:
            result.append(await step())
        except Exception as exc:  # raised as it is, not inside the task group's group
            error = exc
        race.cancel_scope.cancel()
    if result:
        return result[0]
    if stop.is_set():
        # Cancelled by the stop (a step may turn its cancellation into an error of its own).
        raise Stopped from error
    assert error is not None  # the step neither returned nor was cancelled by the stop
    raise error


async def _cancel_when_set(stop: anyio.Event, scope: anyio.CancelScope) -> None:
    await stop.wait()
    scope.cancel()
