"""Presenting a report: measurements, the IETF health+json document, a table, an HTML page.

The page is one self-contained document: no script, nothing fetched from anywhere (styles
inline, the charts inline SVG drawn here), so it reads the same from any host and in a
browser with JavaScript off. Every value that reaches it is escaped.
"""

from __future__ import annotations

import datetime as dt
import html
import itertools
import math
import re
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from contracts.health import Classification, FamilyResult, HealthReport
from contracts.policy import Policy
from health.families import REGISTRY
from health.families.base import Measurement
from health.history import WINDOW_MS, History, Point

SERVICE_ID = "outbox-relay"
_JSON = msgspec.json.Encoder()


def measurements(result: FamilyResult) -> list[Measurement]:
    """The values a family's result shows, in a stable order; none without evidence."""
    if result.evidence is None:
        return []
    return REGISTRY[result.family].measure(result.evidence)


def bound_of(policy: Policy | None, result: FamilyResult, m: Measurement) -> int | None:
    """The policy's bound on one measurement, or None when it has none."""
    section = policy.family(result.family) if policy is not None else None
    if section is None or m.bound is None:
        return None
    value: int = getattr(section, m.bound)
    return value


def _iso(unix_ms: int) -> str:
    moment = dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def report_status(report: HealthReport | None) -> str:
    """IETF status: fail when a gating family is not within bounds, warn for a non-gating one."""
    if report is None or report.readiness is not Classification.WITHIN_BOUNDS:
        return "fail"
    if report.classification is not Classification.WITHIN_BOUNDS:
        return "warn"
    return "pass"


def _check_status(result: FamilyResult) -> str:
    if result.classification is Classification.WITHIN_BOUNDS:
        return "pass"
    return "fail" if result.gates_readiness else "warn"


