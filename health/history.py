"""The last minutes of evaluations, in memory, for the status page's chart.

Aggregates only: per family and evaluation its classification, its backlog count and its
oldest age (the measurements a family marks as its trend). Bounded twice over: points
older than the window are dropped, and each family's ring holds at most as many points
as the window has evaluations, so a fast or stuck clock cannot grow it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from contracts.health import Classification, HealthReport
from contracts.policy import Family
from health.families import REGISTRY

WINDOW_MS = 15 * 60_000
"""How far back the status page's chart looks."""


@dataclass(frozen=True)
class Point:
    """One evaluation of one family, as the chart draws it."""

    at_unix_ms: int
    classification: Classification
    backlog: int | None
    """The family's backlog count; None when it has none or the probe failed."""
    oldest_ms: int | None
    """The age of the family's oldest waiting item; None when nothing waits or it has none."""


class History:
    """A bounded ring of :class:`Point` per family over the last ``window_ms``."""

    def __init__(self, *, interval_ms: int, window_ms: int = WINDOW_MS) -> None:
        if interval_ms <= 0 or window_ms <= 0:
            raise ValueError("the history needs a positive interval and window")
        self.window_ms = window_ms
        self._capacity = window_ms // interval_ms + 1
        self._points: dict[Family, deque[Point]] = {}

    def record(self, report: HealthReport) -> None:
        """Add one evaluation, dropping what fell out of the window."""
        at = report.evaluated_at_unix_ms
        for result in report.families:
            backlog = oldest = None
            if result.evidence is not None:
                for m in REGISTRY[result.family].measure(result.evidence):
                    if m.trend == "backlog":
                        backlog = m.value
                    elif m.trend == "oldest":
                        oldest = m.value
            ring = self._points.setdefault(result.family, deque(maxlen=self._capacity))
            ring.append(Point(at, result.classification, backlog, oldest))
        for ring in self._points.values():
            while ring and ring[0].at_unix_ms < at - self.window_ms:
                ring.popleft()

    def points(self, family: Family) -> tuple[Point, ...]:
        """The family's points, oldest first."""
        return tuple(self._points.get(family, ()))
