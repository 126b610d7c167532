"""Moments of the relay's work that a test can wait for instead of polling for their effect.

Each signal is off until a test enables it; while off, signalling costs one attribute
check. Once enabled, every value is kept until a test takes it, so a moment that came
before the test began waiting is not missed (and one from before it was enabled is not
kept).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import anyio

if TYPE_CHECKING:
    from relay.outcome import Outcome
    from relay.publisher import Submission

T = TypeVar("T")


class Signal(Generic[T]):
    """One kind of moment: its values queue while the signal is enabled."""

    __slots__ = ("_arrived", "_values")

    def __init__(self) -> None:
        self._values: deque[T] | None = None
        self._arrived: anyio.Event | None = None

    def enable(self) -> None:
        """Keep every value from now on (again enabling keeps what is queued)."""
        if self._values is None:
            self._values = deque()

    def signal(self, value: T) -> None:
        """Say the moment came; nothing happens while the signal is off."""
        if self._values is None:
            return
        self._values.append(value)
        if self._arrived is not None:
            self._arrived.set()

    async def next(self) -> T:
        """The oldest value not taken yet, waiting for one to come."""
        if self._values is None:
            raise RuntimeError("the signal is off: enable it before the moment can come")
        while not self._values:
            self._arrived = anyio.Event()
            await self._arrived.wait()
        return self._values.popleft()


@dataclass(frozen=True)
class RelaySignals:
    """The moments one relay instance signals."""

    # After every lane round: how many lanes the instance holds.
    lanes_owned: Signal[int] = field(default_factory=Signal)
    # A batch was handed to the producer: the keys of its rows that failed before they were
    # sent are held back in memory from now on.
    sent: Signal[Submission] = field(default_factory=Signal)
    # A batch was concluded: its outcome recorded (or given up on, when the lease ended
    # first) and its rows and their keys let go.
    recorded: Signal[Outcome] = field(default_factory=Signal)
