"""The last minutes of evaluations, in memory, for the status page's charts.

Aggregates only: per family and evaluation its classification, its backlog count and its
oldest age (the measurements a family marks as its trend), and, where the relay runs in
this process, its published-events counter at each evaluation. Bounded twice over: points
older than the window are dropped, and each ring holds at most as many points as the
window has evaluations, so a fast or stuck clock cannot grow it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from contracts.health import Classification, HealthReport
from contracts.policy import Family
from health.families import measurements

WINDOW_MS = 15 * 60_000
"""How far back the status page's charts look at most."""


@dataclass(frozen=True)
class Point:
    """One evaluation of one family, as the chart draws it."""

    at_unix_ms: int
    classification: Classification
    backlog: int | None
    """The family's backlog count; None when it has none or the probe failed."""
    oldest_ms: int | None
    """The age of the family's oldest waiting item; None when nothing waits or it has none."""


@dataclass(frozen=True)
class Rate:
    """Events published per second between one evaluation and the one before it."""

    at_unix_ms: int
    per_second: float


class History:
    """A bounded ring of :class:`Point` per family, and of published counts, over the last
    ``window_ms``."""

    def __init__(
        self, *, interval_ms: int, window_ms: int = WINDOW_MS, publishing: bool = False
    ) -> None:
        if interval_ms <= 0 or window_ms <= 0:
            raise ValueError("the history needs a positive interval and window")
        self.window_ms = window_ms
        self.publishing = publishing
        """True where the relay runs in this process: each evaluation brings its count."""
        self._capacity = window_ms // interval_ms + 1
        self._points: dict[Family, deque[Point]] = {}
        self._published: deque[tuple[int, int]] = deque(maxlen=self._capacity)

    def record(self, report: HealthReport, *, published: int | None = None) -> None:
        """Add one evaluation, and the relay's published count then (None: no relay runs in
        this process), dropping what fell out of the window."""
        at = report.evaluated_at_unix_ms
        for result in report.families:
            backlog = oldest = None
            for m in measurements(result):
                if m.trend == "backlog":
                    backlog = m.value
                elif m.trend == "oldest":
                    oldest = m.value
            ring = self._points.setdefault(result.family, deque(maxlen=self._capacity))
            ring.append(Point(at, result.classification, backlog, oldest))
        if published is not None:
            self._published.append((at, published))
        horizon = at - self.window_ms
        for ring in self._points.values():
            while ring and ring[0].at_unix_ms < horizon:
                ring.popleft()
        while self._published and self._published[0][0] < horizon:
            self._published.popleft()

    def points(self, family: Family) -> tuple[Point, ...]:
        """The family's points, oldest first."""
        return tuple(self._points.get(family, ()))

    def published(self) -> int | None:
        """The relay's published count at the latest evaluation; None without one."""
        return self._published[-1][1] if self._published else None

    def rates(self) -> tuple[Rate, ...]:
        """Events per second between consecutive evaluations, oldest first. A pair whose
        clock did not move forward, or whose count went down, gives no rate."""
        rates = []
        for (before, count_before), (at, count) in zip(
            self._published, list(self._published)[1:], strict=False
        ):
            if at > before and count >= count_before:
                rates.append(Rate(at, (count - count_before) * 1000 / (at - before)))
        return tuple(rates)

    def since_unix_ms(self) -> int | None:
        """When the oldest evaluation kept was made; None before the first."""
        firsts = [ring[0].at_unix_ms for ring in self._points.values() if ring]
        if self._published:
            firsts.append(self._published[0][0])
        return min(firsts, default=None)
