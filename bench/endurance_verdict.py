"""The endurance run's verdict, from its per-minute figures (pure: tests/unit/test_endurance_verdict.py).

Only steady minutes are judged: a minute in which the relay was stopped for a backlog
burst, or was catching up after one, is left out (it overlaps the span from the stop to
the moment the relay was back within a tenth of a second's events of the writers).

- **the rate held**: the writers' median rate over the steady minutes is at least
  ``RATE_HELD`` of the target (else the run did not measure the load it names);
- **p99 stays flat**: the median of the per-minute p99s of the last ``WINDOW`` steady
  minutes is at most ``P99_BOUND`` times that of the first ``WINDOW``;
- **sizes stay bounded**: each table's total size (heap, TOAST and indexes) in every steady
  minute from the reference minute on is at most ``SIZE_BOUND`` times its size in the
  reference minute: the first steady minute after the first burst's catch-up (the
  largest backlog the run makes) and after the receipts' retention filled up;
- **no trend**: neither the steady p99 series nor a table's size from the reference minute
  on rises with time. A series rises when the Mann-Kendall test finds an increasing trend
  at ``TREND_ALPHA`` (one-sided, normal approximation with the tie correction) *and* its
  Theil-Sen slope over the series' span adds at least ``TREND_RISE`` of its median: a
  trend both significant and big enough to matter.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

WINDOW = 10  # minutes at each end that the p99 check compares
P99_BOUND = 1.5
SIZE_BOUND = 1.25
RATE_HELD = 0.98
TREND_ALPHA = 0.05
TREND_RISE = 0.10
MIN_TREND_POINTS = 8  # fewer and no trend test can say anything


@dataclass(frozen=True)
class MinuteFigures:
    """What the verdict reads of one minute (minute ``index`` spans 60·index..60·index+60 s
    of the run): its p99 (ms, events committed in it), the writers' rate, each table's
    total size in bytes at its end."""

    index: int
    p99: float | None
    writer_rate: float
    sizes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    """One condition of the verdict and what it found."""

    name: str
    passed: bool
    text: str


@dataclass(frozen=True)
class Verdict:
    """Every check; the run passes when all do."""

    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        """True when every check passed."""
        return all(check.passed for check in self.checks)

    @property
    def line(self) -> str:
        """The one-line verdict: PASS or FAIL, then what each check found (failures first)."""
        ordered = sorted(self.checks, key=lambda check: check.passed)
        return f"{'PASS' if self.passed else 'FAIL'}: " + "; ".join(
            f"{check.name} {check.text}" for check in ordered
        )


def steady_minutes(count: int, excluded: Sequence[tuple[float, float | None]]) -> list[int]:
    """The minutes 0..count-1 that overlap none of the ``excluded`` spans (seconds from the
    run's start; an open end, None, runs to the end of the run)."""
    steady = []
    for minute in range(count):
        start, end = 60.0 * minute, 60.0 * (minute + 1)
        if all(not (a < end and (b is None or b > start)) for a, b in excluded):
            steady.append(minute)
    return steady


def mann_kendall(values: Sequence[float]) -> tuple[int, float, float]:
    """The Mann-Kendall statistic S of a series, its z score, and the one-sided p-value of
    an increasing trend (normal approximation, variance corrected for ties)."""
    n = len(values)
    s = sum(
        (values[j] > values[i]) - (values[j] < values[i])
        for i in range(n - 1)
        for j in range(i + 1, n)
    )
    ties: dict[float, int] = {}
    for value in values:
        ties[value] = ties.get(value, 0) + 1
    variance = (
        n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in ties.values())
    ) / 18
    if variance <= 0:
        return s, 0.0, 0.5
    z = (s - 1) / math.sqrt(variance) if s > 0 else (s + 1) / math.sqrt(variance) if s < 0 else 0
    p_increasing = 0.5 * math.erfc(z / math.sqrt(2))
    return s, z, p_increasing


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The median of the slopes between every two points of different x."""
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs) - 1)
        for j in range(i + 1, len(xs))
        if xs[j] != xs[i]
    ]
    return statistics.median(slopes) if slopes else 0.0


@dataclass(frozen=True)
class Trend:
    """What the trend test found for one series."""

    points: int
    p_increasing: float
    rise: float  # Theil-Sen slope x span, in the series' unit
    median: float

    @property
    def rising(self) -> bool:
        """Significant and big enough to matter."""
        return self.p_increasing < TREND_ALPHA and self.rise >= TREND_RISE * self.median

    @property
    def text(self) -> str:
        """The figures, one phrase."""
        share = self.rise / self.median if self.median else 0.0
        return (
            f"(Mann-Kendall p={self.p_increasing:.3f} over {self.points} minutes, "
            f"Theil-Sen rise {share:+.0%} of the median)"
        )


def trend(points: Sequence[tuple[int, float]]) -> Trend:
    """The trend test over (minute, value) points."""
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    _, _, p = mann_kendall(ys)
    slope = theil_sen(xs, ys)
    return Trend(len(points), p, slope * (xs[-1] - xs[0]), statistics.median(ys))


def reference_minute(steady: Sequence[int], *, after_s: float) -> int | None:
    """The first steady minute that starts at or after ``after_s``."""
    return next((m for m in steady if 60 * m >= after_s), None)


def judge(
    minutes: Sequence[MinuteFigures],
    excluded: Sequence[tuple[float, float | None]],
    *,
    rate: float,
    settle_s: float,
) -> Verdict:
    """The verdict over the steady minutes. ``excluded``: each burst's span, from the stop to
    the catch-up's end, in seconds from the run's start, in order. ``settle_s``: when the
    receipts' retention has filled up (retention plus a prune interval)."""
    by_index = {m.index: m for m in minutes}
    steady = [m for m in steady_minutes(max(by_index, default=-1) + 1, excluded) if m in by_index]
    checks = [_rate_held(steady, by_index, rate)]
    judged = [m for m in steady if by_index[m].p99 is not None]
    checks.append(_p99_flat(judged, by_index))
    p99_points = [(m, float(by_index[m].p99 or 0.0)) for m in judged]
    checks.append(_no_trend("p99 trend", p99_points, "ms"))
    after_s = max(settle_s, excluded[0][1] or math.inf) if excluded else settle_s
    reference = reference_minute(steady, after_s=after_s)
    tables = sorted({name for m in minutes for name in m.sizes})
    for table in tables:
        checks += _size_checks(table, steady, by_index, reference)
    return Verdict(tuple(checks))


