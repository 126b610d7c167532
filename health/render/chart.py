"""The status page's charts: inline SVG, drawn here, over the history's time span."""

from __future__ import annotations

import html
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from contracts.health import Classification
from health.history import WINDOW_MS, History, Point
from health.render.words import duration

# Each line's colour, which the page's legends use too.
BACKLOG, OLDEST, RATE = "#1f5fbf", "#c06000", "#2a7f62"

_MIN_SPAN_MS = 1000
# The chart's own units; the page scales it to its box, which is about as wide in a narrow
# window, so its text stays the size the page's is.
_VIEW_WIDTH = 400
# Room for the value scales' labels, on both sides of every chart, so that the time axes
# of a page's charts line up.
_LEFT_AXIS, _RIGHT_AXIS = 44, 56
_TOP, _PLOT_HEIGHT, _BAND_HEIGHT, _TIME_AXIS = 8, 80, 8, 18
_FONT = 12
_MAX_INTERVALS = 4
"""A value scale has at most this many steps between 0 and its top."""
_TIME_STEPS_MS = tuple(s * 1000 for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900))
_MAX_TIME_TICKS = 5
_DURATION_STEPS_MS = (
    *(10, 20, 50, 100, 200, 500),
    *(s * 1000 for s in (1, 2, 5, 10, 15, 30)),
    *(m * 60_000 for m in (1, 2, 5, 10, 15, 30)),
    *(h * 3_600_000 for h in (1, 2, 3, 6, 12)),
)
_DAY_MS = 86_400_000
_BAND_COLOURS = {
    Classification.WITHIN_BOUNDS: "#5b5",
    Classification.STALLED: "#d33",
    Classification.UNKNOWN: "#e0b000",
}


@dataclass(frozen=True)
class Span:
    """The time every chart on the page covers: from the oldest evaluation kept (at most
    the window back) to the latest."""

    start: int
    end: int

    @property
    def ms(self) -> int:
        return self.end - self.start


def span_of(history: History | None, now: int | None) -> Span:
    if now is None:  # no evaluation yet, so no history to draw either
        return Span(-_MIN_SPAN_MS, 0)
    since = history.since_unix_ms() if history is not None else None
    start = max(now - WINDOW_MS, since if since is not None else now)
    return Span(min(start, now - _MIN_SPAN_MS), now)


@dataclass(frozen=True)
class _Series:
    """One line of a chart and the value scale it is drawn against."""

    name: str
    """The line's class: backlog, oldest or rate."""
    colour: str
    values: Sequence[tuple[int, float | None]]
    steps: Callable[[], Iterator[float]]
    """The candidate steps of its scale, smallest first."""
    tick: Callable[[float], str]
    dash: str = ""

    @property
    def peak(self) -> float | None:
        return max((v for _, v in self.values if v is not None), default=None)


def _one_two_five(lowest_power: int) -> Callable[[], Iterator[float]]:
    def steps() -> Iterator[float]:
        for power in itertools.count(lowest_power):
            for mantissa in (1, 2, 5):
                yield mantissa * 10.0**power

    return steps


def _duration_steps() -> Iterator[float]:
    yield from _DURATION_STEPS_MS
    for days in _one_two_five(0)():
        yield days * _DAY_MS


def _scale(series: _Series, intervals: int | None = None) -> tuple[float, int]:
    """A scale for the series' values: its step and how many steps reach from 0 to past its
    peak; with ``intervals``, exactly that many (so a second scale shares the first's grid)."""
    peak = series.peak or 0.0
    for step in series.steps():
        count = intervals or max(1, math.ceil(peak / step))
        if count <= _MAX_INTERVALS and step * count >= peak:
            return step, count
    raise AssertionError("the steps never end")


def _short_duration(ms: float) -> str:
    for unit, size in (("d", _DAY_MS), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{round(ms / size, 3):g} {unit}"
    return f"{ms:g} ms" if ms else "0"


def _short_count(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e4)):
        if value >= size:
            return f"{round(value / (size if unit == 'M' else 1e3), 3):g}{unit}"
    return f"{round(value, 3):g}"


def family_chart(points: Sequence[Point], span: Span) -> str:
    """A family's history: its backlog (left scale) and oldest age (right scale) over a band
    coloured by each evaluation's classification."""
    if not points:
        return '<p class="legend">no history yet</p>'
    backlog = _Series(
        "backlog",
        BACKLOG,
        [(p.at_unix_ms, p.backlog) for p in points],
        _one_two_five(0),
        _short_count,
    )
    oldest = _Series(
        "oldest",
        OLDEST,
        [(p.at_unix_ms, p.oldest_ms) for p in points],
        _duration_steps,
        _short_duration,
        dash=' stroke-dasharray="4 2"',
    )
    shown = [s for s in (backlog, oldest) if s.peak is not None]
    legend = []
    if backlog.peak is not None:
        legend.append(f'<span class="backlog">&#9472; backlog (peak {backlog.peak:g})</span>')
    if oldest.peak is not None:
        legend.append(
            f'<span class="oldest">&#9476; oldest age (peak {duration(int(oldest.peak))})</span>'
        )
    legend.append("band: classification")
    return _chart(span, shown, points, "backlog, oldest age and classification") + (
        f'<p class="legend">{" &middot; ".join(legend)}</p>'
    )


def rate_chart(history: History, span: Span) -> str:
    rates = history.rates()
    if not rates:
        return '<p class="legend">no rate yet: it needs two evaluations</p>'
    series = _Series(
        "rate",
        RATE,
        [(rate.at_unix_ms, rate.per_second) for rate in rates],
        lambda: (
            itertools.chain((1.0,), _one_two_five(0)())
            if not any(rate.per_second for rate in rates)
            else _one_two_five(-2)()
        ),
        _short_count,
    )
    extra = f' data-published="{history.published()}"'
    return _chart(span, [series], None, "events published per second", extra) + (
        '<p class="legend"><span class="rate">&#9472; events/s</span></p>'
    )