def health_document(
    report: HealthReport | None,
    *,
    release: str,
    policy: Policy | None = None,
    not_ready: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``application/health+json`` document (draft-inadarei-api-health-check).

    With ``policy``, a measurement held to a bound carries it as ``bound`` and ``boundName``
    (the policy field), so a reader sees the observation next to its limit. A running
    process gives why it is not ready (``not_ready``, empty when it is): the status is
    ``fail`` exactly when that is not empty, and the check ``process:ready`` says it.
    """
    status = report_status(report)
    if not_ready is not None:
        status = "fail" if not_ready else ("warn" if status == "warn" else "pass")
    document: dict[str, Any] = {
        "status": status,
        "version": release.split(".", 1)[0],
        "releaseId": release,
        "serviceId": SERVICE_ID,
        "description": "transactional outbox relay and scoring-queue health",
    }
    checks: dict[str, list[dict[str, Any]]] = {}
    if not_ready is not None:
        checks["process:ready"] = [
            {
                "componentId": "process",
                "componentType": "system",
                "observedValue": not not_ready,
                "status": "fail" if not_ready else "pass",
                **({"output": "; ".join(not_ready)} if not_ready else {}),
            }
        ]
    if report is None:
        document["output"] = "no evaluation has completed yet"
        document["checks"] = checks
        return document
    document["classification"] = report.classification.value
    document["readiness"] = report.readiness.value
    if report.classification is not Classification.WITHIN_BOUNDS:
        document["output"] = "; ".join(
            f"{r.family.value}: {r.classification.value}"
            for r in report.families
            if r.classification is not Classification.WITHIN_BOUNDS
        )
    elif not_ready:
        document["output"] = "; ".join(not_ready)
    for result in report.families:
        family = result.family.value
        observed = result.evidence.observed_at_unix_ms if result.evidence else None
        time = _iso(observed if observed and observed > 0 else report.evaluated_at_unix_ms)
        common = {
            "componentId": family,
            "componentType": "component",
            "status": _check_status(result),
            "time": time,
        }
        checks[f"{family}:classification"] = [
            {
                **common,
                "observedValue": result.classification.value,
                "classification": result.classification.value,
                "reasons": list(result.reasons),
                "gatesReadiness": result.gates_readiness,
                **({"output": "; ".join(result.reasons)} if result.reasons else {}),
            }
        ]
        for m in measurements(result):
            check = {**common, "observedValue": m.value, "observedUnit": m.unit}
            bound = bound_of(policy, result, m)
            if bound is not None:
                check |= {"bound": bound, "boundName": m.bound}
            checks[f"{family}:{m.name}"] = [check]
    document["checks"] = checks
    return document


def encode_json(document: object) -> bytes:
    """Compact JSON bytes."""
    return _JSON.encode(document)


_ANSI = {
    Classification.WITHIN_BOUNDS: "\x1b[32m",
    Classification.STALLED: "\x1b[1;31m",
    Classification.UNKNOWN: "\x1b[33m",
}
_ANSI_RESET = "\x1b[0m"


STATUS_WIDTH = 80
"""The width ``status`` lays its table out to when nobody says otherwise (not a terminal)."""
_MIN_WIDTH = 40
# FAMILY, CLASSIFICATION and GATES, each with the space after it: where measurements start.
_FAMILY, _CLASSIFICATION, _GATES = 18, 14, 5
_MEASUREMENTS_AT = _FAMILY + 1 + _CLASSIFICATION + 1 + _GATES + 1
_BELOW = "    "
"""The indent of measurements laid out below their family's line, when none fits beside it."""
_GAP = 2


def status_table(
    report: HealthReport,
    policy: Policy | None = None,
    *,
    colour: bool = False,
    width: int = STATUS_WIDTH,
) -> str:
    """A plain-text table of every family for ``outbox-relay status``, ``width`` columns wide.

    Each family's measurements stand in as many aligned columns as fit beside it; when one
    would not fit there, every family's go below its line instead. A measurement is never
    split, nor a reason (one longer than the width is the only line that is). With
    ``policy`` a bounded value shows its bound
    (``expired_lease_count=1/max 0``); with ``colour`` the classification is coloured with
    ANSI codes (for a terminal only).
    """
    width = max(width, _MIN_WIDTH)
    shown = {
        result.family: (
            [_shown_with_bound(policy, result, m) for m in measurements(result)]
            if result.evidence is not None
            else []
        )
        or ["-"]
        for result in report.families
    }
    widest = max((len(cell) for cells in shown.values() for cell in cells), default=0)
    beside = widest <= width - _MEASUREMENTS_AT
    header = f"{'FAMILY':<{_FAMILY}} {'CLASSIFICATION':<{_CLASSIFICATION}} {'GATES'}"
    lines = [f"{header:<{_MEASUREMENTS_AT}}MEASUREMENTS" if beside else header]
    for result in report.families:
        gates = "yes" if result.gates_readiness else "no"
        classification = f"{result.classification.value:<{_CLASSIFICATION}}"
        if colour:
            classification = _ANSI[result.classification] + classification + _ANSI_RESET
        head = f"{result.family.value:<{_FAMILY}} {classification} {gates:<{_GATES}} "
        cells = shown[result.family]
        if beside:
            rows = _columns(cells, width - _MEASUREMENTS_AT)
            lines.append(head + rows[0])
            lines.extend(" " * _MEASUREMENTS_AT + row for row in rows[1:])
            indent = " " * (_FAMILY + 1)
        else:
            lines.append(head.rstrip())
            lines.extend(_BELOW + row for row in _columns(cells, width - len(_BELOW)))
            indent = _BELOW
        for reason in result.reasons:
            # Whole, never wrapped: docs/operations.md is searched by the reason as printed.
            line = f"{indent}reason: {reason}"
            lines.append(line if len(line) <= width else f"{_BELOW}reason: {reason}")
    if not report.families:
        lines.append("(every family is disabled in the policy)")
    lines.extend(
        textwrap.wrap(
            f"overall: {report.classification.value}; readiness: {report.readiness.value}; "
            f"evaluated {_iso(report.evaluated_at_unix_ms)}",
            width,
            subsequent_indent="  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    )
    return "\n".join(lines) + "\n"


def _columns(cells: Sequence[str], room: int) -> list[str]:
    """``cells`` in reading order, in as many columns of equal width as fit in ``room``
    (always at least one), as lines without trailing spaces."""
    cell = max(len(text) for text in cells)
    count = max(1, (room + _GAP) // (cell + _GAP))
    return [
        (" " * _GAP).join(text.ljust(cell) for text in cells[at : at + count]).rstrip()
        for at in range(0, len(cells), count)
    ]


def _shown_with_bound(policy: Policy | None, result: FamilyResult, m: Measurement) -> str:
    bound = bound_of(policy, result, m)
    shown = f"{m.name}={_show(m)}"
    if bound is None:
        return shown
    return f"{shown}/max {bound}ms" if m.unit == "ms" else f"{shown}/max {bound}"


def _show(m: Measurement) -> str:
    if m.value is None:
        return "-"
    return f"{m.value}ms" if m.unit == "ms" else str(m.value)


# -- the status page ---------------------------------------------------------------------------
def label(m: Measurement) -> str:
    """A measurement's name in words: ``expired_lease_count`` in leases → "expired leases"."""
    if m.name.endswith("_count"):
        words = m.name.removesuffix("_count").split("_")
        if m.unit.startswith(words[-1]):
            words[-1] = m.unit
        else:
            words.append(m.unit)
        return " ".join(words)
    return m.name.replace("_", " ")


def duration(ms: int) -> str:
    """Milliseconds as people read them: 850 ms, 12.5 s, 4.2 min, 3.1 h."""
    if abs(ms) < 1000:
        return f"{ms} ms"
    if abs(ms) < 120_000:
        return f"{ms / 1000:.1f} s"
    if abs(ms) < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def _amount(value: int | None, unit: str) -> str:
    if value is None:
        return "none"
    return duration(value) if unit == "ms" else str(value)


_FIELD = re.compile(r"\b[a-z]+(?:_[a-z]+)+\b")


def in_words(reason: str) -> str:
    """A reason as a sentence: field names as words, ``>`` as "exceeds"."""

    def words(match: re.Match[str]) -> str:
        name = match.group(0)
        for suffix in ("_unix_ms", "_ms", "_count"):
            name = name.removesuffix(suffix)
        return name.replace("_", " ")

    return _FIELD.sub(words, reason).replace(" > ", " exceeds ")


def status_page(
    report: HealthReport | None,
    *,
    live: bool,
    ready: bool,
    policy: Policy | None = None,
    history: History | None = None,
    runbook_url: str = "",
) -> str:
    """The status page: the relay's publish rate, then per family its classification,
    observations against their bounds, reasons in words, a runbook link and a chart of the
    history; every value escaped."""
    span = _span(history, report.evaluated_at_unix_ms if report is not None else None)
    publishing = _publishing_section(history, span) if history is not None else ""
    families = [
        _family_section(
            result,
            policy,
            history.points(result.family) if history is not None else (),
            span,
            runbook_url,
        )
        for result in (report.families if report is not None else ())
    ]
    overall = report.classification.value if report is not None else "no evaluation yet"
    evaluated = _iso(report.evaluated_at_unix_ms) if report is not None else "&ndash;"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>outbox-relay health</title>
<style>{_STYLE}</style></head><body>
<h1>outbox-relay health</h1>
<p class="summary">overall: <strong class="{html.escape(overall)}">{html.escape(overall)}</strong>
&middot; live: {"yes" if live else "no"} &middot; ready: {"yes" if ready else "no"}
&middot; evaluated: {evaluated}</p>
{publishing}{"".join(families) or f"<p>{_EMPTY[report is None]}</p>"}
<p class="links"><a href="/health">/health</a> &middot; <a href="/metrics">/metrics</a> &middot;
<a href="/readyz">/readyz</a> &middot; <a href="/livez">/livez</a></p>
</body></html>
"""


_EMPTY = {True: "no evaluation has completed yet", False: "every family is disabled in the policy"}
_BACKLOG, _OLDEST, _RATE = "#1f5fbf", "#c06000", "#2a7f62"
_STYLE = f"""
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 80em; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.1em; margin: 0 0 .3em; }}
section {{ border: 1px solid #ccc; border-left-width: .5em; padding: .5em 1em; margin: .8em 0; }}
section.within_bounds {{ border-left-color: #3a3; }} section.stalled {{ border-left-color: #c33; }}
section.unknown {{ border-left-color: #d9a400; }} section.publishing {{ border-left-color: {_RATE}; }}
.classification {{ font-weight: normal; padding: 0 .4em; border-radius: .2em; }}
.within_bounds .classification, strong.within_bounds {{ background: #d8f5d8; }}
.stalled .classification, strong.stalled {{ background: #f8d0d0; }}
.unknown .classification, strong.unknown {{ background: #f5ecc8; }}
ul {{ margin: .3em 0; padding-left: 1.2em; }} .meta, .legend {{ color: #555; font-size: .85em; }}
.meta, .legend {{ margin: .2em 0; }} .reasons {{ color: #900; }}
.observation.over {{ color: #b00; }}
.body {{ display: flex; flex-wrap: wrap; gap: .5em 2em; align-items: flex-start; }}
.observations {{ flex: 1 1 18em; min-width: 0; }}
.history {{ flex: 1 1 24em; min-width: 0; max-width: 30em; }}
svg.chart {{ display: block; width: 100%; height: auto; }}
@media (max-width: 40em) {{
  body {{ margin: .8em; }} section {{ padding: .5em .6em; }}
}}
.legend .backlog {{ color: {_BACKLOG}; }} .legend .oldest {{ color: {_OLDEST}; }}
.legend .rate {{ color: {_RATE}; }}
"""


def _family_section(
    result: FamilyResult,
    policy: Policy | None,
    points: Sequence[Point],
    span: _Span,
    runbook_url: str,
) -> str:
    family = html.escape(result.family.value)
    classification = html.escape(result.classification.value)
    observations = (
        "".join(_observation(result, policy, m) for m in measurements(result))
        if result.evidence is not None
        else "<li>no evidence: the probe did not answer</li>"
    )
    reasons = "".join(f'<li class="reason">{html.escape(in_words(r))}</li>' for r in result.reasons)
    runbook = html.escape(f"{runbook_url}#family-{result.family.value}", quote=True)
    return f"""<section class="family {classification}" id="family-{family}" data-family="{family}">
<h2>{family} <span class="classification">{classification}</span></h2>
<p class="meta">gates readiness: {"yes" if result.gates_readiness else "no"} &middot;
<a class="runbook" href="{runbook}">runbook: {family}</a></p>
{f'<ul class="reasons">{reasons}</ul>' if reasons else ""}
<div class="body"><ul class="observations">{observations}</ul>
<div class="history">{_family_chart(points, span)}</div></div>
</section>
"""


def _observation(result: FamilyResult, policy: Policy | None, m: Measurement) -> str:
    bound = bound_of(policy, result, m)
    over = bound is not None and m.value is not None and m.value > bound
    attributes = (
        f'data-name="{html.escape(m.name)}" data-value="{m.value if m.value is not None else ""}"'
    )
    text = f"{html.escape(label(m))} <strong>{html.escape(_amount(m.value, m.unit))}</strong>"
    if bound is not None:
        attributes += f' data-bound-name="{html.escape(str(m.bound))}" data-bound="{bound}"'
        text += f" / max {html.escape(_amount(bound, m.unit))}"
    return f'<li class="observation{" over" if over else ""}" {attributes}>{text}</li>'


def _publishing_section(history: History, span: _Span) -> str:
    """The relay's publish rate: events per second between evaluations, from its
    published-events counter; only a process that runs the relay has one."""
    if not history.publishing:
        return """<section class="publishing" id="publishing"><h2>publishing</h2>
<p class="meta">this process runs no relay: each relay shows its publish rate on its own
status page, and counts it in <code>outbox_relay_published_events_total</code> on its /metrics</p>
</section>
"""
    rates = history.rates()
    now = f"{_per_second(rates[-1].per_second)} events/s" if rates else "none yet"
    peak = max((rate.per_second for rate in rates), default=None)
    return f"""<section class="publishing" id="publishing"><h2>publishing</h2>
<p class="meta">events the relay in this process published per second, between evaluations
(<code>outbox_relay_published_events_total</code>)</p>
<div class="body"><ul class="observations">
<li>rate now <strong>{now}</strong></li>
<li>peak <strong>{_per_second(peak) + " events/s" if peak is not None else "none yet"}</strong></li>
<li>published since this process started <strong>{history.published()}</strong></li></ul>
<div class="history">{_rate_chart(history, span)}</div></div>
</section>
"""


def _per_second(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


# -- charts: inline SVG, drawn here ------------------------------------------------------------
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
class _Span:
    """The time every chart on the page covers: from the oldest evaluation kept (at most
    the window back) to the latest."""

    start: int
    end: int

    @property
    def ms(self) -> int:
        return self.end - self.start


def _span(history: History | None, now: int | None) -> _Span:
    if now is None:  # no evaluation yet, so no history to draw either
        return _Span(-_MIN_SPAN_MS, 0)
    since = history.since_unix_ms() if history is not None else None
    start = max(now - WINDOW_MS, since if since is not None else now)
    return _Span(min(start, now - _MIN_SPAN_MS), now)


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


def _family_chart(points: Sequence[Point], span: _Span) -> str:
    """A family's history: its backlog (left scale) and oldest age (right scale) over a band
    coloured by each evaluation's classification."""
    if not points:
        return '<p class="legend">no history yet</p>'
    backlog = _Series(
        "backlog",
        _BACKLOG,
        [(p.at_unix_ms, p.backlog) for p in points],
        _one_two_five(0),
        _short_count,
    )
    oldest = _Series(
        "oldest",
        _OLDEST,
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


def _rate_chart(history: History, span: _Span) -> str:
    rates = history.rates()
    if not rates:
        return '<p class="legend">no rate yet: it needs two evaluations</p>'
    series = _Series(
        "rate",
        _RATE,
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
    span: _Span,
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


def _time_axis(span: _Span, left: int, width: int, top: int) -> list[str]:
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