def _rate_held(steady: Sequence[int], by_index: Mapping[int, MinuteFigures], rate: float) -> Check:
    if not steady:
        return Check("rate", False, "no steady minute")
    reached = statistics.median(by_index[m].writer_rate for m in steady)
    return Check(
        "rate",
        reached >= RATE_HELD * rate,
        f"held: writers' median {reached:.0f}/s of {rate:.0f}/s (bound ≥ {RATE_HELD:.0%})",
    )


def _p99_flat(judged: Sequence[int], by_index: Mapping[int, MinuteFigures]) -> Check:
    if len(judged) < 2 * WINDOW:
        return Check("p99", False, f"not judged: {len(judged)} steady minutes, {2 * WINDOW} needed")
    first = statistics.median(float(by_index[m].p99 or 0.0) for m in judged[:WINDOW])
    last = statistics.median(float(by_index[m].p99 or 0.0) for m in judged[-WINDOW:])
    ratio = last / first if first > 0 else math.inf
    return Check(
        "p99",
        ratio <= P99_BOUND,
        f"last {WINDOW} / first {WINDOW} steady minutes {last:.1f} / {first:.1f} ms = "
        f"{ratio:.2f} (bound ≤ {P99_BOUND})",
    )


def _no_trend(name: str, points: Sequence[tuple[int, float]], unit: str) -> Check:
    if len(points) < MIN_TREND_POINTS:
        return Check(name, False, f"not judged: {len(points)} minutes, {MIN_TREND_POINTS} needed")
    found = trend(points)
    return Check(name, not found.rising, f"{'rising' if found.rising else 'none'} {found.text}")


def _size_checks(
    table: str,
    steady: Sequence[int],
    by_index: Mapping[int, MinuteFigures],
    reference: int | None,
) -> list[Check]:
    if reference is None or table not in by_index[reference].sizes:
        return [Check(f"{table} size", False, "not judged: no reference minute")]
    base = by_index[reference].sizes[table]
    points = [(m, float(by_index[m].sizes[table])) for m in steady if m >= reference]
    largest = max(value for _, value in points)
    ratio = largest / base if base else math.inf
    bound = Check(
        f"{table} size",
        ratio <= SIZE_BOUND,
        f"largest {largest / 2**20:.1f} MB = {ratio:.2f} x minute {reference}'s "
        f"(bound ≤ {SIZE_BOUND})",
    )
    return [bound, _no_trend(f"{table} size trend", points, "bytes")]