def _chart(
    span: Span,
    series: Sequence[_Series],
    band: Sequence[Point] | None,
    what: str,
    extra: str = "",
) -> str:
    """Up to two lines (the first on a left scale, the second on a right one) and a band,
    over a time axis from ``span.start`` (left) to ``span.end`` (right, "now")."""
    left = _LEFT_AXIS
    plot_width = _VIEW_WIDTH - left - _RIGHT_AXIS
    plot_height = _PLOT_HEIGHT if series else _BAND_HEIGHT
    band_top = _TOP + plot_height + 3 if series else _TOP
    axis_top = band_top + (_BAND_HEIGHT if band is not None else 0)
    height = axis_top + _TIME_AXIS

    def x(at: int) -> float:
        return round(left + plot_width * max(0, at - span.start) / max(span.ms, 1), 1)

    parts = [
        f'<rect class="plot" x="{left}" y="{_TOP}" width="{plot_width}" '
        f'height="{plot_height}" fill="#f7f7f7"/>'
    ]
    intervals: int | None = None
    peaks = []
    for side, line in enumerate(series):
        step, intervals = _scale(line, intervals)
        top = step * intervals
        peaks.append(f' data-{line.name}-peak="{line.peak:g}"')

        def y(value: float, top: float = top) -> float:
            # An age from a clock that went back is negative: drawn at 0, not below the plot.
            return round(_TOP + plot_height * (1 - max(value, 0) / top), 1)

        for n in range(intervals + 1):
            value = step * n
            if side == 0:
                parts.append(
                    f'<line x1="{left}" x2="{left + plot_width}" y1="{y(value)}" '
                    f'y2="{y(value)}" stroke="#e0e0e0"/>'
                )
            anchor, at = ("end", left - 4) if side == 0 else ("start", left + plot_width + 4)
            parts.append(
                f'<text class="tick value {line.name}" data-value="{value:g}" x="{at}" '
                f'y="{y(value) + 4}" text-anchor="{anchor}" font-size="{_FONT}" '
                f'fill="{line.colour}">{html.escape(line.tick(value))}</text>'
            )
        parts.append(_polylines(line, x, y))
    if band is not None:
        parts.extend(_band(band, x, band_top, left + plot_width))
    parts.extend(_time_axis(span, left, plot_width, axis_top))
    title = f"{what} over the last {duration(span.ms)}"
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{_VIEW_WIDTH}" '
        f'height="{height}" viewBox="0 0 {_VIEW_WIDTH} {height}" role="img" '
        f'aria-label="{html.escape(title)}" data-from-unix-ms="{span.start}" '
        f'data-to-unix-ms="{span.end}"{"".join(peaks)}{extra}>'
        f"<title>{html.escape(title)}</title>{''.join(parts)}</svg>"
    )


def _band(points: Sequence[Point], x: Callable[[int], float], top: int, right: float) -> list[str]:
    """One rectangle per evaluation, coloured by its classification, up to the next one."""
    band = []
    for point, following in zip(points, [*points[1:], None], strict=True):
        end = x(following.at_unix_ms) if following is not None else right
        # The latest evaluation is at the right edge: it still shows, inside the plot.
        start = min(x(point.at_unix_ms), right - 1)
        value = html.escape(point.classification.value)
        band.append(
            f'<rect class="band {value}" x="{start}" y="{top}" '
            f'width="{round(max(end - start, 1.0), 1)}" height="{_BAND_HEIGHT}" '
            f'fill="{_BAND_COLOURS[point.classification]}" shape-rendering="crispEdges">'
            f"<title>{value}</title></rect>"
        )
    return band


def _time_axis(span: Span, left: int, width: int, top: int) -> list[str]:
    """Ticks at whole steps before now, labelled by how long ago they were."""
    step = next((s for s in _TIME_STEPS_MS if span.ms // s < _MAX_TIME_TICKS), _TIME_STEPS_MS[-1])
    ticks = []
    for ago in range(span.ms // step * step, -1, -step):
        at = round(left + width * (1 - ago / max(span.ms, 1)), 1)
        text = "now" if ago == 0 else f"&minus;{_short_duration(ago)}"
        anchor = "end" if ago == 0 else "middle"
        ticks.append(
            f'<line x1="{at}" x2="{at}" y1="{top}" y2="{top + 3}" stroke="#888"/>'
            f'<text class="tick time" data-ago-ms="{ago}" x="{at}" y="{top + 14}" '
            f'text-anchor="{anchor}" font-size="{_FONT}" fill="#555">{text}</text>'
        )
    return ticks


def _polylines(series: _Series, x: Callable[[int], float], y: Callable[[float], float]) -> str:
    """One polyline per unbroken run of values (a missing value breaks the line); a value
    alone between two missing ones is a dot."""
    runs: list[list[tuple[float, float]]] = [[]]
    for at, value in series.values:
        if value is None:
            runs.append([])
            continue
        runs[-1].append((x(at), y(value)))
    return "".join(
        f'<polyline class="{series.name}" fill="none" stroke="{series.colour}" '
        f'stroke-width="1.5"{series.dash} points="{" ".join(f"{a},{b}" for a, b in run)}"/>'
        if len(run) > 1
        else f'<circle class="{series.name}" cx="{run[0][0]}" cy="{run[0][1]}" r="2" '
        f'fill="{series.colour}"/>'
        for run in runs
        if run
    )
