"""Liveness: by when each relay loop must show progress again; /livez reads it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relay.config import RelayConfig


def allowance_s(every_ms: int, *, blocking_ms: int) -> float:
    """Three rounds of a loop, plus what one round may legitimately block for."""
    return (3 * every_ms + blocking_ms) / 1000


def blocking_ms(config: RelayConfig) -> int:
    """The longest a round may block on purpose: every in-flight batch's acknowledgement
    wait (twice the send timeout each) plus one lease."""
    return config.max_in_flight_batches * 2 * config.send_timeout_ms + config.lease_ttl_ms


@dataclass
class Liveness:
    """Each loop's deadline for coming back.

    Each loop names its own cadence, because an idle loop that waits on purpose (for
    work, for its interval) is alive; one that stops coming back is not.
    """

    blocking_ms: int = 0
    clock: Callable[[], float] = time.monotonic
    deadlines: dict[str, float] = field(default_factory=dict)

    @classmethod
    def for_relay(cls, config: RelayConfig) -> Liveness:
        """Deadlines allowing for what the relay's rounds may block on under ``config``."""
        return cls(blocking_ms=blocking_ms(config))

    def tick(self, name: str, every_ms: int) -> None:
        """Loop ``name`` is alive and comes back within ``every_ms`` (plus its allowance)."""
        self.deadlines[name] = self.clock() + allowance_s(every_ms, blocking_ms=self.blocking_ms)

    def stale(self) -> list[str]:
        """The loops past their deadline, by name."""
        now = self.clock()
        return sorted(name for name, deadline in self.deadlines.items() if now > deadline)
